"""Benchmark: tunekit's readers on an existing local experiment, each run shown.

``tunekit status``, ``verify --sizes`` (every file's size against its manifest), ``verify`` (locally: every
file's size and hash) and ``report``, each in a fresh process (what a user waits for, imports included); the
first ``status`` reads whatever the experiment's index (``.tunekit-index.json``) lacks. Then, in one process
and round by round, ``load_results`` from the Parquet results and from ``result.json`` against Ray's
``ExperimentAnalysis(EXP).trial_dataframes`` of the same round, with every row counted: tunekit's rows must
equal Ray's. Made for the experiments ``many_trials.py --keep DIR`` leaves::

    python benchmarks/readers.py /tmp/k10/fifo/r0-class+callbacks/class+callbacks/class_callbacks-0 --runs 3
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def _command(args: list[str]) -> tuple[float, int, str]:
    """Wall time of ``tunekit ARGS`` in a fresh process, its exit status and its output's last line."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tunekit.cli", *args], capture_output=True, text=True, check=False)
    last = (done.stdout.strip().splitlines() or done.stderr.strip().splitlines() or [""])[-1]
    return time.perf_counter() - t0, done.returncode, last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--metric", default="loss")
    parser.add_argument("--mode", default="min", choices=("min", "max"))
    args = parser.parse_args(argv)
    exp = os.path.abspath(args.experiment)
    out = tempfile.mkdtemp(prefix="tunekit-readers-")
    commands = {"status": ["status", exp], "verify --sizes": ["verify", exp, "--sizes"], "verify": ["verify", exp],
                "report": ["report", exp, "--metric", args.metric, "--mode", args.mode, "--output", out]}
    print(f"{exp}: {sum(len(files) for _, _, files in os.walk(exp))} files", flush=True)
    for name, command in commands.items():
        runs = [_command(command) for _ in range(args.runs)]
        print(f"  tunekit {name:14s} " + ", ".join(f"{t:.2f} s (exit {code})" for t, code, _ in runs)
              + f"; it said: {runs[-1][2][:110]}", flush=True)

    from load_results import _time  # (this directory's: gc before each reader, then one timed call)
    from ray.tune import ExperimentAnalysis

    from tunekit.analysis import load_results

    readers = {"parquet": lambda: load_results(exp, source="parquet"),
               "result.json": lambda: load_results(exp, source="json"),
               "ExperimentAnalysis": lambda: ExperimentAnalysis(exp).trial_dataframes}
    for fn in readers.values():  # a warm-up round, not timed (imports, the page cache)
        fn()
    for round_ in range(args.runs):
        times, rows = {}, {}
        for name, fn in readers.items():
            (times[name],), value = _time(fn, 1)
            rows[name] = sum(len(df) for df in value.values()) if isinstance(value, dict) else len(value)
        ray_s = times["ExperimentAnalysis"]
        print(f"  round {round_ + 1}: ExperimentAnalysis {ray_s:.2f} s ({rows['ExperimentAnalysis']} rows); "
              + "; ".join(f"load_results {n} {times[n]:.3f} s = {ray_s / times[n]:.1f}x ({rows[n]} rows)"
                          for n in ("parquet", "result.json")), flush=True)
        lost = {n: r for n, r in rows.items() if r != rows["ExperimentAnalysis"]}
        if lost:
            print(f"  rows differ from Ray's {rows['ExperimentAnalysis']}: {lost}")
            return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
