"""Benchmark: PBT pause/resume cost of tunekit's trainables against a plain Ray trainable.

One run measures, with the same training (digits MLP, SGD, the same
iterations, trials and checkpoint frequency):

* trainables: the anchor ``PlainDigits`` (a plain ``tune.Trainable`` with
  ``torch.save`` checkpoints, ``benchmarks/plain_digits.py``), tunekit's class
  trainable ``DigitsTrainable`` and its function trainable ``TrainDigits``;
* schedulers: none, Ray's ``PopulationBasedTraining`` and tunekit's
  ``pbt_setup`` (both ``reuse_actors=True``, perturbation and checkpoint every
  ``--interval`` iterations, every checkpoint kept);
* populations of 1x and 4x the CPUs (4x: trials time-share the slots);
* iterations of about 60 and about 400 SGD steps.

It prints the wall time of each ``Tuner.fit()``, the ratios the issue asks
for, and a cycle attribution measured from the trials' own timings: every
worker logs how long its ``save``, ``reset``, ``restore``, ``stop`` and
``train`` calls took (the first ``train`` after a reset/restore separately),
so the time a PBT sweep adds over no scheduler splits into what the
trainables spent and what remains (Ray's controller: pausing, scheduling,
starting workers, waiting for a free slot).

Usage::

    python benchmarks/pbt.py                                # everything (about 15 minutes on 2 CPUs)
    python benchmarks/pbt.py --steps 60 --populations 1     # a subset
    python benchmarks/pbt.py --trainables plain,class --schedulers none,pbt_setup
    python benchmarks/pbt.py --repeats 3                    # best of 3 per sweep (runs interleaved)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parent))

PHASES_ENV = "TUNEKIT_BENCH_PHASES"
SCHEDULERS = ("none", "ray_pbt", "pbt_setup")
TRAINABLES = ("plain", "class", "function")


def timed(base: type) -> type:
    """``base`` whose workers log the duration of each Trainable call to $TUNEKIT_BENCH_PHASES."""

    class Timed(base):  # type: ignore[misc, valid-type]
        _after_restart = False

        def _log(self, phase: str, t0: float) -> None:
            folder = os.environ.get(PHASES_ENV)
            if folder:
                with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as fh:
                    fh.write(json.dumps({"phase": phase, "ms": (time.perf_counter() - t0) * 1e3,
                                         "cpu": time.process_time()}) + "\n")

        def train(self):
            t0 = time.perf_counter()
            result = super().train()
            self._log("first step after" if self._after_restart else "step", t0)
            self._after_restart = False
            return result

        def save(self, checkpoint_dir=None):
            t0 = time.perf_counter()
            result = super().save(checkpoint_dir)
            self._log("save" if getattr(result, "checkpoint", None) is not None else "save (nothing new)", t0)
            return result

        def restore(self, checkpoint_path):
            t0 = time.perf_counter()
            super().restore(checkpoint_path)
            self._after_restart = True
            self._log("restore", t0)

        def reset(self, new_config, storage=None):
            t0 = time.perf_counter()
            ok = super().reset(new_config, storage)
            self._after_restart = True
            self._log("reset", t0)
            return ok

        def stop(self):
            t0 = time.perf_counter()
            super().stop()
            self._log("stop", t0)

    Timed.__name__ = Timed.__qualname__ = f"Timed{base.__name__}"
    return Timed


def _trainable(name: str) -> type:
    from plain_digits import PlainDigits

    from tunekit.trainables import DigitsTrainable, TrainDigits

    return timed({"plain": PlainDigits, "class": DigitsTrainable, "function": TrainDigits}[name])


def _sweep(storage: str, name: str, *, trainable: str, scheduler: str, trials: int, iterations: int,
           interval: int, steps: int, phases_dir: str, metric: str = "accuracy") -> tuple[float, dict[str, list[float]]]:
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    from tunekit.schedule.pbt import pbt_setup, quiet_pbt_keep_warning

    quiet_pbt_keep_warning()
    cls = _trainable(trainable)
    mutations = {"lr": tune.loguniform(1e-3, 0.5), "momentum": [0.0, 0.5, 0.9]}
    mode = "max" if metric == "accuracy" else "min"
    setup = pbt_setup(cls, metric=metric, mode=mode, perturbation_interval=interval, mutations=mutations)
    kwargs = {"metric": metric, "mode": mode, "reuse_actors": True}
    if scheduler == "pbt_setup":
        kwargs = setup.tune_config_kwargs()
    elif scheduler == "ray_pbt":
        kwargs["scheduler"] = PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=interval,
                                                      hyperparam_mutations=mutations)
    clear_phases(phases_dir)
    tuner = tune.Tuner(
        cls,
        param_space={"hidden_size": 64, "steps_per_iteration": steps, "seed": tune.grid_search(list(range(trials))),
                     "lr": tune.loguniform(1e-3, 0.5), "momentum": 0.9},
        tune_config=tune.TuneConfig(**kwargs),
        run_config=tune.RunConfig(name=name, storage_path=storage, stop={"training_iteration": iterations},
                                  checkpoint_config=setup.checkpoint_config, verbose=0),
    )
    return fit_and_read_phases(tuner, name, phases_dir)


def fit_and_read_phases(tuner: Any, name: str, phases_dir: str) -> tuple[float, dict[str, list[float]]]:
    """``tuner.fit()``'s wall time (any failed trial ends the benchmark) and the phases its workers logged."""
    t0 = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - t0
    if grid.errors:
        raise SystemExit(f"{name}: {len(grid.errors)} trial(s) failed, the first: {grid.errors[0]}")
    return wall, read_phases(phases_dir)


def clear_phases(phases_dir: str) -> None:
    """Forget the calls logged by the previous sweep."""
    for f in os.listdir(phases_dir):
        os.remove(os.path.join(phases_dir, f))


#: Not a phase: the steps each worker process ran, one entry per process that trained (``read_phases``).
WORKERS = "workers"
#: Not a phase: each worker process's CPU time (s, every thread, its start included) by its last logged call.
WORKER_CPU = "worker cpu s"


def read_phases(phases_dir: str) -> dict[str, list[float]]:
    """phase -> the duration (ms) of each call the workers logged in ``phases_dir``; :data:`WORKERS` -> the steps
    each worker process ran (Tune starts workers it stops before they train: those are left out)."""
    phases: dict[str, list[float]] = defaultdict(list)
    for f in os.listdir(phases_dir):
        steps, cpu = 0, 0.0
        for line in Path(phases_dir, f).read_text().splitlines():
            record = json.loads(line)
            phases[record["phase"]].append(record["ms"])
            steps += record["phase"] in ("step", "first step after")
            cpu = max(cpu, record.get("cpu", 0.0))
        if steps:
            phases[WORKERS].append(steps)
            phases[WORKER_CPU].append(cpu)
    return phases


def worker_time_ms(phases: dict[str, list[float]]) -> float:
    """The milliseconds the workers spent in the calls they logged."""
    return sum(sum(v) for k, v in phases.items() if k not in (WORKERS, WORKER_CPU))


def workers_trained(phases: dict[str, list[float]]) -> str:
    """How many worker processes trained, and their steps: Tune hands a finished or pausing trial's worker to
    the trial it runs next and stops that one's own worker if it was starting; with trials or iterations
    shorter than a worker's start, one worker can run the whole sweep (``benchmarks/README.md``)."""
    steps = sorted(phases.get(WORKERS, []), reverse=True)
    cpu = sum(phases.get(WORKER_CPU, []))
    return f"{len(steps)} worker(s) trained ({'/'.join(f'{s:.0f}' for s in steps)} steps, {cpu:.1f} s CPU)"


def _describe(phases: dict[str, list[float]]) -> str:
    parts = []
    for phase in ("save", "save (nothing new)", "reset", "restore", "stop", "first step after", "step"):
        if phases.get(phase):
            parts.append(f"{phase} {len(phases[phase])}x {statistics.median(phases[phase]):.1f} ms")
    return ", ".join(parts) + f"; {workers_trained(phases)}"


def _trainable_extra_s(pbt: dict[str, list[float]], none: dict[str, list[float]]) -> float:
    """Seconds of worker time the PBT sweep spent beyond the no-scheduler sweep's."""
    return (worker_time_ms(pbt) - worker_time_ms(none)) / 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=16)
    parser.add_argument("--interval", type=int, default=2, help="perturbation and checkpoint interval")
    parser.add_argument("--steps", default="60,400", help="SGD steps per iteration (comma-separated)")
    parser.add_argument("--populations", default="1,4", help="trials per CPU (comma-separated)")
    parser.add_argument("--trainables", default=",".join(TRAINABLES))
    parser.add_argument("--schedulers", default=",".join(SCHEDULERS))
    parser.add_argument("--repeats", type=int, default=1,
                        help="run every sweep N times, interleaved; report each one's best (fastest) run")
    parser.add_argument("--metric", choices=("accuracy", "loss"), default="accuracy",
                        help="what the schedulers rank by: validation accuracy (max; ties once it saturates, "
                             "on which Ray's PBT can loop) or validation loss (min; no ties)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: expected an integer >= 1")
    trainables = [t for t in args.trainables.split(",") if t]
    schedulers = [s for s in args.schedulers.split(",") if s]
    bad = sorted(set(trainables) - set(TRAINABLES)) + sorted(set(schedulers) - set(SCHEDULERS))
    if bad:
        parser.error(f"unknown trainable/scheduler {bad}; expected {TRAINABLES} and {SCHEDULERS}")

    import ray
    import ray.cloudpickle

    import plain_digits

    ray.cloudpickle.register_pickle_by_value(plain_digits)  # workers need not import benchmarks/
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cpus = os.cpu_count() or 1
    root = tempfile.mkdtemp(prefix="tunekit-pbt-bench-")
    phases_dir = os.path.join(root, "phases")
    os.makedirs(phases_dir)
    os.environ[PHASES_ENV] = phases_dir  # inherited by the workers of the local Ray started below
    from tunekit._ray import quiet_tune_banner

    quiet_tune_banner()  # no experiment banner per sweep
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    walls: dict[tuple, float] = {}
    logs: dict[tuple, dict] = {}
    try:
        _sweep(root, "warmup", trainable="class", scheduler="pbt_setup", trials=cpus, iterations=2, interval=1,
               steps=1, phases_dir=phases_dir)
        runs: dict[tuple, list[float]] = {}
        for repeat in range(args.repeats):  # interleaved: a noisy minute spreads over all sweeps
            for steps in [int(s) for s in args.steps.split(",")]:
                for per_cpu in [int(p) for p in args.populations.split(",")]:
                    trials = per_cpu * cpus
                    for trainable in trainables:
                        for scheduler in schedulers:
                            key = (steps, trials, trainable, scheduler)
                            wall, log = _sweep(
                                root, "_".join(map(str, key)) + f"_{repeat}", trainable=trainable,
                                scheduler=scheduler, trials=trials, iterations=args.iterations,
                                interval=args.interval, steps=steps, phases_dir=phases_dir, metric=args.metric)
                            runs.setdefault(key, []).append(wall)
                            if key not in walls or wall < walls[key]:
                                walls[key], logs[key] = wall, log
                            print(f"[{repeat + 1}/{args.repeats}] {steps:4d} steps {trials:2d} trials "
                                  f"{trainable:9s} {scheduler:10s} {wall:7.2f} s   {_describe(log)}", flush=True)
        print()
        print(f"machine: {platform.machine()}, {cpus} CPUs, Python {platform.python_version()}, ray {ray.__version__}")
        print(f"{args.iterations} iterations, perturbation and checkpoint every {args.interval}, reuse_actors=True, "
              f"ranked by validation {args.metric}")
        if args.repeats > 1:
            print(f"best of {args.repeats} runs per sweep (all runs: wall s, in order)")
            for key, all_walls in runs.items():
                print(f"  {key}: {', '.join(f'{w:.2f}' for w in all_walls)}")
        print()
        print("| steps | trials | trainable | scheduler | wall s | / its no-scheduler | / plain, same scheduler "
              "| worker s beyond no-scheduler | rest (Ray controller) s per CPU |")
        print("|---|---|---|---|---|---|---|---|---|")
        for (steps, trials, trainable, scheduler), wall in walls.items():
            none = walls.get((steps, trials, trainable, "none"))
            plain = walls.get((steps, trials, "plain", scheduler))
            ratio_none = f"{wall / none:.2f}x" if none and scheduler != "none" else ""
            ratio_plain = f"{wall / plain:.2f}x" if plain and trainable != "plain" else ""
            extra = rest = ""
            if none and scheduler != "none":
                worker = _trainable_extra_s(logs[(steps, trials, trainable, scheduler)],
                                            logs[(steps, trials, trainable, "none")])
                extra = f"{worker:.2f}"
                rest = f"{(wall - none) - worker / cpus:.2f}"
            print(f"| {steps} | {trials} | {trainable} | {scheduler} | {wall:.2f} | {ratio_none} | {ratio_plain} "
                  f"| {extra} | {rest} |")
        print()
        print("Phase medians per sweep (ms):")
        for key, phases in logs.items():
            print(f"  {key}: {_describe(phases)}")
    finally:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
