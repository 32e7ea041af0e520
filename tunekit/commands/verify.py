"""``tunekit verify``: every checkpoint of an experiment (or one checkpoint) against its manifest, printed.
"""

from __future__ import annotations

import argparse
import json

__all__ = ["verify_command"]


def verify_command(args: argparse.Namespace) -> int:
    """Run ``tunekit verify`` with its parsed arguments; return the exit code."""
    from tunekit.experiment.verify import CheckpointCheck, checkpoint_at, open_for_verify, verify_one, verify_opened

    opened = open_for_verify(args.experiment, full=args.full)  # (lists nothing yet)
    checkpoint = checkpoint_at(*opened[:2])  # (remote: the experiment's one recursive listing answers it)
    if checkpoint is not None:  # one checkpoint, not an experiment: its verdict alone
        status, problems = verify_one(checkpoint)
        if args.json:
            print(json.dumps({"checkpoint": args.experiment, "ok": status in ("good", "unverified"),
                              "status": status, "problems": problems}, indent=1))
        else:
            print(f"{args.experiment}: {status}" + (f": {'; '.join(problems)}" if problems else ""))
        return 0 if status in ("good", "unverified") else 1

    width = {"trial": 0}

    def show(check: CheckpointCheck) -> None:
        if args.json:
            return
        if not width["trial"]:
            print(f"verifying {args.experiment}", flush=True)
        width["trial"] = max(width["trial"], len(check.trial))
        iteration = "-" if check.iteration is None else str(check.iteration)
        line = f"{check.trial:<{width['trial']}}  {check.checkpoint}  iter {iteration:>5}  {check.status}"
        if check.problems and check.status != "good":
            line += f": {'; '.join(check.problems)}"
        print(line, flush=True)

    result = verify_opened(*opened, on_check=show)
    if args.json:
        payload = {
            "experiment": result.location,
            "ok": result.ok,
            "hashed": result.hashed,
            "counts": result.counts(),
            "checkpoints": [c.as_dict() for c in result.checks],
            "problems": list(result.problems),
        }
        print(json.dumps(payload, indent=1))
    else:
        print(result.summary())
    return 0 if result.ok else 1
