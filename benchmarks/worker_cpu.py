"""Benchmark: a short trial's CPU in its worker, tunekit's class trainable against the plain one, without Ray.

The work of one trial of ``many_trials.py`` (a reset, 4 iterations of
``Linear(16, 1)``, a checkpoint every 2) repeated in one process, each
trainable built as a Tune worker builds it but with no Ray around it: what
the trainable itself costs per trial, in CPU (every thread, the kernel's
share of fsync included) and wall time. On 2 CPUs a sweep's workers and
its driver share the cores, so a millisecond of worker CPU per trial is
2 s of a 2,000-trial sweep the driver waits for. Without Ray tunekit writes
each checkpoint in place, fsynced (``--no-fsync``: what the fsyncs and syncfs cost).

``--storage``: each trial gets a ``StorageContext`` as Tune hands its worker
one (``reset(config, storage=...)``), and ``save()`` is called without a
directory, so each save goes the way it goes in a sweep: plain's through
Ray's temporary directory and its copy into the trial's directory, tunekit's
(the state here is under ``background_saves_min_bytes``) written before the
save returns: a staging directory renamed into place, one ``syncfs`` a second
on a helper thread (``--two-phase``: the two-phase path of a larger state
instead: index claim, announcement, kept copy, write and fsyncs on helper threads).

Usage::

    python benchmarks/worker_cpu.py                       # 400 trials, 3 rounds
    python benchmarks/worker_cpu.py --trials 1000 --rounds 5 --no-fsync
    python benchmarks/worker_cpu.py --storage             # the save path of a Tune sweep
    python benchmarks/worker_cpu.py --storage --two-phase # ... of a sweep whose states are large
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import torch  # noqa: E402

import many_trials  # noqa: E402


_CWD = os.getcwd()


def _per_trial(variant: str, trials: int, root: str, storage: bool = False) -> tuple[float, float]:
    """CPU and wall milliseconds per trial of ``variant`` (after 20 warm-up iterations)."""
    from tunekit import _ray

    cls = {"plain": many_trials.PlainShort, "class": many_trials.TunekitShort}[variant]

    def context(trial: int) -> object | None:  # a trial's StorageContext, as Tune hands one to its worker
        return _ray.offline_storage(root, f"{variant}_{trial:05d}") if storage else None

    trainable = cls(config={"lr": 0.01, "seed": 1}, storage=context(-1))

    def save(trial: int, index: int) -> None:  # in place: as Tune names them, checkpoint_N in the trial's directory
        if storage:
            trainable.save()
            return
        path = os.path.join(root, f"{variant}_{trial:05d}", f"checkpoint_{index:06d}")
        os.makedirs(path)
        trainable.save(path)

    for index in range(20):
        trainable.train()
        save(-1, index)
    cpu, wall = time.process_time(), time.perf_counter()
    for trial in range(trials):
        trainable.reset({"lr": 0.02, "seed": trial}, storage=context(trial))
        for iteration in range(4):
            trainable.train()
            if iteration % 2 == 1:
                save(trial, iteration // 2)
    trainable.stop()
    os.chdir(_CWD)  # (a Trainable with storage changes into its trial's directory, which the round removes)
    return (time.process_time() - cpu) * 1e3 / trials, (time.perf_counter() - wall) * 1e3 / trials


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-fsync", action="store_true", help="fsync does nothing (what the fsyncs cost)")
    parser.add_argument("--storage", action="store_true",
                        help="each trial with a StorageContext, save() without a directory: a sweep's save path")
    parser.add_argument("--two-phase", action="store_true",
                        help="with --storage: tunekit's saves take the two-phase path (background_saves_min_bytes=0)")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.rounds < 1:
        parser.error("--trials and --rounds: at least 1")
    if args.two_phase and not args.storage:
        parser.error("--two-phase: only with --storage (without it each save is written into a given directory)")
    if args.no_fsync:
        import tunekit.checkpoint._durability

        os.fsync = lambda fd: None  # type: ignore[assignment]
        tunekit.checkpoint._durability._SYNCFS = lambda fd: 0  # (the small checkpoints' one syncfs a second)
    if args.two_phase:
        many_trials.TunekitShort.background_saves_min_bytes = 0
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    print(f"{args.trials} trials x 4 iterations, a checkpoint every 2, one process, no Ray"
          + ((", each trial with Tune's storage, " + ("two-phase saves" if args.two_phase else "small saves"))
             if args.storage else ", saved in place")
          + (", fsync off" if args.no_fsync else ""))
    for round_ in range(1, args.rounds + 1):
        root = tempfile.mkdtemp(prefix="tunekit-worker-cpu-")
        try:
            plain = _per_trial("plain", args.trials, root, args.storage)
            tunekit = _per_trial("class", args.trials, root, args.storage)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(f"  round {round_}: plain {plain[0]:.2f} ms CPU ({plain[1]:.2f} ms wall) per trial, class "
              f"{tunekit[0]:.2f} ms CPU ({tunekit[1]:.2f} ms wall) = {tunekit[0] / plain[0]:.2f}x CPU", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
