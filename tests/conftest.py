"""Shared fixtures: the Ray fixtures and temporary storage live here and only here."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from unittest import mock

import pytest

# Fake credentials for the local S3 server, set before Ray starts so workers
# inherit them. The secret is distinctive so tests can prove it never leaks.
S3_SECRET = "tunekit-test-secret-9f4c2e"
os.environ["AWS_ACCESS_KEY_ID"] = "tunekit-test-key-id"
os.environ["AWS_SECRET_ACCESS_KEY"] = S3_SECRET
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
os.environ.pop("AWS_PROFILE", None)
os.environ.pop("AWS_SESSION_TOKEN", None)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Each test process (pytest-xdist runs three) keeps its Rays' files, and the address a `ray start` or a test
# cluster leaves there for bare ray.init() calls, in a directory of its own: no test, notebook or snippet
# joins another process's Ray. (Short: Ray's socket paths under it must stay within the OS's limit.)
os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="tkray-", dir="/tmp")
atexit.register(shutil.rmtree, os.environ["RAY_TMPDIR"], True)
# Where moto's request recorder (S3Server.recording) writes, one file per test process.
os.environ["MOTO_RECORDER_FILEPATH"] = os.path.join("/tmp", f"tunekit-moto-requests-{os.getpid()}.jsonl")


#: Ray's log monitor (a process of each Ray) globs its log directory and stats every worker's log file every 0.1 s
#: while there are fewer than 1,000; a Ray the suite keeps for minutes gathers hundreds, and with
#: ``log_to_driver=False`` nothing reads what it publishes. Measured on this machine, a Ray idle after 60
#: short-lived workers: 1.25 CPU-s every 30 s by default, 0.69 with new files looked for every 10 s (files already
#: found are still read every 0.1 s). Given to the Rays this process starts, not to the drivers tests start in
#: processes of their own (they print their workers' output).
_QUIET_LOG_MONITOR = {"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0", "LOG_NAME_UPDATE_INTERVAL_S": "10"}


def _init_ray(**kwargs):
    import ray

    with mock.patch.dict(os.environ, _QUIET_LOG_MONITOR):  # (read by the log monitor ray.init starts)
        return ray.init(
            address="local",  # never a cluster someone started on this machine
            num_cpus=kwargs.pop("num_cpus", 2),
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            **kwargs,
        )


def _init_ray_at_root(**kwargs):
    """Ray started from the repository root, whatever the current directory: its workers import tests.*
    (a trainable run in this process may have moved the directory into a trial directory)."""
    cwd = os.getcwd()
    os.chdir(Path(__file__).resolve().parent.parent)
    try:
        return _init_ray(**kwargs)
    finally:
        os.chdir(cwd)


#: The fixtures that give a test a Ray of its own in place of the shared one.
_OWN_RAY = frozenset({"fresh_ray", "ray_with_logical_gpus", "ray_cluster"})
_SHARED = {"wanted": False}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """The shared Ray back, before any fixture of a test that needs it, if a test's own Ray replaced it (started
    here, not when that test ended: two tests with a Ray of their own in a row save a start of seconds of CPU)."""
    names = set(getattr(item, "fixturenames", ()))
    if _SHARED["wanted"] and "ray_session" in names and not _OWN_RAY & names:
        import ray

        if not ray.is_initialized():
            _init_ray_at_root()


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray (2 CPUs, dashboard off) shared by every test that needs Ray."""
    import ray

    _SHARED["wanted"] = True
    if not ray.is_initialized():
        _init_ray_at_root()
    yield
    ray.shutdown()


def _all_cpus_free() -> bool:
    """Whether this process's Ray is the shared kind (2 CPUs, no GPU) and nothing holds any of its resources; a
    trial or Train worker an earlier test ended may still be giving its CPU back: a few seconds' grace."""
    import time

    import ray

    if not ray.is_initialized():
        return False
    total = ray.cluster_resources()
    if total.get("CPU") != 2.0 or "GPU" in total:
        return False
    for _ in range(20):
        if ray.available_resources().get("CPU") == 2.0:
            return True
        time.sleep(0.5)
    return False


@pytest.fixture
def fresh_ray() -> Iterator[None]:
    """A Ray whose 2 CPUs are all free: the shared one when nothing holds any of them, else a Ray of its own (the
    shared one then comes back for the next test that needs it: :func:`pytest_runtest_setup`).

    For a test that needs the whole of the 2 CPUs, such as a Train run whose workers take them all.
    """
    import ray

    if _SHARED["wanted"] and _all_cpus_free():
        yield
        return
    ray.shutdown()
    _init_ray_at_root()
    yield
    ray.shutdown()


@pytest.fixture
def ray_with_logical_gpus() -> Iterator[None]:
    """A Ray told it has 1 GPU (none is real), for the GPU scheduling path; the shared Ray comes back later."""
    import ray

    ray.shutdown()
    _init_ray_at_root(num_gpus=1)
    yield
    ray.shutdown()


@dataclass
class RayCluster:
    """A real multi-node Ray on this machine: a head with no CPUs (driver only) and worker nodes."""

    cluster: object
    workers: list

    @property
    def address(self) -> str:
        return self.cluster.address


@pytest.fixture
def ray_cluster() -> Iterator[RayCluster]:
    """Head (0 CPUs) + two worker nodes of 1 CPU each, each its own raylet; the shared Ray comes back later."""
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    try:
        yield RayCluster(cluster, workers)
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    """An empty local storage directory for experiments."""
    path = tmp_path / "storage"
    path.mkdir()
    return path


class S3Server:
    """moto's S3 server mode on 127.0.0.1; can be stopped and restarted on its port."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._cls = ThreadedMotoServer
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        self.port = self._server.get_host_and_port()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.running = True

    def stop(self) -> None:
        if self.running:
            self._server.stop()
            self.running = False

    def start(self) -> None:
        """Start again on the same port; the stored objects survive (same process)."""
        if not self.running:
            self._server = self._cls(ip_address="127.0.0.1", port=self.port, verbose=False)
            self._server.start()
            self.running = True

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[str]]:
        """The requests the server answers inside the block, each ``"METHOD url"`` (moto's own recorder)."""
        import json
        import urllib.request

        def call(action: str) -> None:
            urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/recorder/{action}",
                                                          method="POST"), timeout=30).read()

        seen: list[str] = []
        call("reset-recording")
        call("start-recording")
        try:
            yield seen
        finally:
            call("stop-recording")
            with open(os.environ["MOTO_RECORDER_FILEPATH"]) as fh:
                seen += [f"{e['method']} {e['url']}" for e in map(json.loads, fh) if e]

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")


@dataclass(frozen=True)
class S3Bucket:
    """A fresh bucket on the test S3 server."""

    server: S3Server
    name: str

    def uri(self, *parts: str) -> str:
        """``s3://bucket/parts?endpoint_override=...``: what a user passes to Tune."""
        path = "/".join((self.name, *parts))
        return f"s3://{path}?endpoint_override={self.server.endpoint}&region=us-east-1"

    def keys(self) -> list[str]:
        pages = self.server.client().get_paginator("list_objects_v2").paginate(Bucket=self.name)
        return [obj["Key"] for page in pages for obj in page.get("Contents", [])]

    def read(self, key: str) -> bytes:
        return self.server.client().get_object(Bucket=self.name, Key=key)["Body"].read()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One S3-compatible server (moto) on a free port of 127.0.0.1 for the session."""
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> Iterator[S3Bucket]:
    """A new, empty bucket; the server is running when the test starts and ends."""
    s3_server.start()
    bucket = S3Bucket(s3_server, f"tunekit-{uuid.uuid4().hex[:12]}")
    s3_server.client().create_bucket(Bucket=bucket.name)
    yield bucket
    s3_server.start()


def _built_once(tmp_path_factory, name: str, build) -> Path:
    """``build(directory)`` run once for all of this session's test processes (pytest-xdist runs three): the
    first to ask builds into a directory they share, under a lock; the others wait for it, then read it. What
    is built this way is read-only: a test copies it before changing anything."""
    import fcntl

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # (each process's own temporary directories lie in this one)
    where, done = shared / f"built-{name}", shared / f"built-{name}.done"
    with open(shared / f"built-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not done.exists():
                shutil.rmtree(where, ignore_errors=True)  # (a build that failed part of the way)
                where.mkdir()
                build(where)
                done.touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return where


@pytest.fixture(scope="session")
def built_once(tmp_path_factory):
    """``built_once(name, build)``: ``build(directory)`` run once for all of this session's test processes, as
    :func:`_built_once` (a reference run that every test of a module compares with: worksteal may split the
    module's tests over the processes)."""
    return lambda name, build: _built_once(tmp_path_factory, name, build)


@pytest.fixture(scope="session")
def ray_example_runs(tmp_path_factory) -> dict[str, Path]:
    """Ray's own example scripts, run unchanged (``--smoke-test``), results under a fresh HOME (built once)."""
    runs = {"pbt_function.py": "pbt_function_api_example", "custom_func_checkpointing.py": "hyperband_test"}

    def build(home: Path) -> None:
        env = {**os.environ, "HOME": str(home), "RAY_AUTH_MODE": "disabled"}
        for script in runs:
            proc = subprocess.run(
                [sys.executable, str(_ray_examples() / script), "--smoke-test"],
                cwd=home, env=env, capture_output=True, text=True, timeout=600,
            )
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    home = _built_once(tmp_path_factory, "ray-examples", build)
    return {script: home / "ray_results" / name for script, name in runs.items()}


def _ray_examples() -> Path:
    import ray.tune.examples

    return Path(ray.tune.examples.__file__).parent


@pytest.fixture(scope="session")
def pbt_experiment(ray_session, tmp_path_factory) -> Path:
    """A real synchronous PBT run of 4 digits trials with ParquetLogger (see tests/runs.py), built once."""
    from tests.runs import run_pbt_experiment

    return _built_once(tmp_path_factory, "pbt", run_pbt_experiment) / "pbt"


@pytest.fixture(scope="session")
def quickstart_experiment(ray_session, tmp_path_factory) -> Path:
    """`tunekit quickstart`'s own sweep (4 trials x 8 iterations, PBT, ParquetLogger), built once; copy before
    damaging."""
    import io

    from tunekit.trainables.quickstart import run_quickstart

    def build(storage: Path) -> None:
        run_quickstart(num_samples=4, max_iterations=8, storage_path=str(storage), name="qs", stream=io.StringIO())

    return _built_once(tmp_path_factory, "quickstart", build) / "qs"
