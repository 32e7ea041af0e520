"""tunekit's performance figures, each as a ratio against a baseline measured in the same run.

One command, from the repository root, in the environment of the README's
first command::

    python benchmarks/run.py                 # everything (about 5 minutes on 2 CPUs)
    python benchmarks/run.py --only save,restore --state-gib 0.25

Figures (``--only`` takes their names):

overhead   A sweep of tunekit ``DigitsTrainable`` with ``CheckpointByStepsTaken``
           and ``ParquetLogger`` against the same sweep of a hand-written plain
           Ray Tune trainable (same model, data and training code, checkpoints
           with ``torch.save``): same trials, iterations and checkpoints.
           Target <= 1.03x wall time.
save       Time a trainable's ``save()`` blocks training, for a model+optimizer
           state of ``--state-gib`` GiB, against raw ``torch.save`` of the same
           state to the same disk, and against the disk's sequential write
           bandwidth (``--state-gib`` GiB written and fsynced). Target <= 1.2x.
restore    The same for ``restore()`` against raw ``torch.load`` (and against
           ``torch.load`` + ``load_state_dict``, what a trainable must do).
           Target <= 1.2x.
integrity  SHA-256 of the state (the manifest's work) and ``verify_checkpoint``
           as fractions of the save time.
snapshot   Ray Tune's experiment-state snapshots (``TuneController.checkpoint``)
           as a fraction of wall time, in a 200-trial experiment with tunekit's
           callbacks.
"""

from __future__ import annotations

import argparse
import hashlib
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

FIGURES = ("overhead", "save", "restore", "integrity", "snapshot")
GIB = 1 << 30


# -- overhead ---------------------------------------------------------------
class PlainDigits(tune.Trainable):
    """The plain Ray Tune baseline: same model, data and steps; torch.save checkpoints."""

    def setup(self, config: dict[str, Any]) -> None:
        torch.manual_seed(config.get("seed", 0))
        self.state = build_digits_state(config, torch.device("cpu"))

    def step(self) -> dict[str, Any]:
        train_loss = train_steps(self.state, self.config.get("steps_per_iteration"))
        return {"train_loss": train_loss, **evaluate(self.state.model, torch.device("cpu"))}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        torch.save({"model": self.state.model.state_dict(), "optimizer": self.state.optimizer.state_dict()},
                   os.path.join(checkpoint_dir, "model.pt"))

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        sd = torch.load(os.path.join(checkpoint_dir, "model.pt"), weights_only=True)
        self.state.model.load_state_dict(sd["model"])
        self.state.optimizer.load_state_dict(sd["optimizer"])


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
    from tunekit.checkpoint import STATE_FILE, verify_checkpoint, wait_for_durability

    trainable = _trainable(root, args.state_gib)
    sd = {"model": trainable.state.model.state_dict(), "optimizer": trainable.state.optimizer.state_dict()}
    nbytes = sum(t.numel() * t.element_size() for t in _tensors(sd))
    raw_path = os.path.join(root, "raw.pt")
    lines = [f"checkpoint of a model + Adam state: {nbytes / GIB:.2f} GiB, best of {args.repeat}"]

    raw_save = _best(lambda: torch.save(sd, raw_path), args.repeat)
    bandwidth = _disk_write_bandwidth(root, nbytes)
    results = []

    def tk_save() -> None:
        trainable._saved = None
        results.append(trainable.save())
        trainable.state.counters.iteration += 1

    tk_save_time = _best(tk_save, args.repeat)
    wait_for_durability()
    if "save" in which:
        lines += [
            f"  raw torch.save                       {raw_save:8.2f} s",
            f"  disk write bandwidth (fsync'd)       {bandwidth / 1e9:8.2f} GB/s = {nbytes / bandwidth:.2f} s for the state",
            f"  tunekit save() blocks training for   {tk_save_time:8.2f} s",
            f"  ratio tunekit save / torch.save      {tk_save_time / raw_save:8.3f}x  (target <= 1.2x)",
            f"  ratio tunekit save / disk bandwidth  {tk_save_time / (nbytes / bandwidth):8.3f}x",
        ]
        plain = tune.Trainable.save  # Ray's own path: temporary directory, then a copy into storage
        plain_time = _best(lambda: _ray_default_save(trainable, plain), 1)
        lines.append(f"  for reference, Ray's save() path (temp dir + copy) with the same writer: {plain_time:.2f} s")
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
            f"  ratio tunekit restore / torch.load   {tk_restore / raw_load:8.3f}x  (target <= 1.2x)",
            f"  ratio tunekit restore / load+apply   {tk_restore / raw_apply:8.3f}x",
        ]
    if "integrity" in which:
        state_file = os.path.join(checkpoint.checkpoint.path, STATE_FILE)

        def sha() -> None:
            digest = hashlib.sha256()
            with open(state_file, "rb") as fh:
                while chunk := fh.read(8 << 20):
                    digest.update(chunk)

        sha_time = _best(sha, args.repeat)
        verify_time = _best(lambda: verify_checkpoint(checkpoint.checkpoint.path), args.repeat)
        lines += [
            f"  SHA-256 of state.pt (serial)         {sha_time:8.2f} s = {sha_time / tk_save_time:.0%} of the save time "
            "(on save it overlaps the write)",
            f"  added to save by hashing, measured   {max(0.0, tk_save_time - raw_save):8.2f} s = "
            f"{max(0.0, tk_save_time - raw_save) / tk_save_time:.0%} of the save time",
            f"  verify_checkpoint                    {verify_time:8.2f} s = {verify_time / tk_save_time:.0%} of the save time",
        ]
    trainable.stop()
    return lines


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
    from tunekit.snapshot import read_experiment

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
    parser.add_argument("--state-gib", type=float, default=1.0)
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
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        if which & {"save", "restore", "integrity"}:
            for line in save_restore_integrity(args, root, which):
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
