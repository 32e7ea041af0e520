"""The failure injector (:class:`Injector`): SIGKILLs of trial workers inside checkpoint writes or at random,
and one invariant check of what a run left (:func:`invariant_violations`). ``benchmarks/chaos.py`` runs the
long matrix on it; ``tests/trainables/test_chaos.py`` a suite-sized run.

The injector is a thread in the driver. It watches the experiment's trial directories: a two-phase save
names its writer in its staging directory (``.checkpoint_N.partial-HOST-PID-X``), so a write in flight and
the process writing it are both on disk, and a kill lands *inside* the write. The phase it landed in is read
from the staging directory the moment after the kill: before ``state.pt`` was whole, before the manifest,
or after the rename (too late: the checkpoint was complete). With ``mean_interval_s`` it also kills a
random trial worker of the Ray this driver is connected to (found by Ray's process title
``ray::<Trainable>``; another Ray's workers on the machine are left alone) at exponential intervals.

:func:`invariant_violations` is the check after a run, on tunekit's own files only (never on Ray's
``metrics_dataframe``): every trial finished (none in ERROR), each trial's newest checkpoint exists and
verifies, nothing interrupted is left over, every iteration once in ``load_results``, and
``tunekit verify`` / ``tunekit status`` say all is well.
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tunekit.checkpoint._manifest import MANIFEST_FILE
from tunekit.checkpoint._trial_dir import checkpoint_name_of, leftovers, staging_of

__all__ = ["Injector", "Kill", "invariant_violations", "tensors_equal"]


@dataclass(frozen=True)
class Kill:
    """One SIGKILL: when (seconds into the run), whom, and where it landed."""

    at_s: float
    pid: int
    phase: str  # "write: before state", "write: before manifest", "write: before rename", "after a write", "random"
    checkpoint: str = ""

    @property
    def inside_write(self) -> bool:
        return self.phase.startswith("write:")


@dataclass
class Injector:
    """Kill trial workers of the experiment in ``root`` (a directory holding experiments) while a run goes on.

    Args:
        root: Where the run's experiment directory is (or will be) made: the storage path.
        writes: Kill the writer of this fraction of the checkpoint writes seen (0 to 1).
        mean_interval_s: Also kill a random trial worker at exponential intervals of this mean (None: never).
        max_kills: Stop after this many kills.
        trainable: The process title prefix of trial workers (``ray::<name>``), for random kills: only
            workers of the Ray the driver is connected to are chosen.
        seed: The random choices' seed.
        aim: Where inside a doomed write to kill: None, anywhere (a uniform time within a typical write's
            length: most kills land before ``state.pt`` is whole, the longest phase); ``"manifest"``, once
            ``state.pt`` and the metadata are written, while the manifest hashes them (a write that ends
            before that is let through).
    """

    root: str
    writes: float = 0.5
    mean_interval_s: float | None = None
    max_kills: int = 8
    trainable: str = ""
    seed: int = 0
    aim: str | None = None
    kills: list[Kill] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Injector:
        if self.aim not in (None, "manifest"):
            raise ValueError(f"Injector(aim={self.aim!r}): expected None or 'manifest'")
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="tunekit-injector", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def by_phase(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for kill in self.kills:
            out[kill.phase] = out.get(kill.phase, 0) + 1
        return out

    # -- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        # two generators from one seed: the random kills (times, worker chosen) follow one schedule per seed
        # whatever the writes do (benchmarks/interval.py compares policies on it), and the write dice theirs
        rng = random.Random(self.seed)
        dice = random.Random(f"writes:{self.seed}")
        seen: dict[str, float] = {}  # staging directory -> when it was first seen
        durations: list[float] = []  # how long the writes let through took (staging seen to gone)
        doomed: dict[str, tuple[int, float]] = {}  # staging directory -> (writer, when to kill it)
        next_random = self._next(rng)
        while not self._stop.is_set() and len(self.kills) < self.max_kills:
            now = time.monotonic()
            writes = dict(self._writes())
            for path, pid in writes.items():
                if path in seen:
                    continue
                seen[path] = now
                if dice.random() < self.writes:  # inside the write: about as long as others
                    typical = sorted(durations)[len(durations) // 2] if durations else 0.05
                    doomed[path] = (pid, now + dice.uniform(0.0, 1.2 * typical))
            for path in [p for p in seen if p not in writes and p not in doomed and seen[p] > 0]:
                durations.append(now - seen[path])
                seen[path] = -1.0  # measured once
            for path, (pid, when) in list(doomed.items()):
                if self.aim == "manifest":
                    if path not in writes:
                        del doomed[path]  # over before its manifest was begun
                    elif _has_metadata(path) and not os.path.exists(os.path.join(path, MANIFEST_FILE)):
                        del doomed[path]
                        self._kill_writer(path, pid)
                elif now >= when:
                    del doomed[path]
                    self._kill_writer(path, pid)
            if next_random is not None and time.monotonic() >= next_random:
                from tunekit._ray import actor_workers  # (imports Ray: only once a random kill is due)

                workers = actor_workers(self.trainable)
                if workers:
                    pid = rng.choice(workers)
                    if _sigkill(pid):
                        self.kills.append(Kill(self._now(), pid, "random"))
                next_random = self._next(rng)
            time.sleep(0.002)

    def _now(self) -> float:
        return time.monotonic() - self._start

    def _next(self, rng: random.Random) -> float | None:
        if self.mean_interval_s is None:
            return None
        return time.monotonic() + rng.expovariate(1.0 / self.mean_interval_s)

    def _writes(self) -> list[tuple[str, int]]:
        """Staging directories of this machine's live writers: (path, writer pid)."""
        out = []
        for dirpath, dirnames, _ in os.walk(self.root):
            for name in dirnames:
                if (staging := staging_of(name)) and staging[2]:
                    out.append((os.path.join(dirpath, name), staging[2]))
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and not d.startswith("checkpoint_")]
        return out

    def _kill_writer(self, staging: str, pid: int) -> None:
        if not os.path.isdir(staging):
            return  # the write is over: this injector kills inside writes only (random kills: mean_interval_s)
        if not _sigkill(pid):
            return
        parent, name = os.path.split(staging)
        final = os.path.join(parent, checkpoint_name_of(name))  # type: ignore[arg-type]
        if os.path.isdir(staging):
            if os.path.exists(os.path.join(staging, MANIFEST_FILE)):
                phase = "write: before rename"
            elif _has_metadata(staging):  # written after state.pt
                phase = "write: before manifest"
            else:
                phase = "write: before state"
        else:
            phase = "after a write"
        self.kills.append(Kill(self._now(), pid, phase, posixpath.relpath(final, self.root)))


def _has_metadata(staging: str) -> bool:
    from tunekit.checkpoint._manifest import METADATA_FILE

    return os.path.exists(os.path.join(staging, METADATA_FILE))


def _sigkill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def invariant_violations(experiment: str, grid: Any = None, *, reference: dict[str, Any] | None = None,
                         stop: int | None = None) -> list[str]:
    """What is wrong with the experiment a run left in ``experiment``, one line each (empty: nothing lost).

    Args:
        grid: The run's ``ResultGrid``: each result's checkpoint must exist and verify.
        reference: Trial config key ``"seed"`` -> the state dict an uninterrupted run ended with; the
            killed run's final weights must equal it bit for bit.
        stop: The run's ``training_iteration`` stop: each trial's last row, Ray's iteration and its newest
            checkpoint's own state (``tunekit.json``) all end there, never past it.
    """
    from tunekit.analysis import load_results
    from tunekit.cli import main
    from tunekit.experiment.snapshot import read_experiment

    out = []
    snap = read_experiment(experiment)
    for trial in snap.trials:
        if trial.status != "TERMINATED":
            out.append(f"{trial.trial_id} ended {trial.status}: {trial.error}")
        if "://" in experiment:
            continue  # two-phase writes, and what they leave, are local only
        where = os.path.join(experiment, trial.name)
        for name, kind in _leftovers_of(where):
            if kind in ("interrupted", "writing"):
                out.append(f"{trial.name}/{name}: {kind} write left over")
    out += _grid_violations(grid, reference)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            df = load_results(experiment)
            shown = io.StringIO()
            with contextlib.redirect_stdout(shown):
                verified = main(["verify", experiment])
            status = main(["status", experiment])
    if stop is not None:
        out += _stop_violations(snap, df, grid, stop)
    if "training_iteration" in df.columns:
        dup = df.duplicated(["trial_id", "training_iteration"]).sum()
        if dup:
            out.append(f"load_results: {dup} iteration(s) twice")
    if df.attrs.get("missing_iterations"):
        out.append(f"load_results: rows lost: {df.attrs['missing_iterations']}")
    if verified != 0:
        bad = [line.strip() for line in shown.getvalue().splitlines()
               if line.rstrip().endswith(("incomplete", "corrupt")) or ": " in line and
               any(f"  {s}" in line for s in ("incomplete", "corrupt", "unsupported")) or line.startswith("damaged")]
        out.append(f"tunekit verify exited {verified}: {' | '.join(bad)[:600]}")
    if status != 0:
        out.append(f"tunekit status exited {status}")
    return out


def _grid_violations(grid: Any, reference: dict[str, Any] | None) -> list[str]:
    """Each result of ``grid`` without an error, with a checkpoint that verifies (and, with ``reference``, holds
    the weights the uninterrupted run ended with)."""
    from tunekit import read_state, verify_checkpoint

    out = []
    for result in grid or []:
        if result.error is not None:
            out.append(f"{result.path}: error {str(result.error).splitlines()[0][:200]}")
            continue
        if result.checkpoint is None:
            out.append(f"{result.path}: no checkpoint")
            continue
        report = verify_checkpoint(result.checkpoint)
        if not report.ok:
            out.append(f"newest checkpoint {report.describe()}")
        elif reference is not None:
            seed = result.config.get("seed")
            if seed in reference:
                got = read_state(result.checkpoint)
                if tensors_equal(reference[seed]["models"], got["models"]) != []:
                    out.append(f"{result.path}: final weights differ from the uninterrupted run's")
    return out


def _stop_violations(snap: Any, df: Any, grid: Any, stop: int) -> list[str]:
    """Each trial ends at ``stop`` by every count: its last row (tunekit's rows), the read model's iteration, Ray's
    (the grid's) and its newest checkpoint's state."""
    from tunekit import read_metadata

    out = []
    last_rows = df.groupby("trial_id")["training_iteration"].max().to_dict() if "training_iteration" in df else {}
    rays = {r.metrics.get("trial_id"): r for r in grid or []}
    for trial in snap.trials:
        newest = max(trial.checkpoints, key=lambda c: (c.iteration or 0), default=None)
        state = read_metadata(newest.where).get("iteration") if newest is not None else None
        ray_iteration = (rays[trial.trial_id].metrics or {}).get("training_iteration") if trial.trial_id in rays \
            else None
        counts = {"last row": last_rows.get(trial.trial_id), "status": trial.iterations, "state": state,
                  **({"Ray": ray_iteration} if grid is not None else {})}
        if any(v != stop for v in counts.values()):
            out.append(f"{trial.trial_id}: ends at " + ", ".join(f"{k} {v}" for k, v in counts.items())
                       + f" (stop {stop})")
    return out


def tensors_equal(a: Any, b: Any, where: str = "") -> list[str]:
    """Paths at which two nested state structures (dicts, lists, tensors, plain values) differ; empty: bit-equal
    (tensors of one dtype and equal values)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        ok = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
        return [] if ok else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"]
        return [p for k in a for p in tensors_equal(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}: length {len(a)} != {len(b)}"]
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in tensors_equal(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def _leftovers_of(trial_dir: str) -> list[tuple[str, str]]:
    import pyarrow.fs as pafs

    return leftovers(pafs.LocalFileSystem(), trial_dir)
