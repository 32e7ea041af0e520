"""Benchmark: a PBT sweep against the same sweep with no scheduler, and reuse_actors on/off.

Same trainable (tunekit.trainables.DigitsTrainable), trials, iterations and
checkpoint frequency in every variant; wall time of ``Tuner.fit()``, measured
in one run, printed as ratios. Two populations: one that fits the machine
(trials = CPUs, every trial runs all the time) and one twice as large (Ray's
PBT then time-shares: at each perturbation a trial pauses while others wait).
Usage::

    python benchmarks/pbt.py                       # 24 iterations, perturbation every 4
    python benchmarks/pbt.py --iterations 40 --interval 5 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def _sweep(storage: str, name: str, *, trials: int, iterations: int, interval: int, pbt: bool, reuse: bool,
           steps: int) -> float:
    from ray import tune

    from tunekit.pbt import pbt_setup, quiet_pbt_keep_warning
    from tunekit.trainables import DigitsTrainable

    quiet_pbt_keep_warning()
    setup = pbt_setup(DigitsTrainable, metric="accuracy", mode="max", perturbation_interval=interval,
                      mutations={"lr": tune.loguniform(1e-3, 0.5), "momentum": [0.0, 0.5, 0.9]})
    kwargs = setup.tune_config_kwargs() if pbt else {"metric": "accuracy", "mode": "max"}
    kwargs["reuse_actors"] = reuse
    tuner = tune.Tuner(
        DigitsTrainable,
        param_space={"hidden_size": 64, "steps_per_iteration": steps, "seed": tune.grid_search(list(range(trials))),
                     "lr": tune.loguniform(1e-3, 0.5)},
        tune_config=tune.TuneConfig(**kwargs),
        run_config=tune.RunConfig(name=name, storage_path=storage, stop={"training_iteration": iterations},
                                  checkpoint_config=setup.checkpoint_config, verbose=0),
    )
    t0 = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - t0
    assert not grid.errors, grid.errors
    return wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=24)
    parser.add_argument("--interval", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100, help="SGD steps per iteration")
    parser.add_argument("--repeat", type=int, default=2, help="keep the best of N runs per variant")
    args = parser.parse_args(argv)

    import ray

    cpus = os.cpu_count() or 1
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    root = tempfile.mkdtemp(prefix="tunekit-pbt-bench-")
    lines = []
    try:
        def best(label: str, **opts) -> float:
            wall = min(
                _sweep(root, f"{label}_{i}".replace(" ", "_").replace(",", ""), iterations=args.iterations,
                       interval=args.interval, steps=args.steps, **opts)
                for i in range(args.repeat)
            )
            print(f"{label:45s} {wall:7.2f}s", flush=True)
            return wall

        _sweep(root, "warmup", trials=cpus, iterations=2, interval=1, pbt=True, reuse=True, steps=1)
        for trials in (cpus, 2 * cpus):
            plain = best(f"{trials} trials, no scheduler", trials=trials, pbt=False, reuse=True)
            pbt = best(f"{trials} trials, PBT, reuse_actors", trials=trials, pbt=True, reuse=True)
            lines.append(f"{trials} trials on {cpus} CPUs: PBT / no scheduler = {pbt / plain:.2f}x"
                         + ("  (target <= 1.10x)" if trials == cpus else "  (time-shared population)"))
            if trials == cpus:
                no_reuse = best(f"{trials} trials, PBT, no reuse_actors", trials=trials, pbt=True, reuse=False)
                lines.append(f"{trials} trials on {cpus} CPUs: PBT without / with reuse_actors = {no_reuse / pbt:.2f}x")
        print()
        print(f"machine: {platform.machine()}, {cpus} CPUs, Python {platform.python_version()}, ray {ray.__version__}")
        print(f"{args.iterations} iterations of {args.steps} steps, perturbation and checkpoint every {args.interval}, "
              f"best of {args.repeat}")
        for line in lines:
            print(line)
    finally:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
