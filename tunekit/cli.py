"""The ``tunekit`` command: a parser over the verbs of :mod:`tunekit.commands`, one module each. Exit codes: 0 ok, 1 failure, 2 bad usage or input."""

from __future__ import annotations

import argparse
import gc as pygc
import importlib
import os
import sys
from typing import Any, Callable, NoReturn, Sequence

from tunekit import _env
from tunekit._checks import UsageError
from tunekit.errors import TunekitError

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


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


def _add_verify(sub: Any) -> None:
    verify = sub.add_parser(
        "verify",
        help="check every checkpoint of an experiment against its manifest",
        description=(
            "Check every checkpoint of every trial of experiment EXP (a local path or "
            "a URI such as s3://bucket/prefix/exp?endpoint_override=...) and report "
            "good / incomplete / corrupt per checkpoint (unsupported: written by a newer "
            "tunekit); EXP may also be one checkpoint directory, checked alone. Exit 0 if "
            "all are good, 1 if any is bad or unsupported, 2 if EXP is not an experiment. "
            "Each file's size is checked against the manifest; on a local disk each file's "
            "hash too (--sizes: sizes alone), on remote storage sizes from one listing of "
            "the experiment (--full: every file's hash too, read 16 at a time)."
        ),
    )
    verify.add_argument("experiment", metavar="EXP", help="experiment directory or URI (or one checkpoint's)")
    verify.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    depth = verify.add_mutually_exclusive_group()
    depth.add_argument("--full", action="store_true", default=None,
                       help="hash every file (the default on a local disk)")
    depth.add_argument("--sizes", dest="full", action="store_false", default=None,
                       help="check sizes alone, no file's bytes read (the default on remote storage)")
    verify.set_defaults(verb="verify")


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
            "Run a Population Based Training sweep of tunekit.trainables.DigitsTrainable "
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
    quick.add_argument("--address", default=None, help="Ray cluster to run on, host:port of its head (default: $RAY_ADDRESS, else a local Ray of its own)")
    quick.add_argument("--shared-storage", action="store_true", help="--storage-path is a shared mount on every node of the cluster")
    quick.set_defaults(verb="quickstart")
    _add_verify(sub)

    status = sub.add_parser(
        "status",
        help="show an experiment's trials, states, results and checkpoints",
        description=(
            "Read experiment EXP (a Ray Tune experiment directory, local or a URI) "
            "without Ray and without unpickling anything, and show its trials: id, "
            "status, iterations, configs that vary, checkpoints, errors."
        ),
    )
    status.add_argument("experiment", metavar="EXP", help="experiment directory or URI")
    status.add_argument("--json", action="store_true", help="print JSON for scripts")
    status.add_argument("--all", action="store_true",
                        help="a row for every trial (of more than 50: only those worth a look by default)")
    status.add_argument("--metric", default=None, help="metric to show and pick the best trial by")
    status.add_argument("--mode", choices=("max", "min"), default=None, help="whether --metric is better high or low")
    status.set_defaults(verb="status")

    resume = sub.add_parser(
        "resume",
        help="resume an interrupted experiment with Tuner.restore and run it to the end",
        description=(
            "Restore experiment EXP with Tuner.restore (unfinished trials continue from "
            "their last checkpoint) and run it to completion. The trainable is found "
            "from what the experiment recorded, or given with --trainable."
        ),
    )
    resume.add_argument("experiment", metavar="EXP", help="experiment directory or URI")
    errored = resume.add_mutually_exclusive_group()
    errored.add_argument("--resume-errored", action="store_true", help="resume errored trials from their last checkpoint")
    errored.add_argument("--restart-errored", action="store_true", help="restart errored trials from scratch")
    resume.add_argument("--extend", type=_int_at_least(1), default=None, metavar="ITERATIONS",
                        help="continue a finished experiment's trials from their newest checkpoints to this "
                        "training_iteration, into a new experiment EXP-to-ITERATIONS beside it")
    resume.add_argument("--trainable", default=None, metavar="MODULE:ATTR", help="the trainable, e.g. tunekit.trainables:DigitsTrainable")
    resume.add_argument("--cpus", type=_int_at_least(1), default=None, help="CPUs of the local Ray (default: all)")
    resume.add_argument("--address", default=None,
                        help="Ray cluster to run on, host:port of its head (default: $RAY_ADDRESS, else a local Ray of its own)")
    resume.set_defaults(verb="resume")

    report = sub.add_parser(
        "report",
        help="write an HTML report with plots of an experiment",
        description=(
            "Write a self-contained HTML report of experiment EXP (local or a URI): "
            "trials table, learning curves, hyperparameters against the metric, PBT "
            "lineage and schedules, the best checkpoint, and how to open TensorBoard."
        ),
    )
    report.add_argument("experiment", metavar="EXP", help="experiment directory or URI")
    report.add_argument("--output", default=None, help="output directory (default EXP/tunekit_report)")
    report.add_argument("--metric", default=None, help="metric that ranks trials (default: guessed)")
    report.add_argument("--mode", choices=("max", "min"), default=None, help="whether --metric is better high or low")
    report.set_defaults(verb="report")

    gc = sub.add_parser("gc", help="delete checkpoints an experiment no longer needs (a preview unless --yes)",
                        description="Keep the union of the selections (and the newest good checkpoint of every "
                        "unfinished trial: what resume needs); print what else would go, per trial, with bytes. "
                        "Deletes only with --yes; refuses an experiment whose driver still runs unless --force.")
    gc.add_argument("experiment", metavar="EXP", help="experiment directory or URI")
    for flag, what in (("--experiment-best", "the N best checkpoints of the experiment"),
                       ("--trial-best", "the N best checkpoints of each trial"),
                       ("--trial-latest", "the N newest checkpoints of each trial")):
        gc.add_argument(flag, type=_int_at_least(0), default=None, metavar="N", help=f"keep {what}")
    gc.add_argument("--metric", default=None, help="the metric that ranks checkpoints (for the best selections)")
    gc.add_argument("--mode", choices=("max", "min"), default=None, help="whether --metric is better high or low")
    gc.add_argument("--leftovers", action="store_true", help="also delete interrupted writes and stale kept copies")
    gc.add_argument("--yes", action="store_true", help="delete (without it: print what would be deleted)")
    gc.add_argument("--force", action="store_true", help="even if the experiment's driver seems to be running")
    gc.add_argument("--all", action="store_true",
                    help="allow a selection that deletes every checkpoint of a trial (refused without it)")
    gc.set_defaults(verb="gc")
    from tunekit.commands.check import add_parser as add_check  # (imports neither Ray nor torch)

    add_check(sub, _int_at_least)
    return parser


#: Commands that read an experiment: Python's cyclic collector is off while they run. What they read lives until
#: they end, and each collection would scan all of it (at 10,000 trials, a fifth of ``status``).
_READERS = frozenset({"status", "verify", "report"})


def _command(verb: str) -> Callable[[argparse.Namespace], int]:
    """The function that runs ``verb``: ``tunekit.commands.<verb>.<verb>_command``, imported when it runs."""
    return getattr(importlib.import_module(f"tunekit.commands.{verb}"), f"{verb}_command")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tunekit command line; return the exit code."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if not getattr(args, "func", None) and not getattr(args, "verb", None):
        parser.print_help(sys.stderr)
        return 2
    collecting = pygc.isenabled()
    if getattr(args, "verb", None) in _READERS:
        pygc.disable()
    try:
        _env.check_all()
        return int((args.func if getattr(args, "func", None) else _command(args.verb))(args))
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except TunekitError as exc:
        print(f"tunekit {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tunekit {args.command}: interrupted", file=sys.stderr)
        return 1
    except BrokenPipeError:  # (the output's reader went first: `tunekit status EXP | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (nothing more to write at exit)
        return 1
    finally:
        if collecting:  # (a caller in the same process, a test say, gets its collector back)
            pygc.enable()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
