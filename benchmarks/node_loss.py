"""The ``node_loss_s3`` scenario of ``benchmarks/chaos.py``: whole nodes of a real multi-node Ray cluster lost
while a PBT sweep checkpoints to S3, then its driver killed and ``tunekit resume --address`` run.

The cluster is started with ``ray start`` on this machine: a head with no CPUs (it holds the GCS) and two
worker nodes of one CPU each, each node in a session of its own (``ray start --block`` under ``setsid``).
Ray starts trial workers in process groups of their own but in their node's session, so a node is killed by
session: its raylet, agents and trial workers at once, as a lost machine loses them. Storage is moto's S3
server on 127.0.0.1. A killer thread here watches the bucket's open multipart uploads and the files the
nodes' processes have open: while a checkpoint's ``state.pt`` is being uploaded and a process of a node
reads a ``state.pt``, it kills that node (``during an upload``); when none is caught for a while it kills a
random worker node (``between uploads``). Each killed node is replaced by a fresh one. The driver
(``chaos.py --child-cluster``) SIGKILLs itself at a seeded result; ``tunekit resume EXP --address`` then runs
the sweep to its end on the same cluster, nodes still being killed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

__all__ = ["Cluster", "NodeKiller", "node_loss_run"]


@dataclass
class Cluster:
    """A head and ``workers`` one-CPU worker nodes on this machine, each started by ``ray start --block`` in a
    session of its own, on ports of its own (``base`` + 100 a node started)."""

    base: int
    workers: int = 2
    logs: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="chaos-cluster-"))
    nodes: list[subprocess.Popen] = field(default_factory=list)
    started: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.base}"

    def start(self) -> Cluster:
        self.head = self._node(["--head", f"--port={self.base}", "--num-cpus=0", "--include-dashboard=false",
                                "--disable-usage-stats"])
        try:
            for _ in range(self.workers):
                self.add_worker()
        except BaseException:
            self.stop()  # (a node that did not start: none of this cluster outlives it)
            raise
        return self

    def add_worker(self) -> subprocess.Popen:
        node = self._node([f"--address={self.address}", "--num-cpus=1"])
        with self.lock:
            self.nodes.append(node)
        return node

    def _node(self, how: list[str]) -> subprocess.Popen:
        """A node started by ``ray start`` (tried twice: on a loaded machine a node's start can time out)."""
        try:
            return self._start_node(how)
        except SystemExit as first:
            print(f"  ({str(first).splitlines()[0]}; trying once more)", flush=True)
            return self._start_node(how)

    def _start_node(self, how: list[str]) -> subprocess.Popen:
        self.started += 1
        port = self.base + 100 * self.started
        ports = [f"--node-manager-port={port}", f"--object-manager-port={port + 1}",
                 f"--metrics-export-port={port + 2}", f"--dashboard-agent-listen-port={port + 3}",
                 f"--dashboard-agent-grpc-port={port + 4}", f"--runtime-env-agent-port={port + 5}",
                 f"--min-worker-port={port + 10}", f"--max-worker-port={port + 99}"]
        log = os.path.join(self.logs, f"node-{self.started}.log")
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        with open(log, "w") as out:
            node = subprocess.Popen([ray, "start", *how, *ports, "--block"], stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, env={**os.environ, "PYTHONPATH": ROOT})
        deadline = time.monotonic() + 180
        while "block forever" not in open(log).read():
            if node.poll() is not None or time.monotonic() > deadline:
                _kill_session(node.pid)
                raise SystemExit(f"node_loss_s3: a Ray node did not start (exit {node.poll()}); its log:\n"
                                 + open(log).read()[-3000:])
            time.sleep(0.5)
        return node

    def kill(self, node: subprocess.Popen) -> None:
        with self.lock:
            self.nodes.remove(node)
        _kill_session(node.pid)
        node.wait()

    def stop(self) -> None:
        for node in [*self.nodes, self.head]:
            _kill_session(node.pid)
            node.wait()


def _session(sid: int) -> list[int]:
    """The processes of session ``sid``: a node's ``ray start``, raylet and agents, and its trial workers, which
    Ray starts in process groups of their own, but in the node's session."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getsid(int(pid)) == sid:
                pids.append(int(pid))
        except (OSError, ProcessLookupError):
            pass
    return pids


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` at once, as a lost machine loses them."""
    from tunekit.testing import kill_until_gone

    kill_until_gone(lambda: _session(sid))


def _reads_a_state(sid: int) -> bool:
    """Whether a process of session ``sid`` has a ``state.pt`` open read-only: a checkpoint of one of its
    trials being uploaded (its write opens the file write-only)."""
    for pid in _session(sid):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}").endswith("/state.pt"):
                    with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                        flags = next(line for line in info if line.startswith("flags:")).split()[1]
                    if int(flags, 8) & os.O_ACCMODE == os.O_RDONLY:
                        return True
        except (OSError, StopIteration):
            pass
    return False


@dataclass
class NodeKiller:
    """Kill worker nodes of ``cluster`` while a run goes on: one whose trial worker reads a ``state.pt`` while a
    multipart upload to ``bucket`` is open (its upload), else after ``idle_s`` without one a random worker node; at most ``max_kills``,
    each followed by a replacement node, ``settle_s`` apart."""

    cluster: Cluster
    client: Any
    bucket: str
    seed: int
    max_kills: int = 4
    idle_s: float = 15.0
    settle_s: float = 8.0
    kills: list[str] = field(default_factory=list)
    _cut_off: set[str] = field(default_factory=set)

    def __enter__(self) -> NodeKiller:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        rng = random.Random(self.seed)
        last = time.monotonic()
        while not self._stop.wait(0.02) and len(self.kills) < self.max_kills:
            if time.monotonic() - last < self.settle_s:
                continue
            saving = [node for node in list(self.cluster.nodes) if _reads_a_state(node.pid)]
            if saving and self._state_uploads():
                self._kill(saving[0], "during an upload")
            elif time.monotonic() - last > self.idle_s and self.cluster.nodes:
                self._kill(rng.choice(self.cluster.nodes), "between uploads")
            else:
                continue
            last = time.monotonic()

    def _state_uploads(self) -> set[str]:
        """The open multipart uploads of a checkpoint's ``state.pt`` (pyarrow uploads every file so) but those a
        kill cut off, which stay open for good: their upload ids."""
        uploads = self.client.list_multipart_uploads(Bucket=self.bucket).get("Uploads", [])
        return {u["UploadId"] for u in uploads if u["Key"].endswith("/state.pt")} - self._cut_off

    def _kill(self, node: subprocess.Popen, phase: str) -> None:
        self.cluster.kill(node)
        self._cut_off |= self._state_uploads()  # (the other node's, if any, end within settle_s anyway)
        self.kills.append(phase)
        self.cluster.add_worker()


def node_loss_run(run: int, args: Any, width: int, bucket_of: Any, client: Any) -> tuple[Any, str, list[str], str]:
    """One ``node_loss_s3`` run: a fresh cluster and bucket, the driver in a process of its own SIGKILLed at a
    seeded result, then ``tunekit resume --address``; nodes lost throughout. Returns the grid, the experiment,
    the node kills' phases and a line about the driver."""
    from ray import tune

    from benchmarks.chaos import Wide, experiment_uri
    from tunekit.testing import run_and_reap

    name = f"node_loss_s3-{run}"
    storage = bucket_of(name.replace("_", "-"))
    bucket = storage.split("/")[2]
    # (a PBT clone goes on from its donor's iteration: 4 trials can report far fewer than 4 x iterations results)
    die_after = random.Random(run).randint(8, 2 * args.iterations)
    cluster = Cluster(base=21000 + 1500 * (run % 20)).start()
    env = {**os.environ, "PYTHONPATH": ROOT, "RAY_AUTH_MODE": "disabled"}
    try:
        with NodeKiller(cluster, client, bucket, seed=run) as killer:
            done = run_and_reap([sys.executable, os.path.join(ROOT, "benchmarks", "chaos.py"), "--child-cluster",
                                 cluster.address, storage, name, str(die_after), str(width), str(args.iterations)],
                                env=env, cwd=ROOT, capture_output=True, text=True, timeout=3600)
            if done.returncode != -signal.SIGKILL:
                raise SystemExit(f"node_loss_s3 run {run}: the driver did not SIGKILL itself "
                                 f"(exit {done.returncode}):\n" + (done.stdout + done.stderr)[-3000:])
            experiment = experiment_uri(storage, name)
            resumed = subprocess.run([sys.executable, "-m", "tunekit.cli", "resume", experiment, "--address",
                                      cluster.address, "--trainable", "benchmarks.chaos:Wide"],
                                     env=env, cwd=ROOT, capture_output=True, text=True, timeout=3600)
            if resumed.returncode != 0:
                raise SystemExit(f"node_loss_s3 run {run}: tunekit resume exited {resumed.returncode}:\n"
                                 + (resumed.stdout + resumed.stderr)[-3000:])
        kills = killer.kills
    finally:
        cluster.stop()
    grid = tune.Tuner.restore(experiment, trainable=Wide).get_results()
    return grid, experiment, kills, f"{len(kills)} nodes lost, driver SIGKILLed at result {die_after}, resumed"
