"""Benchmark: what ``KeepCheckpoints`` costs a PBT sweep, against the same sweep keeping every checkpoint.

The sweep the retention policy was accepted on: 8 trials x 16 iterations, PBT
(:func:`tunekit.pbt_setup`) perturbing and checkpointing every 2 iterations,
trials side by side on all CPUs. Each trial is a :class:`tunekit.TorchTrainable`
with ``--model-mb`` MiB of weights and ``--step-ms`` of matrix products per
iteration, so the checkpoints the policy deletes are of a realistic size.
Variants, in one run, interleaved when ``--repeats`` > 1 (best of each reported):

* ``keep-all``: the anchor, no retention policy (every checkpoint stays);
* ``policy``: ``KeepCheckpoints(experiment_best=2, trial_latest=1, metric="loss", mode="min")``.

Besides the wall times it reports the time spent inside the policy's hooks on
the driver (listing, ranking, deleting), as a share of the sweep's wall time,
and the checkpoints and bytes left on disk.

Usage::

    python benchmarks/retention.py                   # one run of each
    python benchmarks/retention.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch  # noqa: E402
from ray import tune  # noqa: E402

from tunekit import TorchTrainable, TrainingState  # noqa: E402
from tunekit.callbacks import KeepCheckpoints  # noqa: E402
from tunekit.schedule.pbt import pbt_setup, quiet_pbt_keep_warning  # noqa: E402

TRIALS, ITERATIONS, EVERY = 8, 16, 2


class Sized(TorchTrainable):
    """``model_mb`` MiB of weights; each iteration ``step_ms`` of matrix products; the loss depends on ``lr``."""

    def build(self, config: dict[str, Any]) -> TrainingState:
        side = int((config["model_mb"] * 1024 * 1024 / 4) ** 0.5)
        model = torch.nn.Linear(side, side, bias=False)
        return TrainingState(models={"m": model},
                             optimizers={"sgd": torch.optim.SGD(model.parameters(), lr=config["lr"])})

    def train_iteration(self) -> dict[str, Any]:
        start = time.perf_counter()
        x = torch.ones(64, self.state.models["m"].in_features)
        while time.perf_counter() - start < self.config["step_ms"] / 1000:
            with torch.no_grad():
                self.state.models["m"](x)
        with torch.no_grad():
            self.state.models["m"].weight.mul_(1 - self.config["lr"])
        return {"loss": float(abs(self.config["lr"] - 0.05)) + 1.0 / (1 + self.iteration)}


class TimedKeep(KeepCheckpoints):
    """The policy, with the driver time spent in its hooks added up."""

    spent = 0.0
    deleting = 0.0

    def _apply(self, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        try:
            super()._apply(*args, **kwargs)
        finally:
            TimedKeep.spent += time.perf_counter() - start

    def _delete(self, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        try:
            super()._delete(*args, **kwargs)
        finally:
            TimedKeep.deleting += time.perf_counter() - start


def sweep(storage: str, name: str, variant: str, model_mb: float, step_ms: float) -> dict[str, float]:
    quiet_pbt_keep_warning()
    setup = pbt_setup(Sized, metric="loss", mode="min", perturbation_interval=EVERY,
                      mutations={"lr": [0.01, 0.02, 0.05, 0.1, 0.2]})
    callbacks = []
    TimedKeep.spent = TimedKeep.deleting = 0.0
    if variant == "policy":
        callbacks.append(TimedKeep(experiment_best=2, trial_latest=1, metric="loss", mode="min"))
    start = time.perf_counter()
    grid = tune.Tuner(
        Sized,
        param_space={"lr": tune.grid_search([0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5]), "model_mb": model_mb,
                     "step_ms": step_ms},
        tune_config=tune.TuneConfig(**setup.tune_config_kwargs()),
        run_config=tune.RunConfig(name=name, storage_path=storage, stop={"training_iteration": ITERATIONS},
                                  checkpoint_config=setup.checkpoint_config, callbacks=callbacks, verbose=0),
    ).fit()
    wall = time.perf_counter() - start
    if grid.errors:
        raise RuntimeError(f"{variant}: {grid.errors[0]}")
    dirs = list(Path(storage, name).glob("*/checkpoint_*"))
    size = sum(f.stat().st_size for d in dirs for f in d.rglob("*") if f.is_file())
    return {"wall": wall, "hooks": TimedKeep.spent, "deleting": TimedKeep.deleting, "checkpoints": len(dirs),
            "bytes": size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--model-mb", type=float, default=16.0)
    parser.add_argument("--step-ms", type=float, default=200.0)
    args = parser.parse_args(argv)
    import ray

    ray.init(address="local", include_dashboard=False, log_to_driver=False, configure_logging=False)
    storage = tempfile.mkdtemp(prefix="tunekit-bench-retention-")
    runs: dict[str, list[dict[str, float]]] = {"keep-all": [], "policy": []}
    try:
        for repeat in range(args.repeats):
            for variant in runs:
                name = f"{variant}-{repeat}"
                figures = sweep(storage, name, variant, args.model_mb, args.step_ms)
                runs[variant].append(figures)
                print(f"run {repeat + 1} {variant:8s}: {figures['wall']:.2f} s, hooks {figures['hooks'] * 1000:.0f} ms "
                      f"(deleting {figures['deleting'] * 1000:.0f} ms), "
                      f"{figures['checkpoints']} checkpoints ({figures['bytes'] / 2**20:.0f} MiB) left", flush=True)
                shutil.rmtree(Path(storage, name), ignore_errors=True)
    finally:
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)
    best = {v: min(r["wall"] for r in rs) for v, rs in runs.items()}
    share = max(r["hooks"] / r["wall"] for r in runs["policy"])
    print(f"\nbest of {args.repeats}: keep-all {best['keep-all']:.2f} s, policy {best['policy']:.2f} s: "
          f"{best['policy'] / best['keep-all']:.3f}x")
    print(f"time in the policy's hooks: at most {share * 100:.2f}% of a sweep's wall time (target: under 1%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
