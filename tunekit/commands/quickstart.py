"""``tunekit quickstart``: a small PBT sweep of the reference trainables on a Ray of its own.
"""

from __future__ import annotations

import argparse

__all__ = ["quickstart_command"]


def quickstart_command(args: argparse.Namespace) -> int:
    """Run ``tunekit quickstart`` with its parsed arguments; return the exit code."""
    # The quickstart is an example sweep of the reference trainables; it is the
    # one place where tunekit reaches into `trainables`, lazily.
    from tunekit.trainables.quickstart import run_quickstart

    summary = run_quickstart(
        num_samples=args.num_samples, max_iterations=args.max_iterations, storage_path=args.storage_path,
        name=args.name, cpus=args.cpus, gpus_per_trial=args.gpus_per_trial, address=args.address,
        shared_storage=args.shared_storage,
    )
    return 0 if all(row["state"] == "TERMINATED" for row in summary.rows) else 1  # ERROR or INTERRUPTED: 1
