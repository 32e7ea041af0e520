"""Benchmark: a sweep of many short trials, tunekit's trainables against a plain Ray Tune trainable.

The sweep random search, ASHA and HyperBand users run: ``--trials`` trials
(default 400) of ``--iterations`` iterations (default 4) of a tiny model
(``torch.nn.Linear(16, 1)``, one SGD step per iteration), a checkpoint every 2
iterations and at the end, ``reuse_actors=True``, on all CPUs. Variants, in
one run (interleaved when ``--repeats`` > 1, best of each reported):

* ``plain``: the anchor, a ``tune.Trainable`` that ``torch.save``s model and
  optimizer and rebuilds both in ``reset_config``;
* ``class``: the same training as a :class:`tunekit.TorchTrainable`;
* ``function``: the same as a training function with a
  :class:`tunekit.FunctionSession`, wrapped by :func:`tunekit.function_trainable`;
* ``class+callbacks``: ``class`` with ``ParquetLogger()``, ``ProgressPrinter("loss", mode="min")`` and
  ``KeepCheckpoints(trial_latest=1, experiment_best=5, ...)`` (``--callbacks``: some of them, to see what
  each costs);
* ``function+callbacks``: ``function`` with the same callbacks (the function variants checkpoint every 2
  iterations and not at a trial's end, as ``plain-function`` does);
* ``plain-function``: what a Ray Tune user writes as a training function without tunekit (``torch.save``
  into a temporary directory and ``tune.report(..., checkpoint=...)`` every 2 iterations; Ray refuses
  ``checkpoint_frequency`` for function trainables): Ray's own cost of running a function (a thread per
  trial, two thread hand-offs per result), the anchor the ``function`` variants share;
* ``plain-again``: ``plain`` once more in each round, the noise floor: its ratio to ``plain`` is what the
  machine alone spreads a same-round ratio by;
* ``plain-json-only``: ``plain`` with Ray's default loggers cut to its JSON logger
  (``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1`` and ``JsonLoggerCallback()``: no CSV file, no tensorboardX
  event file flushed after every result): what Ray's own loggers cost the driver (docs/schedulers.md).

Modes that run each sweep in a driver process of its own: ``--fresh`` (the
variants in turn, rotated each round), ``--paired`` (each variant's run next to
a plain run of its own) and ``--side-by-side`` (each variant's run at the same
time as a plain run, each sweep, its driver and its own local Ray pinned to one
of two CPUs, swapped every round): the machine's speed drifts over minutes, and
two sweeps at the same time see the same drift. Its ratio of two plain sweeps
(``plain-again``) is the noise floor it shows each time.

Per-trial attribution from the trials' own timings: every worker logs how
long each ``setup``, ``reset``, ``train``, ``save`` and ``stop`` took; the
table gives each phase's milliseconds per trial, and what remains of the
wall time is Ray's (scheduling, the driver, the callbacks). Then it times
``tunekit status``, ``verify`` and ``report`` on the ``class`` experiment.

Usage::

    python benchmarks/many_trials.py                    # 400 trials, one run of each (about 5 minutes on 2 CPUs)
    python benchmarks/many_trials.py --trials 100 --repeats 3
    python benchmarks/many_trials.py --driver-memory 100,2000 --variants plain,class+callbacks --repeats 3
    python benchmarks/many_trials.py --trials 2000 --fresh --repeats 3   # a driver process per sweep
    python benchmarks/many_trials.py --trials 2000 --fresh --repeats 3 --scheduler busy   # tunekit.schedule.schedulers
    python benchmarks/many_trials.py --trials 2000 --paired --repeats 3 --scheduler busy --variants class+callbacks
    python benchmarks/many_trials.py --trials 2000 --side-by-side --repeats 3 --scheduler busy --variants plain-again
    python benchmarks/many_trials.py --trials 2000 --variants class+callbacks --storage s3   # readers' S3 requests
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from ray import tune  # noqa: E402

from pbt import PHASES_ENV, clear_phases, fit_and_read_phases, timed, worker_time_ms, workers_trained  # noqa: E402
from tunekit import FunctionSession, TorchTrainable, TrainingState, function_trainable  # noqa: E402

VARIANTS = ("plain", "class", "function", "class+callbacks", "function+callbacks", "plain-function", "plain-again",
            "plain-json-only")
CALLBACKS = ("parquet", "progress", "keep")  # the +callbacks variants' callbacks (--callbacks: some of them)
PHASES = ("setup", "reset", "step", "first step after", "save", "save (nothing new)", "restore", "stop")


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(32, 16)
    return x, x.sum(dim=1, keepdim=True)


def _sgd_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
    x, y = _batch()
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss)


class PlainShort(tune.Trainable):
    """The anchor: what a Ray Tune user writes without tunekit."""

    def setup(self, config: dict[str, Any]) -> None:
        torch.manual_seed(config["seed"])
        self.model = torch.nn.Linear(16, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config["lr"])

    def step(self) -> dict[str, float]:
        return {"loss": _sgd_step(self.model, self.optimizer)}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()},
                   os.path.join(checkpoint_dir, "state.pt"))

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        sd = torch.load(os.path.join(checkpoint_dir, "state.pt"), weights_only=True)
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.setup(new_config)
        return True


class TunekitShort(TorchTrainable):
    """The same training as a tunekit class trainable."""

    def build(self, config: dict[str, Any]) -> TrainingState:
        model = torch.nn.Linear(16, 1)
        return TrainingState(models={"model": model},
                             optimizers={"opt": torch.optim.SGD(model.parameters(), lr=config["lr"])})

    def train_iteration(self) -> dict[str, float]:
        return {"loss": _sgd_step(self.state.models["model"], self.state.optimizers["opt"])}


def train_short(config: dict[str, Any]) -> None:
    """The same training as a tunekit function trainable."""
    torch.manual_seed(config["seed"])
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    session = FunctionSession(TrainingState(models={"model": model}, optimizers={"opt": optimizer}), config=config)
    while True:
        session.report({"loss": _sgd_step(model, optimizer)})


def train_plain_function(config: dict[str, Any]) -> None:
    """The same training as a plain Ray Tune training function (Ray's documented checkpointing)."""
    torch.manual_seed(config["seed"])
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    iteration = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            sd = torch.load(os.path.join(directory, "state.pt"), weights_only=True)
        model.load_state_dict(sd["model"])
        optimizer.load_state_dict(sd["optimizer"])
        iteration = sd["iteration"]
    while True:
        loss = _sgd_step(model, optimizer)
        iteration += 1
        if iteration % 2:
            tune.report({"loss": loss})
            continue
        with tempfile.TemporaryDirectory() as directory:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iteration": iteration},
                       os.path.join(directory, "state.pt"))
            tune.report({"loss": loss}, checkpoint=tune.Checkpoint.from_directory(directory))


def _with_setup_timing(cls: type) -> type:
    class Timed(timed(cls)):  # type: ignore[misc, valid-type]
        def setup(self, config: dict[str, Any]) -> None:
            t0 = time.perf_counter()
            super().setup(config)
            self._log("setup", t0)

    Timed.__name__ = Timed.__qualname__ = f"Timed{cls.__name__}"
    return Timed


def _trainable(variant: str) -> type:
    if variant in ("plain", "plain-again", "plain-json-only"):
        return _with_setup_timing(PlainShort)
    if variant == "plain-function":
        from ray.tune.trainable.function_trainable import wrap_function

        return _with_setup_timing(wrap_function(train_plain_function))
    if variant in ("function", "function+callbacks"):
        return _with_setup_timing(function_trainable(train_short))
    return _with_setup_timing(TunekitShort)


def _sweep(storage: str, name: str, variant: str, *, trials: int, iterations: int,
           phases_dir: str, scheduler: str = "fifo",
           callback_names: tuple[str, ...] = CALLBACKS) -> tuple[float, dict[str, list[float]]]:
    """One sweep of ``variant``: its wall time and the phases its workers logged. Ray's
    ``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS`` is cleared for every variant but ``plain-json-only`` (which sets it)
    and put back as it was afterwards."""
    from ray.tune.schedulers import ASHAScheduler

    from tunekit.callbacks import KeepCheckpoints, ParquetLogger, ProgressPrinter

    clear_phases(phases_dir)
    made = {"parquet": ParquetLogger, "progress": lambda: ProgressPrinter("loss", mode="min",
                                                                         stream=open(os.devnull, "w")),
            "keep": lambda: KeepCheckpoints(trial_latest=1, experiment_best=5, metric="loss", mode="min")}
    callbacks = [made[name]() for name in callback_names] if variant.endswith("+callbacks") else []
    loggers_env = "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"
    was = os.environ.pop(loggers_env, None)
    if variant == "plain-json-only":  # (Ray reads it when the Tuner builds its callbacks)
        from ray.tune.logger import JsonLoggerCallback

        os.environ[loggers_env] = "1"
        callbacks.append(JsonLoggerCallback())
    from tunekit.schedule.schedulers import ASHAKeepWorkersBusy, FIFOKeepWorkersBusy

    asha = dict(metric="loss", mode="min", max_t=iterations, grace_period=1, reduction_factor=2)
    chosen = {"fifo": None, "busy": FIFOKeepWorkersBusy(), "asha": ASHAScheduler(**asha),
              "asha-busy": ASHAKeepWorkersBusy(**asha)}[scheduler]
    tuner = tune.Tuner(
        _trainable(variant),
        param_space={"lr": tune.uniform(0.001, 0.1), "seed": tune.randint(0, 1_000_000)},
        tune_config=tune.TuneConfig(num_samples=trials, reuse_actors=True, scheduler=chosen),
        run_config=tune.RunConfig(
            name=name, storage_path=storage, stop={"training_iteration": iterations}, verbose=0,
            callbacks=callbacks,
            # (a training function checkpoints itself: Ray refuses a frequency for it; tunekit's function
            # trainable saves as often as it, every 2 iterations and not at a trial's end, so that ASHA's early
            # stops cost both sides the same saves)
            checkpoint_config=tune.CheckpointConfig() if variant == "plain-function" else
            tune.CheckpointConfig(checkpoint_frequency=2, checkpoint_at_end=not variant.startswith("function")),
        ),
    )
    try:
        return fit_and_read_phases(tuner, name, phases_dir)
    finally:
        os.environ.pop(loggers_env, None)
        if was is not None:
            os.environ[loggers_env] = was


def _time_command(args: list[str], runs: int = 3) -> str:
    """Best wall time of ``tunekit ARGS`` (a fresh process each run), and its exit status."""
    best, code = float("inf"), 0
    for _ in range(runs):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", "import sys; from tunekit.cli import main; sys.exit(main())",
                               *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
        best, code = min(best, time.perf_counter() - t0), done.returncode
        if code not in (0, 2):  # 2: damage reported, still a full read
            return f"failed (exit {code}): {done.stderr.strip().splitlines()[-1:]}"
    return f"{best:6.2f} s (exit {code})"


def _machine_cpu(cpu: int | None = None) -> tuple[float, float]:
    """The whole machine's CPU seconds so far from ``/proc/stat`` (or CPU ``cpu``'s alone): busy (user, nice,
    system, irq, softirq: every process's, Ray's and the workers' included) and stolen (the hypervisor ran
    someone else on our CPUs)."""
    try:
        with open("/proc/stat") as f:
            wanted = "cpu" if cpu is None else f"cpu{cpu}"
            line = next(line for line in f if line.split()[0] == wanted)
        fields = [int(v) for v in line.split()[1:]]
    except (OSError, StopIteration):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / tick, fields[7] / tick


def _child_command(args: argparse.Namespace, variant: str, trials: int, keep: str | None = None,
                   cpu: int | None = None) -> list[str]:
    return [sys.executable, __file__, "--trials", str(trials), "--iterations", str(args.iterations),
            "--variants", variant, "--scheduler", args.scheduler, "--print-peak-rss", "--callbacks", args.callbacks,
            *(["--keep", keep] if keep else []), *(["--cpu", str(cpu)] if cpu is not None else [])]


def _child_said(variant: str, trials: int, code: int, stdout: str,
                stderr: str) -> tuple[float, float, str, float, float, float]:
    said = dict(line.split(" ", 1) for line in stdout.splitlines()
                if line.startswith(("peak-rss-kib ", "wall-s ", "workers ", "cpu-s ", "machine-s ")))
    if code or len(said) != 5:
        raise SystemExit(f"{variant} at {trials} trials failed: {stderr.strip().splitlines()[-3:]}")
    busy, stolen = (float(v) for v in said["machine-s"].split())
    return (float(said["wall-s"]), int(said["peak-rss-kib"]) / 1024, said["workers"], float(said["cpu-s"]),
            busy, stolen)


def _child(args: argparse.Namespace, variant: str, trials: int,
           keep: str | None = None) -> tuple[float, float, str, float, float, float]:
    """One sweep in a fresh driver process: its wall time (s), the driver's peak RSS (MiB), the workers that
    trained, the driver process's CPU time (s; its every thread, Ray's start and the imports included), and
    the whole machine's busy and stolen CPU seconds during the sweep (``_machine_cpu``)."""
    done = subprocess.run(_child_command(args, variant, trials, keep), capture_output=True, text=True,
                          check=False)
    return _child_said(variant, trials, done.returncode, done.stdout, done.stderr)


def _fresh(args: argparse.Namespace, variants: list[str]) -> int:
    """Each sweep in a driver process of its own (nothing one sweep leaves in Ray's driver slows the next),
    the variants' order rotated each round; every run against plain's run of the same round."""
    every: dict[str, list[float]] = {v: [] for v in variants}
    for repeat in range(args.repeats):
        for variant in variants[repeat % len(variants):] + variants[:repeat % len(variants)]:
            keep = os.path.join(args.keep, f"r{repeat}") if args.keep else None
            wall, peak, workers, cpu, *_ = _child(args, variant, args.trials, keep)
            every[variant].append(wall)
            print(f"  {variant:16s} run {repeat + 1}: {wall:7.1f} s  (driver: peak RSS {peak:6.1f} MiB, CPU "
                  f"{cpu:5.1f} s), {workers}", flush=True)
    print(f"\n{args.trials} trials x {args.iterations} iterations, {args.scheduler}, a fresh driver per sweep; "
          "each run against plain's run of the same round")
    plain = every.get("plain")
    for variant in variants:
        runs = ", ".join(f"{w:.1f}" for w in every[variant])
        line = f"  {variant:16s} runs {runs} s"
        if plain:
            ratios = [w / p for w, p in zip(every[variant], plain)]
            line += f"  -> {', '.join(f'{r:.2f}x' for r in ratios)} plain (worst {max(ratios):.2f}x)"
        print(line)
    return 0


def _paired(args: argparse.Namespace, variants: list[str]) -> int:
    """Each run of a variant beside a plain run of its own, in a fresh driver each: plain then the variant in
    odd rounds, the variant then plain in even ones. The machine's speed drifts over minutes (a round of
    seven 2,000-trial sweeps takes ten minutes); a ratio to the run just before or after sees the least of it.
    Two ratios a pair: wall time, and the whole machine's busy CPU seconds (every process: the driver, Ray's,
    the workers; without the time the hypervisor stole, ``_machine_cpu``)."""
    others = [v for v in variants if v != "plain"]
    kinds = ("wall", "machine CPU")
    ratios: dict[str, dict[str, list[float]]] = {v: {k: [] for k in kinds} for v in others}
    for repeat in range(args.repeats):
        for variant in others:
            pair = ["plain", variant] if repeat % 2 == 0 else [variant, "plain"]
            measured: dict[str, tuple[float, float]] = {}
            keep = os.path.join(args.keep, f"r{repeat}-{variant}") if args.keep else None  # (a pair's own)
            for name in pair:
                wall, _, workers, cpu, busy, stolen = _child(args, name, args.trials, keep)
                measured[name] = (wall, busy)
                print(f"  {name:18s} round {repeat + 1}: {wall:7.1f} s  (driver CPU {cpu:5.1f} s; machine busy "
                      f"{busy:6.1f} CPU-s, stolen {stolen:5.1f}), {workers}", flush=True)
            _add_ratios(ratios[variant], measured[variant], measured["plain"], f"{variant} / plain beside it")
    return _print_ratios(args, ratios, "a fresh driver per sweep; each run against the plain run beside it")


def _add_ratios(ratios: dict[str, list[float]], variant: tuple[float, ...], plain: tuple[float, ...],
                said: str) -> None:
    """A pair's ratios (variant / plain, each kind), kept and printed."""
    for kind, a, b in zip(ratios, variant, plain):
        ratios[kind].append(a / b if b else float("nan"))  # (no /proc/stat: no CPU ratio)
    print(f"  -> {said}: " + ", ".join(f"{found[-1]:.2f}x {kind}" for kind, found in ratios.items()), flush=True)


def _print_ratios(args: argparse.Namespace, ratios: dict[str, dict[str, list[float]]], how: str) -> int:
    print(f"\n{args.trials} trials x {args.iterations} iterations, {args.scheduler}, {how}")
    for variant, by_kind in ratios.items():
        print(f"  {variant}")
        for kind, found in by_kind.items():
            print(f"    {kind:12s} {', '.join(f'{r:.2f}x' for r in found)} (worst {max(found):.2f}x)")
    return 0


def _side_by_side(args: argparse.Namespace, variants: list[str]) -> int:
    """Each run of a variant at the same time as a plain run of its own, each sweep's driver (and its own local
    Ray: raylet, workers) pinned to one CPU of two, the CPUs swapped every round. Both sweeps live through the
    same minutes of the machine, so a drift of its speed slows both; what one CPU was busy and stolen is read
    from its own line of ``/proc/stat``."""
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("--side-by-side: needs two CPUs (a sweep pinned to each)")
    cpus = sorted(os.sched_getaffinity(0))[:2]
    anchors = {v: _anchor_of(v, variants) for v in variants if v not in ("plain", "plain-function")}
    if "plain-function" in variants and "plain-function" not in anchors.values():
        anchors["plain-function"] = "plain"  # (named alone: Ray's function runner against the plain class)
    kinds = ("wall", "its CPU busy")
    ratios: dict[str, dict[str, list[float]]] = {v: {k: [] for k in kinds} for v in anchors}
    for repeat in range(args.first_round - 1, args.first_round - 1 + args.repeats):
        for variant, anchor in anchors.items():
            where = dict(zip((anchor, variant), cpus if repeat % 2 == 0 else cpus[::-1]))
            keep = os.path.join(args.keep, f"r{repeat}-{variant}") if args.keep else None  # (a pair's own)
            running = {name: subprocess.Popen(_child_command(args, name, args.trials,  # (a side's own: phases)
                                                             keep and os.path.join(keep, name), cpu), text=True,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                       for name, cpu in where.items()}
            finished = {name: (*proc.communicate(), proc.returncode) for name, proc in running.items()}
            measured: dict[str, tuple[float, float]] = {}
            for name, (out, err, code) in finished.items():  # (both ended: a failure leaves no sweep running)
                wall, _, workers, cpu_s, busy, stolen = _child_said(name, args.trials, code, out, err)
                measured[name] = (wall, busy)
                print(f"  {name:18s} round {repeat + 1}, CPU {where[name]}: {wall:7.1f} s  (driver CPU {cpu_s:5.1f} "
                      f"s; the CPU busy {busy:6.1f} s, stolen {stolen:5.1f}), {workers}", flush=True)
            _add_ratios(ratios[variant], measured[variant], measured[anchor], f"{variant} / {anchor} at the same time")
    return _print_ratios(args, ratios, "a fresh driver per sweep on one CPU; each run against its anchor's run at "
                                       "the same time on the other CPU (plain-function's for the function variants "
                                       "where it is named, else plain's)")


def _anchor_of(variant: str, variants: list[str]) -> str:
    """The plain sweep a variant runs beside: a function variant's is Ray's own function trainable
    (``plain-function``) when that is among the variants, every other's the plain class trainable."""
    return "plain-function" if variant.startswith("function") and "plain-function" in variants else "plain"


def _driver_memory(args: argparse.Namespace, variants: list[str]) -> int:
    """Each variant's driver peak RSS at two trial counts, each sweep in a fresh driver process."""
    counts = [int(n) for n in args.driver_memory.split(",")]
    if len(counts) != 2 or counts[0] >= counts[1]:
        raise SystemExit("--driver-memory: two trial counts, N,M with N < M")
    peaks: dict[tuple[str, int], float] = {}
    for repeat in range(args.repeats):
        for variant in variants:
            for n in counts:
                peaks[(variant, n)] = _child(args, variant, n)[1]
                print(f"  {variant:16s} {n:6d} trials (run {repeat + 1}): driver peak RSS {peaks[(variant, n)]:7.1f} MiB",
                      flush=True)
        low, high = counts
        per_k = {v: (peaks[(v, high)] - peaks[(v, low)]) * 1000 / (high - low) for v in variants}
        print(f"run {repeat + 1}: driver growth from {low} to {high} trials, MiB per 1,000 trials: "
              + ", ".join(f"{v} {g:+.1f}" for v, g in per_k.items())
              + ("" if "plain" not in per_k else "; tunekit's share: "
                 + ", ".join(f"{v} {g - per_k['plain']:+.1f}" for v, g in per_k.items() if v != "plain")))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--repeats", type=int, default=1, help="run each sweep N times, interleaved; each shown")
    parser.add_argument("--scheduler", choices=("fifo", "busy", "asha", "asha-busy"), default="fifo",
                        help="fifo: Ray's default; asha: ASHA early stopping (grace 1, reduction 2) over the "
                             "trials; busy, asha-busy: the same as tunekit.schedule.schedulers' FIFOKeepWorkersBusy and "
                             "ASHAKeepWorkersBusy (every variant, plain too)")
    mode = parser.add_mutually_exclusive_group()  # (one way of running the sweeps at a time)
    mode.add_argument("--driver-memory", metavar="N,M",
                        help="instead: each variant's driver peak RSS at N and at M trials (a fresh driver "
                             "process per sweep), and tunekit's growth against plain's per 1,000 trials")
    mode.add_argument("--fresh", action="store_true",
                        help="each sweep in a driver process of its own, the variants' order rotated each round")
    mode.add_argument("--paired", action="store_true",
                        help="each run of a variant beside a plain run of its own (fresh drivers; plain first "
                             "in odd rounds, second in even ones), each ratio against that run")
    mode.add_argument("--side-by-side", action="store_true",
                        help="each run of a variant at the same time as a plain run of its own (plain-function's "
                             "for the function variants where it is named), each sweep pinned to a CPU of its own "
                             "(swapped every round), each ratio against that run")
    parser.add_argument("--first-round", type=int, default=1, choices=(1, 2),
                        help="--side-by-side: the round to start at (2: each variant on the CPU of an even round), "
                             "to run one missing round alone")
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)  # (--side-by-side's sweeps)
    parser.add_argument("--callbacks", default=",".join(CALLBACKS),
                        help=f"the +callbacks variants' callbacks, some of {CALLBACKS} (default: all)")
    parser.add_argument("--print-peak-rss", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--keep", metavar="DIR", help="keep the experiments: make them in DIR, not a temporary one")
    parser.add_argument("--storage", choices=("local", "s3"), default="local",
                        help="s3: also run the readers on the last experiment uploaded to moto's S3 server, counting "
                             "their requests (benchmarks/s3_readers.py)")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    args.callbacks_chosen = [c for c in args.callbacks.split(",") if c]
    if sorted(set(variants) - set(VARIANTS)) or args.repeats < 1 or args.trials < 1:
        parser.error(f"--variants from {VARIANTS}, --repeats and --trials >= 1")
    if set(args.callbacks_chosen) - set(CALLBACKS):
        parser.error(f"--callbacks: some of {','.join(CALLBACKS)} (comma-separated), got {args.callbacks!r}")
    if args.driver_memory:
        return _driver_memory(args, variants)
    if args.paired:
        return _paired(args, variants)
    if args.side_by_side:
        return _side_by_side(args, variants)
    if args.fresh:
        return _fresh(args, variants)

    import ray
    import ray.cloudpickle

    import pbt

    ray.cloudpickle.register_pickle_by_value(pbt)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    root = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="tunekit-many-trials-")
    os.makedirs(root, exist_ok=True)
    phases_dir = os.path.join(root, "phases")
    os.makedirs(phases_dir, exist_ok=True)
    os.environ[PHASES_ENV] = phases_dir
    from tunekit._ray import quiet_tune_banner

    quiet_tune_banner()
    if args.cpu is not None:  # (Ray's processes, started below, inherit it)
        try:
            os.sched_setaffinity(0, {args.cpu})
        except OSError as exc:
            parser.error(f"--cpu {args.cpu}: not a CPU this process may use ({exc.strerror})")
    cpus = len(os.sched_getaffinity(0))
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    walls: dict[str, float] = {}
    every: dict[str, list[float]] = {v: [] for v in variants}
    logs: dict[str, dict[str, list[float]]] = {}
    machine_before = _machine_cpu(args.cpu)
    try:
        for repeat in range(args.repeats):
            for variant in variants:
                name = f"{variant.replace('+', '_')}-{repeat}"
                wall, phases = _sweep(root, name, variant, trials=args.trials, iterations=args.iterations,
                                      phases_dir=phases_dir, scheduler=args.scheduler,
                                      callback_names=tuple(args.callbacks_chosen))
                every[variant].append(wall)
                print(f"  {variant:16s} run {repeat + 1}: {wall:7.1f} s, {workers_trained(phases)}", flush=True)
                if wall < walls.get(variant, float("inf")):
                    walls[variant], logs[variant] = wall, phases
    finally:
        machine_after = _machine_cpu(args.cpu)
        ray.shutdown()
    if args.print_peak_rss:
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        print(f"peak-rss-kib {usage.ru_maxrss}")
        print(f"cpu-s {usage.ru_utime + usage.ru_stime:.1f}")
        print(f"machine-s {machine_after[0] - machine_before[0]:.2f} {machine_after[1] - machine_before[1]:.2f}")
        print(f"wall-s {every[variants[0]][0]}")
        print(f"workers {workers_trained(logs[variants[0]])}")
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        return 0
    print(f"\n{args.trials} trials x {args.iterations} iterations, Linear(16, 1), checkpoint every 2 and at end, "
          f"reuse_actors=True, {args.scheduler}, {cpus} CPUs; each run against plain's run of the same round")
    plain = every.get("plain")
    for variant in variants:
        runs = ", ".join(f"{w:.1f}" for w in every[variant])
        ratios = ", ".join(f"{w / p:.2f}x" for w, p in zip(every[variant], plain)) if plain else ""
        print(f"  {variant:16s} runs {runs} s" + (f"  -> {ratios} plain (worst {max(w / p for w, p in zip(every[variant], plain)):.2f}x)" if plain else ""))
    print("\nper trial, from the trials' own timings (ms per trial: count x median):")
    header = "  phase               " + "".join(f"{v:>18s}" for v in variants)
    print(header)
    for phase in PHASES:
        if not any(logs[v].get(phase) for v in variants):
            continue
        cells = []
        for v in variants:
            times = logs[v].get(phase, [])
            cells.append(f"{sum(times) / args.trials:9.2f} ({len(times) / args.trials:.2f}x)")
        print(f"  {phase:20s}" + "".join(f"{c:>18s}" for c in cells))
    for v in variants:
        spent = worker_time_ms(logs[v]) / 1e3
        print(f"  {v}: workers spent {spent:.1f} s in these calls over {cpus} CPUs; the rest of {walls[v]:.1f} s "
              f"is Ray's (scheduling, the driver, callbacks); {workers_trained(logs[v])}")
    if "class" in variants:
        experiment = os.path.join(root, f"class-{args.repeats - 1}")
        print(f"\nreaders on the class experiment ({args.trials} trials), best of 3:")
        for command in (["status", experiment], ["verify", experiment],
                        ["report", experiment, "--metric", "loss", "--mode", "min",
                         "--output", os.path.join(root, "report")]):
            print(f"  tunekit {command[0]:8s} {_time_command(command)}")
    if args.storage == "s3":
        from s3_readers import measure

        measure(os.path.join(root, f"{variants[-1].replace('+', '_')}-{args.repeats - 1}"))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
