"""Benchmark: a PBT sweep against the same sweep with no scheduler, and reuse_actors on/off.

Same trainable (trainables.DigitsTrainable), trials, iterations and
checkpoint frequency in every variant; wall time of ``Tuner.fit()``, measured
in one run, printed as ratios. Usage::

    python benchmarks/pbt.py                       # 4 trials x 24 iterations
    python benchmarks/pbt.py --trials 8 --iterations 40
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


def _sweep(storage: str, name: str, *, trials: int, iterations: int, interval: int, pbt: bool, reuse: bool) -> float:
    from ray import tune

    from trainables import DigitsTrainable
    from tunekit.pbt import pbt_setup, quiet_pbt_keep_warning

    quiet_pbt_keep_warning()
    setup = pbt_setup(DigitsTrainable, metric="accuracy", mode="max", perturbation_interval=interval,
                      mutations={"lr": tune.loguniform(1e-3, 0.5), "momentum": [0.0, 0.5, 0.9]})
    kwargs = setup.tune_config_kwargs() if pbt else {"metric": "accuracy", "mode": "max"}
    kwargs["reuse_actors"] = reuse
    tuner = tune.Tuner(
        DigitsTrainable,
        param_space={"hidden_size": 64, "seed": tune.grid_search(list(range(trials))),
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
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=24)
    parser.add_argument("--interval", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2, help="keep the best of N runs per variant")
    args = parser.parse_args(argv)

    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    root = tempfile.mkdtemp(prefix="tunekit-pbt-bench-")
    try:
        variants = {
            "no scheduler, reuse_actors": dict(pbt=False, reuse=True),
            "PBT, reuse_actors": dict(pbt=True, reuse=True),
            "PBT, no reuse_actors": dict(pbt=True, reuse=False),
        }
        walls = {}
        for label, opts in variants.items():
            best = min(
                _sweep(root, f"{label.replace(' ', '_').replace(',', '')}_{i}", trials=args.trials,
                       iterations=args.iterations, interval=args.interval, **opts)
                for i in range(args.repeat)
            )
            walls[label] = best
            print(f"{label:30s} {best:7.2f}s", flush=True)
        print()
        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, ray {ray.__version__}")
        print(f"{args.trials} trials x {args.iterations} iterations, perturbation/checkpoint every {args.interval}")
        print(f"ratio PBT / no scheduler:            {walls['PBT, reuse_actors'] / walls['no scheduler, reuse_actors']:.2f}x  (target <= 1.10x)")
        print(f"ratio PBT no reuse / PBT with reuse: {walls['PBT, no reuse_actors'] / walls['PBT, reuse_actors']:.2f}x")
    finally:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
