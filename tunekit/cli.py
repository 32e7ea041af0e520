"""The ``tunekit`` command: a thin parser over plain functions. Exit codes: 0 ok, 1 failure, 2 bad usage or input."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, NoReturn, Sequence

from tunekit import _env
from tunekit._status_text import print_snapshot
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
    from tunekit.trainables.quickstart import run_quickstart

    summary = run_quickstart(
        num_samples=args.num_samples, max_iterations=args.max_iterations, storage_path=args.storage_path,
        name=args.name, cpus=args.cpus, gpus_per_trial=args.gpus_per_trial, address=args.address,
        shared_storage=args.shared_storage,
    )
    return 0 if all(row["state"] == "TERMINATED" for row in summary.rows) else 1  # ERROR or INTERRUPTED: 1


def _cmd_verify(args: argparse.Namespace) -> int:
    from tunekit.verify import CheckpointCheck, checkpoint_at, verify_experiment, verify_one

    checkpoint = checkpoint_at(args.experiment)
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

    result = verify_experiment(args.experiment, on_check=show, full=args.full)
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


def _cmd_status(args: argparse.Namespace) -> int:
    from tunekit.snapshot import check_storage, read_experiment

    if bool(args.metric) != bool(args.mode):
        raise _UsageError("tunekit status: --metric and --mode go together")
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


def _cmd_resume(args: argparse.Namespace) -> int:
    from tunekit.resume import extend_experiment, resume_experiment
    from tunekit.snapshot import format_counts

    if args.extend is not None:
        if args.resume_errored or args.restart_errored:
            raise _UsageError("tunekit resume: --extend continues finished trials; it takes no --resume/--restart-errored")
        summary = extend_experiment(args.experiment, args.extend, trainable=args.trainable, cpus=args.cpus,
                                    address=args.address)
        print_snapshot(summary.after, None, None)
        print(f"extended into {summary.experiment}: {format_counts(summary.after.counts())}")
        return 0 if summary.ok else 1

    summary = resume_experiment(
        args.experiment,
        trainable=args.trainable,
        resume_errored=args.resume_errored,
        restart_errored=args.restart_errored,
        cpus=args.cpus,
        address=args.address,
    )
    if not summary.ran:
        return 0
    print_snapshot(summary.after, None, None)
    before, after = format_counts(summary.before), format_counts(summary.after.counts())
    where = f" into {summary.into}" if summary.into else ""
    print(f"resumed {summary.experiment}{where}: before {before}; now {after}")
    return 0 if summary.ok else 1


def _cmd_report(args: argparse.Namespace) -> int:
    from tunekit.report import write_report

    if bool(args.metric) != bool(args.mode):
        raise _UsageError("tunekit report: --metric and --mode go together")
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


def _cmd_gc(args: argparse.Namespace) -> int:
    from tunekit.gc import delete_planned, plan_gc
    from tunekit.storage import storage_errors

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
    verify.set_defaults(func=_cmd_verify)


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
    quick.set_defaults(func=_cmd_quickstart)
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
    status.set_defaults(func=_cmd_status)

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
    resume.set_defaults(func=_cmd_resume)

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
    report.set_defaults(func=_cmd_report)

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
    gc.set_defaults(func=_cmd_gc)
    from tunekit.check import add_parser as add_check  # (imports neither Ray nor torch)

    add_check(sub, _int_at_least)
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
        _env.check_all()
        return int(args.func(args))
    except _UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except TunekitError as exc:
        print(f"tunekit {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tunekit {args.command}: interrupted", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
