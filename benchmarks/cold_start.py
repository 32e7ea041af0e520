"""Cold start of the tunekit command line, in ms, next to `python -c pass`.

    python benchmarks/cold_start.py [EXP] [--runs 5]

Times fresh processes (best and median of --runs): `python -c pass`,
`python -c "import tunekit"`, `tunekit --help` and `tunekit status EXP`.
Without EXP it first runs a small `tunekit quickstart` (2 trials x 2
iterations) into a temporary directory and reads that. Each command also
reports whether it imported ray or torch (it must not).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_PROBE = (
    "import sys\n"
    "from tunekit.cli import main\n"
    "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as exc:\n    code = exc.code\n"
    "sys.stderr.write('HEAVY ' + ','.join(m for m in ('ray', 'torch') if m in sys.modules) + '\\n')\n"
)


def _time(argv: list[str], runs: int) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append((time.perf_counter() - t0) * 1000)
    return min(times), statistics.median(times)


def _heavy(args: list[str]) -> str:
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, check=True)
    line = next(x for x in done.stderr.splitlines() if x.startswith("HEAVY"))
    return line[len("HEAVY "):] or "neither"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", nargs="?", help="an experiment directory (default: run a small quickstart)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    tunekit = str(Path(sys.executable).with_name("tunekit"))
    with tempfile.TemporaryDirectory() as tmp:
        exp = args.experiment
        if exp is None:
            print("running a small quickstart to read ...", flush=True)
            subprocess.run(
                [tunekit, "quickstart", "--num-samples", "2", "--max-iterations", "2", "--cpus", "2",
                 "--storage-path", tmp, "--name", "qs"],
                check=True, capture_output=True,
            )
            exp = str(Path(tmp) / "qs")
        rows = [
            ("python -c pass", [sys.executable, "-c", "pass"], None),
            ("python -c 'import tunekit'", [sys.executable, "-c", "import tunekit"], None),
            ("tunekit --help", [tunekit, "--help"], ["--help"]),
            ("tunekit status EXP", [tunekit, "status", exp], ["status", exp]),
        ]
        base = None
        print(f"{'command':<28} {'best ms':>8} {'median ms':>10} {'x pass':>7}  imports")
        for label, argv, probe in rows:
            best, median = _time(argv, args.runs)
            base = base or best
            heavy = _heavy(probe) if probe else "-"
            print(f"{label:<28} {best:8.0f} {median:10.0f} {best / base:7.1f}  {heavy}")


if __name__ == "__main__":
    main()
