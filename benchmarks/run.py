"""tunekit's performance figures, each as a ratio against a baseline measured in the same run.

One command, from the repository root, in the environment of the README's
first command::

    python benchmarks/run.py                 # everything (about 5 minutes on 2 CPUs)
    python benchmarks/run.py --only save,restore,integrity,sweep --state-gib 0.5,1

Figures (``--only`` takes their names):

overhead   A sweep of tunekit ``DigitsTrainable`` with ``CheckpointByStepsTaken``
           and ``ParquetLogger`` against the same sweep of a hand-written plain
           Ray Tune trainable (same model, data and training code, checkpoints
           with ``torch.save``): same trials, iterations and checkpoints.
           Target <= 1.03x wall time.
save       For a model + Adam state of each of ``--state-gib`` GiB (default 0.5
           and 1): how long a trainable's ``save()`` blocks training (the
           two-phase save's in-memory snapshot) against raw ``torch.save`` of
           the same state to one file (target <= 0.25x), how long the write on
           the helper thread takes, the snapshot buffers' memory; and a
           durable save (every file fsynced) against ``torch.save`` + fsync
           (target <= 1.1x).
restore    ``restore()`` (verifies every byte) against raw ``torch.load``
           (target <= 1.05x) and ``torch.load`` + ``load_state_dict``.
integrity  ``verify_checkpoint`` in GB/s, from the page cache (target >= 4 GB/s).
sweep      One trial, ``--sweep-iterations`` iterations of ``--sweep-work``
           seconds of compute on a ``--sweep-gib`` GiB state, a checkpoint
           every iteration against none: what checkpointing costs tunekit's
           trainable against a plain Ray trainable that ``torch.save``s the
           same state (target <= 0.25x).
snapshot   Ray Tune's experiment-state snapshots (``TuneController.checkpoint``)
           as a fraction of wall time, in a 200-trial experiment with tunekit's
           callbacks.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from ray import tune  # noqa: E402

from tunekit import TorchTrainable, TrainingState  # noqa: E402
from tunekit.trainables.digits import build_digits_state, evaluate, train_steps  # noqa: E402

FIGURES = ("overhead", "save", "restore", "integrity", "sweep", "snapshot")
GIB = 1 << 30


# -- overhead ---------------------------------------------------------------
class _TorchSaveCheckpoints:
    """A plain trainable's checkpoints: ``torch.save`` of model + optimizer, ``torch.load`` back."""

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        torch.save({"model": self.state.model.state_dict(), "optimizer": self.state.optimizer.state_dict()},
                   os.path.join(checkpoint_dir, "model.pt"))

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        sd = torch.load(os.path.join(checkpoint_dir, "model.pt"), weights_only=True)
        self.state.model.load_state_dict(sd["model"])
        self.state.optimizer.load_state_dict(sd["optimizer"])


class PlainDigits(_TorchSaveCheckpoints, tune.Trainable):
    """The plain Ray Tune baseline: same model, data and steps; torch.save checkpoints."""

    def setup(self, config: dict[str, Any]) -> None:
        torch.manual_seed(config.get("seed", 0))
        self.state = build_digits_state(config, torch.device("cpu"))

    def step(self) -> dict[str, Any]:
        train_loss = train_steps(self.state, self.config.get("steps_per_iteration"))
        return {"train_loss": train_loss, **evaluate(self.state.model, torch.device("cpu"))}


def _sweep(root: str, name: str, tunekit_side: bool, *, trials: int, iterations: int, every: int,
           parquet: bool = True) -> float:
    from tunekit.callbacks import CheckpointByStepsTaken, ParquetLogger
    from tunekit.trainables import DigitsTrainable

    callbacks = [CheckpointByStepsTaken(every)] + ([ParquetLogger()] if tunekit_side and parquet else [])
    tuner = tune.Tuner(
        DigitsTrainable if tunekit_side else PlainDigits,
        param_space={"hidden_size": 64, "steps_per_iteration": 20, "lr": 0.05,
                     "seed": tune.grid_search(list(range(trials)))},
        tune_config=tune.TuneConfig(metric="accuracy", mode="max"),
        run_config=tune.RunConfig(name=name, storage_path=root, stop={"training_iteration": iterations},
                                  callbacks=callbacks, verbose=0),
    )
    t0 = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - t0
    if grid.errors:
        raise RuntimeError(f"overhead sweep {name}: {grid.errors[0]}")
    return wall


def overhead(args: argparse.Namespace, root: str) -> list[str]:
    walls: dict[str, list[float]] = {"plain": [], "tunekit": [], "tunekit-noparquet": []}
    kw = dict(trials=args.trials, iterations=args.iterations, every=args.every)
    _sweep(root, "warmup", False, **dict(kw, iterations=2))  # workers and imports warm for both
    for i in range(args.repeat):
        for label in walls:  # alternate, so drift hits all alike
            walls[label].append(_sweep(root, f"{label}_{i}", label != "plain", parquet=label == "tunekit", **kw))
    med = {label: statistics.median(v) for label, v in walls.items()}
    return [
        f"overhead: {args.trials} trials x {args.iterations} iterations, a checkpoint every {args.every}, "
        f"median of {args.repeat}",
        f"  plain Ray Tune (torch.save)           {med['plain']:8.2f} s   runs {_fmt(walls['plain'])}",
        f"  tunekit (TorchTrainable + callbacks)  {med['tunekit']:8.2f} s   runs {_fmt(walls['tunekit'])}",
        f"  tunekit without ParquetLogger         {med['tunekit-noparquet']:8.2f} s   runs {_fmt(walls['tunekit-noparquet'])}",
        f"  ratio tunekit / plain                 {med['tunekit'] / med['plain']:8.3f}x  (target <= 1.03x)",
        f"  ratio tunekit w/o Parquet / plain     {med['tunekit-noparquet'] / med['plain']:8.3f}x",
    ]


# -- save / restore / integrity ---------------------------------------------
class BigState(TorchTrainable):
    """A model + Adam state of about ``config['gib']`` GiB (params are a third of it)."""

    def build(self, config: dict[str, Any]) -> TrainingState:
        width = 4096
        layers = max(1, round(config["gib"] * GIB / 3 / (width * width * 4)))
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()  # materialise exp_avg / exp_avg_sq
        optimizer.zero_grad(set_to_none=True)
        return TrainingState(models={"model": model}, optimizers={"optimizer": optimizer})

    def train_iteration(self) -> dict[str, Any]:
        return {"loss": 0.0}


def _drop_caches_hint() -> None:
    os.sync()


def _disk_write_bandwidth(directory: str, nbytes: int) -> float:
    """Sequential write of ``nbytes`` with fsync, in bytes/s."""
    block = os.urandom(64 << 20)
    path = os.path.join(directory, "bandwidth.bin")
    t0 = time.perf_counter()
    with open(path, "wb") as fh:
        written = 0
        while written < nbytes:
            fh.write(block)
            written += len(block)
        fh.flush()
        os.fsync(fh.fileno())
    elapsed = time.perf_counter() - t0
    os.remove(path)
    return written / elapsed


def _best(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        _drop_caches_hint()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _trainable(root: str, gib: float) -> BigState:
    from tunekit._ray import storage_context

    storage = storage_context(root, "save_bench", "trial", validate=True)
    return BigState(config={"gib": gib}, storage=storage)


def save_restore_integrity(args: argparse.Namespace, root: str, which: set[str]) -> list[str]:
    lines = []
    for gib in [float(x) for x in str(args.state_gib).split(",") if x.strip()]:
        lines += _save_restore_integrity(args, root, which, gib)
    return lines


def _fsynced_torch_save(sd: Any, path: str) -> None:
    with open(path, "wb") as fh:
        torch.save(sd, fh)
        fh.flush()
        os.fsync(fh.fileno())


def _save_restore_integrity(args: argparse.Namespace, root: str, which: set[str], gib: float) -> list[str]:
    from tunekit.trial._checkpointer import TrialContent
    from tunekit.checkpoint import verify_checkpoint

    trainable = _trainable(root, gib)
    sd = {"model": trainable.state.model.state_dict(), "optimizer": trainable.state.optimizer.state_dict()}
    nbytes = sum(t.numel() * t.element_size() for t in _tensors(sd))
    raw_path = os.path.join(root, "raw.pt")
    lines = [f"checkpoint of a model + Adam state: {nbytes / GIB:.2f} GiB, best of {args.repeat}"]

    raw_save = _best(lambda: torch.save(sd, raw_path), args.repeat)
    results, written = [], []

    def tk_save() -> None:  # what training waits for: the snapshot; the write runs on the helper thread
        trainable._checkpointer.reset()  # not a second save of one iteration (those are links)
        results.append(trainable.save())
        trainable.state.counters.iteration += 1

    blocked = []
    for _ in range(args.repeat):
        _drop_caches_hint()
        t0 = time.perf_counter()
        tk_save()
        blocked.append(time.perf_counter() - t0)
        trainable._checkpointer.wait()  # not timed: the next save would wait for it (one write in flight)
        written.append(time.perf_counter() - t0)
    trainable._checkpointer.durability.wait()
    tk_block, tk_written = min(blocked), min(written)
    if "save" in which:
        lines += [
            f"  raw torch.save (page cache)          {raw_save:8.2f} s",
            f"  tunekit save() blocks training for   {tk_block:8.3f} s  (the snapshot into reused CPU buffers)",
            f"  ratio blocked / torch.save           {tk_block / raw_save:8.3f}x  (target <= 0.25x)",
            f"  the write, on the helper thread      {tk_written:8.2f} s until the checkpoint is complete "
            f"({tk_written / raw_save:.2f}x torch.save)",
            f"  extra memory: the snapshot buffers   {trainable._checkpointer.saves.buffers.nbytes / GIB:8.2f} GiB "
            f"({trainable._checkpointer.saves.buffers.nbytes / nbytes:.2f}x the tensors' bytes)",
        ]
        # Each durable write goes to a new file (deleting the old one is not timed, for either side).
        raw_times, tk_times = [], []
        for i in range(args.repeat):
            for times, write in ((raw_times, lambda d: _fsynced_torch_save(sd, os.path.join(d, "raw.pt"))),
                                 (tk_times, lambda d: TrialContent(trainable.state, {}, (), print, "bench").write(d, durable=True))):
                directory = os.path.join(root, f"durable-{len(times)}-{id(times)}")
                os.makedirs(directory)
                _drop_caches_hint()
                t0 = time.perf_counter()
                write(directory)
                times.append(time.perf_counter() - t0)
                shutil.rmtree(directory)
        raw_durable, tk_durable_time = min(raw_times), min(tk_times)
        lines += [
            f"  raw torch.save + fsync               {raw_durable:8.2f} s",
            f"  tunekit durable save (all fsynced)   {tk_durable_time:8.2f} s",
            f"  ratio durable / torch.save + fsync   {tk_durable_time / raw_durable:8.3f}x  (target <= 1.1x)",
        ]
    checkpoint = results[-1]
    if "restore" in which:
        raw_load = _best(lambda: torch.load(raw_path, weights_only=True), args.repeat)

        def load_and_apply() -> None:
            loaded = torch.load(raw_path, weights_only=True)
            trainable.state.model.load_state_dict(loaded["model"])
            trainable.state.optimizer.load_state_dict(loaded["optimizer"])

        raw_apply = _best(load_and_apply, args.repeat)
        tk_restore = _best(lambda: trainable.restore(checkpoint), args.repeat)
        lines += [
            f"  raw torch.load                       {raw_load:8.2f} s",
            f"  raw torch.load + load_state_dict     {raw_apply:8.2f} s",
            f"  tunekit restore() (verifies too)     {tk_restore:8.2f} s",
            f"  ratio tunekit restore / torch.load   {tk_restore / raw_load:8.3f}x  (target <= 1.05x)",
            f"  ratio tunekit restore / load+apply   {tk_restore / raw_apply:8.3f}x",
        ]
    if "integrity" in which:
        path = checkpoint.checkpoint.path
        size = sum(f.stat().st_size for f in Path(path).iterdir())
        verify_time = _best(lambda: verify_checkpoint(path), args.repeat)
        lines += [
            f"  verify_checkpoint (page cache)       {verify_time:8.3f} s = {size / verify_time / 1e9:.1f} GB/s "
            f"over {size / 1e9:.2f} GB (target >= 4 GB/s)",
        ]
    trainable.stop()
    return lines


# -- sweep: checkpoint every iteration, against a plain Ray trainable --------
class _Compute:
    """``config['reps']`` 512x512 matmuls per iteration (the 'training'; the same work on both sides)."""

    def _work(self, config: dict[str, Any]) -> None:
        if not hasattr(self, "_m"):
            torch.manual_seed(0)
            self._m = torch.randn(512, 512)
        for _ in range(config["reps"]):
            self._m @ self._m


def _reps_for(seconds: float) -> int:
    """How many 512x512 matmuls take ``seconds`` on one thread here (measured once, in the driver)."""
    m = torch.randn(512, 512)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # Ray's workers run one thread per CPU they hold
    try:
        t0 = time.perf_counter()
        for _ in range(50):
            m @ m
        return max(1, int(seconds / ((time.perf_counter() - t0) / 50)))
    finally:
        torch.set_num_threads(threads)


class BigStateTrain(_Compute, BigState):
    def train_iteration(self) -> dict[str, Any]:
        saves = self._checkpointer.saves
        future = getattr(saves, "_future", None)  # the write of the previous checkpoint, if still running
        in_flight = future is not None and not future.done()
        t0 = time.perf_counter()
        self._work(self.config)
        return {"loss": 0.0, "work_s": time.perf_counter() - t0, "write_in_flight": in_flight}


class PlainBigState(_Compute, _TorchSaveCheckpoints, tune.Trainable):
    """The plain anchor: the same state and compute, ``torch.save`` of model + optimizer."""

    def setup(self, config: dict[str, Any]) -> None:
        self.state = BigState.build(self, config)

    def step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        self._work(self.config)
        return {"loss": 0.0, "work_s": time.perf_counter() - t0, "write_in_flight": False}


#: (label, checkpointing, write in flight at the step's start) -> every step's compute time, all runs.
_STEP_TIMES: dict[tuple[str, bool, bool], list[float]] = {}


def _ckpt_sweep(root: str, name: str, trainable: type, every: int | None, args: argparse.Namespace) -> float:
    ckpt = tune.CheckpointConfig(checkpoint_frequency=every or 0, checkpoint_at_end=False, num_to_keep=2)
    t0 = time.perf_counter()
    grid = tune.Tuner(
        trainable,
        param_space={"gib": args.sweep_gib, "reps": args.reps},
        run_config=tune.RunConfig(name=name, storage_path=root, stop={"training_iteration": args.sweep_iterations},
                                  checkpoint_config=ckpt, verbose=0),
    ).fit()
    wall = time.perf_counter() - t0
    if grid.errors:
        raise RuntimeError(f"sweep {name}: {grid.errors[0]}")
    label = "tunekit" if issubclass(trainable, TorchTrainable) else "plain"
    rows = grid[0].metrics_dataframe
    for work, in_flight in zip(rows["work_s"].iloc[1:], rows["write_in_flight"].iloc[1:]):  # the first: warm-up
        _STEP_TIMES.setdefault((label, bool(every), bool(in_flight)), []).append(float(work))
    return wall


def _step_time_lines() -> list[str]:
    """The training step's compute time while a checkpoint write is in flight, against none."""
    without = _STEP_TIMES.get(("tunekit", False, False), [])
    during = _STEP_TIMES.get(("tunekit", True, True), [])
    if not without or not during:
        return ["  step time with a write in flight: not measured (no such step)"]
    ratio = statistics.mean(during) / statistics.mean(without)
    return [f"  tunekit step compute, mean: {statistics.mean(without):.3f} s without checkpoints, "
            f"{statistics.mean(during):.3f} s with a write in flight ({len(during)} steps): {ratio:.3f}x "
            "(target <= 1.05x)"]


def sweep(args: argparse.Namespace, root: str) -> list[str]:
    args.reps = _reps_for(args.sweep_work)
    walls: dict[tuple[str, bool], list[float]] = {}
    for i in range(args.repeat):
        for label, cls in (("plain", PlainBigState), ("tunekit", BigStateTrain)):
            for every in (None, 1):
                walls.setdefault((label, bool(every)), []).append(
                    _ckpt_sweep(root, f"sweep_{label}_{every}_{i}", cls, every, args))
    best = {k: min(v) for k, v in walls.items()}
    cost = {label: best[(label, True)] - best[(label, False)] for label in ("plain", "tunekit")}
    return [
        f"sweep: 1 trial x {args.sweep_iterations} iterations of ~{args.sweep_work:.1f} s of compute, "
        f"a {args.sweep_gib:.2f} GiB model + Adam state, best of {args.repeat}",
        *(f"  {label:8s} no checkpoints {best[(label, False)]:7.2f} s, a checkpoint every iteration "
          f"{best[(label, True)]:7.2f} s: checkpointing costs {cost[label]:6.2f} s"
          for label in ("plain", "tunekit")),
        f"  ratio tunekit / plain checkpoint cost {cost['tunekit'] / cost['plain']:7.3f}x  (target <= 0.25x)",
        *_per_run_ratio_lines(walls, args.repeat),
        *_step_time_lines(),
    ]


def _per_run_ratio_lines(walls: dict[tuple[str, bool], list[float]], repeat: int) -> list[str]:
    """Each run's ratio on its own (the issue's target holds in every run, not only the best)."""
    ratios = []
    for i in range(repeat):
        cost = {label: walls[(label, True)][i] - walls[(label, False)][i] for label in ("plain", "tunekit")}
        ratios.append(f"{cost['tunekit'] / cost['plain']:.3f}x ({cost['tunekit']:.2f} / {cost['plain']:.2f} s)")
    return [f"  each run's ratio (run order)          {', '.join(ratios)}"]


def _ray_default_save(trainable: BigState, plain_save: Callable[..., Any]) -> None:
    plain_save(trainable)
    trainable.state.counters.iteration += 1


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


# -- snapshot ---------------------------------------------------------------
def _tiny(config: dict[str, Any]) -> None:
    for i in range(config["iterations"]):
        tune.report({"score": config["x"] * (i + 1)})


def snapshot(args: argparse.Namespace, root: str) -> list[str]:
    from ray.tune.execution.tune_controller import TuneController

    from tunekit.callbacks import ParquetLogger

    spent: list[float] = []
    original = TuneController.checkpoint

    def timed(self: Any, *a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(self, *a, **kw)
        finally:
            spent.append(time.perf_counter() - t0)

    TuneController.checkpoint = timed
    try:
        t0 = time.perf_counter()
        grid = tune.Tuner(
            _tiny,
            param_space={"x": tune.uniform(0, 1), "iterations": args.snapshot_iterations},
            tune_config=tune.TuneConfig(num_samples=args.snapshot_trials, metric="score", mode="max"),
            run_config=tune.RunConfig(name="snapshot", storage_path=root, callbacks=[ParquetLogger()], verbose=0),
        ).fit()
        wall = time.perf_counter() - t0
    finally:
        TuneController.checkpoint = original
    if grid.errors:
        raise RuntimeError(f"snapshot experiment: {grid.errors[0]}")
    from tunekit.experiment.snapshot import read_experiment

    t1 = time.perf_counter()
    read_experiment(os.path.join(root, "snapshot"))
    status = time.perf_counter() - t1
    return [
        f"snapshot: {args.snapshot_trials} trials x {args.snapshot_iterations} iterations",
        f"  wall time                            {wall:8.2f} s",
        f"  experiment-state snapshots           {sum(spent):8.2f} s in {len(spent)} calls = {sum(spent) / wall:.1%} of wall time",
        f"  tunekit status (read_experiment)     {status:8.2f} s",
    ]


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(FIGURES), help=f"comma-separated subset of {', '.join(FIGURES)}")
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--every", type=int, default=5, help="checkpoint every N iterations (overhead)")
    parser.add_argument("--state-gib", default="0.5,1", help="state sizes for save/restore/integrity (comma-separated)")
    parser.add_argument("--sweep-gib", type=float, default=0.25)
    parser.add_argument("--sweep-work", type=float, default=1.0, help="seconds of compute per sweep iteration")
    parser.add_argument("--sweep-iterations", type=int, default=8)
    parser.add_argument("--snapshot-trials", type=int, default=200)
    parser.add_argument("--snapshot-iterations", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory on /tmp's disk)")
    args = parser.parse_args(argv)
    which = {w.strip() for w in args.only.split(",") if w.strip()}
    unknown = which - set(FIGURES)
    if unknown:
        parser.error(f"--only: unknown figure(s) {sorted(unknown)}; expected some of {', '.join(FIGURES)}")

    import ray

    root = tempfile.mkdtemp(prefix="tunekit-bench-", dir=args.dir)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"ray {ray.__version__}, torch {torch.__version__}; writing under {root}", flush=True)
    from tunekit._ray import quiet_tune_banner

    quiet_tune_banner()  # no experiment banner per sweep
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        if which & {"save", "restore", "integrity"}:
            for line in save_restore_integrity(args, root, which):
                print(line, flush=True)
        if "sweep" in which:
            for line in sweep(args, root):
                print(line, flush=True)
        if "overhead" in which:
            for line in overhead(args, root):
                print(line, flush=True)
        if "snapshot" in which:
            for line in snapshot(args, root):
                print(line, flush=True)
    finally:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
