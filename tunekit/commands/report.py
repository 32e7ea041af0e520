"""``tunekit report``: the HTML report of an experiment written, and what it found printed.
"""

from __future__ import annotations

import argparse
import sys

from tunekit._checks import UsageError

__all__ = ["report_command"]


def report_command(args: argparse.Namespace) -> int:
    """Run ``tunekit report`` with its parsed arguments; return the exit code."""
    from tunekit.analysis.report import write_report

    if bool(args.metric) != bool(args.mode):
        raise UsageError("tunekit report: --metric and --mode go together")
    print(f"reading {args.experiment}", file=sys.stderr, flush=True)
    summary = write_report(args.experiment, output=args.output, metric=args.metric, mode=args.mode)
    print(f"report: {summary.html}")
    print(f"plots: {', '.join(p.name for p in summary.images)}")
    best = summary.best
    if best is not None:
        for line in best.skipped:
            print(f"note: passed over as best, it does not verify: {line}")
        value = "-" if best.value is None else f"{best.value:.4g}"
        print(f"best trial for {summary.metric} ({summary.mode}): {best.trial_id} {summary.metric}={value}")
        print(f"best checkpoint: {best.uri or 'none that verifies'}")
    if summary.problems:
        print(f"tunekit report: {args.experiment}: damaged: {'; '.join(summary.problems)}", file=sys.stderr)
        return 2
    return 0
