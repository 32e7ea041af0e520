"""``tunekit status``: an experiment's trials, states, results and checkpoints, printed or as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

from tunekit._checks import UsageError
from tunekit.analysis._status_text import print_snapshot

__all__ = ["status_command"]


def status_command(args: argparse.Namespace) -> int:
    """Run ``tunekit status`` with its parsed arguments; return the exit code."""
    from tunekit.experiment.snapshot import check_storage, read_experiment

    if bool(args.metric) != bool(args.mode):
        raise UsageError("tunekit status: --metric and --mode go together")
    snapshot = read_experiment(args.experiment)
    if args.metric:
        snapshot.check_metric("--metric", args.metric)
    sizes = check_storage(snapshot)  # (first: its damage goes into what is shown)
    if args.json:
        best = snapshot.best_checkpoint(args.metric, args.mode) if args.metric else None
        payload = snapshot.as_dict()
        for trial in payload["trials"]:
            trial["checkpoint_bytes"] = sizes.get(trial["trial_id"], 0)
        if args.metric:
            payload.update(best_trial=best.trial_id if best else None, best_checkpoint=best.uri if best else None,
                           best_value=best.value if best else None, best_skipped=list(best.skipped) if best else [])
        print(json.dumps(payload, indent=1, default=str))
    else:
        print_snapshot(snapshot, args.metric, args.mode, sizes, everything=args.all)
    if snapshot.damaged:
        print(f"tunekit status: {snapshot.location}: damaged: {'; '.join(snapshot.problems)}", file=sys.stderr)
        return 2
    if errored := [t.trial_id for t in snapshot.trials if t.status == "ERROR"]:
        print(f"tunekit status: {snapshot.location}: {len(errored)} trial(s) in ERROR: {', '.join(errored)} (`tunekit "
              f"resume {snapshot.location} --resume-errored` retries them)", file=sys.stderr)
    return 1 if errored else 0
