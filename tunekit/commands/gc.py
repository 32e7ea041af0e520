"""``tunekit gc``: the plan of what an experiment no longer needs printed, deleted with ``--yes``.
"""

from __future__ import annotations

import argparse

__all__ = ["gc_command"]


def gc_command(args: argparse.Namespace) -> int:
    """Run ``tunekit gc`` with its parsed arguments; return the exit code."""
    from tunekit.experiment.gc import delete_planned, plan_gc
    from tunekit.storage._location import storage_errors

    with storage_errors("read", args.experiment):  # (an unreachable storage: one line, not a traceback)
        plan = plan_gc(args.experiment, experiment_best=args.experiment_best, trial_best=args.trial_best,
                       trial_latest=args.trial_latest, metric=args.metric, mode=args.mode, leftovers=args.leftovers,
                       force=args.force, everything=args.all)
    print("\n".join(plan.lines()))
    if not args.yes:
        print("dry run: nothing deleted; run again with --yes to delete exactly this")
        return 0
    freed = delete_planned(plan)
    print(f"deleted {len(plan.deletions)} directories, {freed} bytes"
          + (f"; aborted {len(plan.uploads)} interrupted multipart upload(s)" if plan.uploads else ""))
    return 0
