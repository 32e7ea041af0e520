"""The ``tunekit`` command: a thin parser over plain functions.

Exit codes: 0 ok, 1 failure, 2 bad usage or bad input (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, NoReturn, Sequence

from tunekit.errors import TunekitError

__all__ = ["main"]


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: {message}")


def _int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be >= {low}")
        return value

    return parse


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return value


def _cmd_quickstart(args: argparse.Namespace) -> int:
    # The quickstart is an example sweep of the reference trainables; it is the
    # one place where tunekit reaches into `trainables`, lazily.
    from trainables.quickstart import run_quickstart

    summary = run_quickstart(
        num_samples=args.num_samples,
        max_iterations=args.max_iterations,
        storage_path=args.storage_path,
        name=args.name,
        cpus=args.cpus,
        gpus_per_trial=args.gpus_per_trial,
    )
    return 0 if all(row["state"] != "ERROR" for row in summary.rows) else 1


def _cmd_verify(args: argparse.Namespace) -> int:
    from tunekit.verify import CheckpointCheck, verify_experiment

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

    result = verify_experiment(args.experiment, on_check=show)
    if args.json:
        payload = {
            "experiment": result.location,
            "ok": result.ok,
            "counts": result.counts(),
            "checkpoints": [c.as_dict() for c in result.checks],
        }
        print(json.dumps(payload, indent=1))
    else:
        print(result.summary())
    return 0 if result.ok else 1


def _build_parser() -> _Parser:
    parser = _Parser(
        prog="tunekit",
        description="Checkpoint-complete hyperparameter experiments on Ray Tune.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    quick = sub.add_parser(
        "quickstart",
        help="run a small PBT sweep of the digits MLP on a local Ray",
        description=(
            "Run a Population Based Training sweep of trainables.DigitsTrainable "
            "(scikit-learn's 8x8 digits) on a local Ray, then print the trials, the "
            "best trial and its best checkpoint."
        ),
    )
    quick.add_argument("--num-samples", type=_int_at_least(1), default=4, help="number of trials (default 4)")
    quick.add_argument("--max-iterations", type=_int_at_least(1), default=12, help="iterations (epochs) per trial (default 12)")
    quick.add_argument("--storage-path", default=None, help="where results go (default ~/tunekit_results)")
    quick.add_argument("--name", default=None, help="experiment name (default quickstart_<date>_<time>)")
    quick.add_argument("--cpus", type=_int_at_least(1), default=None, help="CPUs of the local Ray (default: all)")
    quick.add_argument("--gpus-per-trial", type=_non_negative_float, default=0.0, help="GPUs per trial, fractions allowed (default 0)")
    quick.set_defaults(func=_cmd_quickstart)
    verify = sub.add_parser(
        "verify",
        help="check every checkpoint of an experiment against its manifest",
        description=(
            "Check every checkpoint of every trial of experiment EXP (a local path or "
            "a URI such as s3://bucket/prefix/exp?endpoint_override=...) and report "
            "good / incomplete / corrupt per checkpoint. Exit 0 if all are good, 1 if "
            "any is bad, 2 if EXP is not an experiment."
        ),
    )
    verify.add_argument("experiment", metavar="EXP", help="experiment directory or URI")
    verify.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    verify.set_defaults(func=_cmd_verify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tunekit command line; return the exit code."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except _UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args))
    except TunekitError as exc:
        print(f"tunekit {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tunekit {args.command}: interrupted", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
