"""Benchmark: ``tunekit check``'s wall time against 3N iterations of the same trainable, in the same run.

The anchor runs, in this process and one after another, what the check runs
in its child processes: N iterations (A), N again (B), and K iterations,
a save, a restore into a fresh trainable and N-K more (C), without any
comparison or fingerprints. The check adds four process starts (three of
them side by side), the fingerprints and the comparison.

Usage::

    python benchmarks/check.py                       # DigitsTrainable, N=4, best of 3
    python benchmarks/check.py --iterations 8 --steps 200 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from tunekit import _ray  # noqa: E402
from tunekit.commands.check import check_resume  # noqa: E402
from tunekit.trainables import DigitsTrainable  # noqa: E402


def anchor(config: dict, n: int, k: int) -> float:
    """3N iterations of the trainable, as the check's runs do them, in this process."""
    start, here = time.perf_counter(), os.getcwd()  # (Ray's trainables change into their working directory)
    with tempfile.TemporaryDirectory() as work:
        for name, iterations in (("a", n), ("b", n), ("c1", k)):
            t = DigitsTrainable(config=config, storage=_ray.offline_storage(work, name))
            for _ in range(iterations):
                t.train()
            saved = t.save()
            t.stop()
        t = DigitsTrainable(config=config, storage=_ray.offline_storage(work, "c2"))
        t.restore(saved)
        for _ in range(n - k):
            t.train()
        t.save()
        t.stop()
        os.chdir(here)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--steps", type=int, default=50, help="SGD steps per iteration")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    config = {"hidden_size": 64, "steps_per_iteration": args.steps, "seed": 1}
    k = args.iterations // 2
    anchor(config, 2, 1)  # warm: the dataset and torch's first calls, as a user's second run has them
    plain, checks = [], []
    for repeat in range(args.repeats):
        plain.append(anchor(config, args.iterations, k))
        start = time.perf_counter()
        report = check_resume("tunekit.trainables:DigitsTrainable", config, iterations=args.iterations, at=k)
        checks.append(time.perf_counter() - start)
        assert report.passed, report.lines()
        print(f"run {repeat + 1}: 3N iterations in-process {plain[-1]:.2f} s, tunekit check {checks[-1]:.2f} s",
              flush=True)
    print(f"\nbest of {args.repeats}: anchor {min(plain):.2f} s, check {min(checks):.2f} s: "
          f"{min(checks) / min(plain):.2f}x (N={args.iterations}, K={k}, {args.steps} steps per iteration)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
