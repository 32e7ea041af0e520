"""Resume an interrupted experiment: find its trainable, ``Tuner.restore``, run to the end.

The trainable is found, in this order, from:

1. ``trainable="module:attr"`` given by the caller;
2. the ``trainable`` recorded in ``tunekit.json`` of the experiment's
   checkpoints (tunekit trainables record their ``module:qualname``);
3. the references in ``tuner.pkl`` whose name is the recorded
   ``trainable_name``, found by reading the pickle's opcodes (never loading it).

A function found this way that is not a Tune trainable class is wrapped with :func:`tunekit.function_trainable`
if it uses a :class:`~tunekit.FunctionSession` (tunekit records those), and handed to Tune as is otherwise.

When Ray's own files are torn (see :mod:`tunekit.experiment.record`): a damaged newest
``experiment_state-*.json`` is set aside for the newest whole one; a torn or
missing ``tuner.pkl`` is rebuilt from tunekit's record, then Ray restores as
usual; with no whole experiment state at all, or a torn search algorithm or
callback state (Ray would start the experiment over), every unfinished trial
goes on from its newest good checkpoint in a new experiment ``EXP-resumed`` beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import posixpath
import sys
from typing import Any, TextIO

import pyarrow.fs as pafs

from tunekit.checkpoint._manifest import NOT_WRITTEN
from tunekit.experiment._snapshot_model import INTERRUPTED
from tunekit.experiment._pickles import driver_state_problem
from tunekit.checkpoint._pins import is_pinned
from tunekit.checkpoint._trial_dir import damaged_name, link_tree
from tunekit.checkpoint._directory import read_metadata, verify_checkpoint
from tunekit._checks import UsageError
from tunekit.errors import ConfigError, ExperimentError
from tunekit.commands._connect import ray_for
from tunekit.experiment._lease import experiment_lease
from tunekit.checkpoint._uploads import abort_uploads, open_uploads
from tunekit.commands._find_trainable import alias_moved_packages, find_trainable, import_trainable
from tunekit.experiment.record import read_record
from tunekit.commands._recovery import (
    ResumeSummary, callbacks_from, has_tuner_pickle, newest_good, not_restored, parent_of, quiet, rebuild_tuner,
    run_beside, set_aside,
)
from tunekit.experiment.snapshot import (PBT_LOG, CheckpointSummary, ExperimentSnapshot, TrialSnapshot, format_counts,
                              read_experiment, registered_checkpoints)
from tunekit.checkpoint._layout import root_files
from tunekit.storage._location import Storage, resolve_storage

__all__ = [
    "ResumeSummary", "find_trainable", "import_trainable", "keep_pbt_log", "newest_good", "resume_command",
    "resume_experiment"
]


def resume_experiment(
    location: str | Storage,
    *,
    trainable: str | None = None,
    resume_errored: bool = False,
    restart_errored: bool = False,
    cpus: int | None = None,
    address: str | None = None,
    stream: TextIO | None = None,
) -> ResumeSummary:
    """Restore the experiment at ``location`` with ``Tuner.restore`` and run it to the end.

    Args:
        location: The experiment directory (path or URI).
        trainable: ``module:attr`` of the trainable (default: found, see module doc).
        resume_errored: Resume errored trials from their last checkpoint.
        restart_errored: Restart errored trials from scratch.
        cpus: CPUs of the local Ray started for it.
        address: A Ray cluster to run on (default ``$RAY_ADDRESS``, else a local Ray of its own).
        stream: Where progress goes (default stdout).

    Before anything starts it prints where each unfinished trial continues
    from: its newest checkpoint that verifies. A damaged checkpoint of such a
    trial is named, and a copy of it is kept beside it as
    ``.checkpoint_NNNNNN.damaged`` (Ray's ``num_to_keep`` may delete the
    original). An experiment whose trials all finished gets one line and
    nothing is started or written.

    Raises:
        ExperimentError: not an experiment, or its state cannot be read.
        ConfigError: conflicting options, or no trainable can be found.
    """
    out = stream or sys.stdout
    if resume_errored and restart_errored:
        raise ConfigError("resume: --resume-errored and --restart-errored exclude each other")
    experiment = resolve_storage(location)
    read_experiment(experiment, results=False)  # (not an experiment: said before any lease is written there)
    with experiment_lease(experiment, "resume"):
        if aborted := abort_uploads(experiment, open_uploads(experiment) or []):  # (nothing writes under the lease)
            print(f"aborted {aborted} interrupted multipart upload(s) a kill left in {experiment.uri}", file=out)
        return _resume(experiment, trainable=trainable, resume_errored=resume_errored,
                       restart_errored=restart_errored, cpus=cpus, address=address, out=out)


def _resume(experiment: Storage, *, trainable: str | None, resume_errored: bool, restart_errored: bool,
            cpus: int | None, address: str | None, out: TextIO) -> ResumeSummary:
    """:func:`resume_experiment` while it holds the experiment's lease."""
    before = read_experiment(experiment, keep_index=False)  # (a resume that refuses or finds nothing to do writes nothing)
    record, record_problem = read_record(experiment.filesystem, experiment.path)
    state_whole = before.state_file is not None and before.state_file not in before.damaged_state_files
    # (a torn search algorithm or callback state: Ray would drop the restore and start the experiment over)
    torn_driver_state = driver_state_problem(experiment, root_files(experiment)) if state_whole else None
    if not state_whole or torn_driver_state:
        if record is None:
            what = torn_driver_state or ("no experiment_state-*.json" if before.state_file is None
                                         else next(p for p in before.problems if p.startswith("experiment_state")))
            raise ExperimentError(f"{experiment.uri}: {what}, so Ray Tune cannot restore it, and {record_problem} "
                                  "to continue the trials from")
        return _resume_from_record(experiment, before, record, trainable=trainable, resume_errored=resume_errored,
                                   restart_errored=restart_errored, cpus=cpus, address=address, out=out,
                                   damage=torn_driver_state)
    counts = before.counts()
    summary = format_counts(counts)
    todo = [t for t in before.trials
            if t.status not in ("TERMINATED", "ERROR") or (t.status == "ERROR" and (resume_errored or restart_errored))]
    if not todo:
        if trainable:
            find_trainable(experiment, before, trainable)  # bad input is said even when there is nothing to do
        errored = counts.get("ERROR", 0)
        hint = ("--resume-errored or --restart-errored runs the errored ones again; " if errored else "") + \
            "`tunekit resume EXP --extend N` continues finished trials to iteration N"
        print(f"nothing to resume: {len(before.trials)} trials {summary}; {hint}", file=out, flush=True)
        return ResumeSummary(experiment.uri, "", counts, before, ran=False)
    obj, found = find_trainable(experiment, before, trainable, record)

    print(f"resuming {experiment.uri}: {len(before.trials)} trials ({summary})", file=out)
    print(f"trainable: {found}", file=out, flush=True)
    if before.damaged_state_files:
        kept = [set_aside(experiment, name) for name in before.damaged_state_files]
        print(f"{', '.join(before.damaged_state_files)} damaged (kept as {', '.join(kept)}): Ray resumes from "
              f"{before.state_file}, the newest whole experiment state", file=out, flush=True)
    torn = before.tuner_pickle_damage or (None if has_tuner_pickle(experiment) else "tuner.pkl is missing")
    if torn:
        print(rebuild_tuner(experiment, obj, record, record_problem, torn), file=out, flush=True)
    for trial in todo:
        print(_continues_from(before, trial, experiment, restart=restart_errored and trial.status == "ERROR",
                              record=record)[0], file=out, flush=True)
    alias_moved_packages(experiment)
    keep_pbt_log(experiment)

    from ray import tune

    with quiet(), ray_for("resume", address=address, cpus=cpus):
        tuner = tune.Tuner.restore(
            experiment.path,
            obj,
            resume_unfinished=True,
            resume_errored=resume_errored,
            restart_errored=restart_errored,
            storage_filesystem=experiment.filesystem,
        )
        tuner.fit()
    after = read_experiment(experiment)
    return ResumeSummary(experiment.uri, found, counts, after)


def _preserve(experiment: Storage, trial: TrialSnapshot, ckpt: CheckpointSummary) -> str:
    """Keep a damaged checkpoint out of Ray's retention: a copy as ``.checkpoint_N.damaged`` beside it."""
    trial_dir = experiment.join(trial.name)
    target = posixpath.join(trial_dir.path, damaged_name(ckpt.name))
    fs = experiment.filesystem
    if fs.get_file_info(target).type == pafs.FileType.NotFound:
        source = posixpath.join(trial_dir.path, ckpt.name)
        if experiment.is_local:
            os.makedirs(target)
            link_tree(source, target)
        else:
            pafs.copy_files(source, target, source_filesystem=fs, destination_filesystem=fs)
    return f"{trial_dir.uri.rstrip('/')}/{damaged_name(ckpt.name)}"


def _continues_from(snapshot: ExperimentSnapshot, trial: TrialSnapshot, experiment: Storage, *,
                    restart: bool, record: dict[str, Any] | None = None) -> tuple[str, CheckpointSummary | None]:
    """One line: where an unfinished trial goes on from (damaged checkpoints named and kept); and that checkpoint."""
    if restart:
        return f"  {trial.trial_id} ({trial.status}): restarts from scratch (--restart-errored)", None
    good, damaged = newest_good(snapshot, trial)
    pin = _registered_pin(experiment, trial, record)
    if pin is not None and (good is None or (pin.iteration or 0) >= (good.iteration or 0)):
        return (f"  {trial.trial_id} ({trial.status}): continues from {pin.name} (iteration {pin.iteration}: "
                "the PBT donor's checkpoint it cloned, pinned)"), pin
    kept = [_preserve(experiment, trial, c) for c in trial.checkpoints  # (an announced one never written, or one
            if not snapshot.verdict(c)[0] and not c.unsupported  # whose write never completed: nothing to keep)
            and NOT_WRITTEN not in snapshot.verdict(c)[1] and not snapshot.verdict(c)[1].startswith(INTERRUPTED)]
    where = f"{good.name} (iteration {good.iteration})" if good else "the start (no checkpoint that verifies)"
    line = f"  {trial.trial_id} ({trial.status}): continues from {where}"
    if damaged:
        line += f"; passed over: {'; '.join(damaged)}"
    if kept:
        line += f"; damaged copies kept as {', '.join(posixpath.basename(k) for k in kept)}"
    return line, good


def keep_pbt_log(experiment: Storage) -> None:
    """Copy Ray's ``pbt_global.txt`` aside before a resume (Ray starts it anew): the PBT lineage survives."""
    fs, source = experiment.filesystem, posixpath.join(experiment.path, PBT_LOG)
    if fs.get_file_info(source).type != pafs.FileType.File:
        return
    taken = {i.base_name for i in fs.get_file_info(pafs.FileSelector(experiment.path))}
    n = next(n for n in range(1, 10_000) if f"{PBT_LOG}.before-resume-{n:04d}" not in taken)
    fs.copy_file(source, posixpath.join(experiment.path, f"{PBT_LOG}.before-resume-{n:04d}"))


def _registered_pin(experiment: Storage, trial: TrialSnapshot, record: dict[str, Any] | None) -> CheckpointSummary | None:
    """The PBT donor's pin Ray restores ``trial`` from (tunekit's record names it), if it is there and verifies."""
    registered = registered_checkpoints(record).get(trial.trial_id)
    if registered is None or not is_pinned(registered):
        return None
    where = experiment.join(*registered.split("/"))
    if not verify_checkpoint(where).ok:
        return None
    meta = read_metadata(where)
    return CheckpointSummary(registered, where.uri, meta.get("iteration"), dict(meta.get("metrics") or {}), tunekit=True)


def _resume_from_record(experiment: Storage, before: ExperimentSnapshot, record: dict[str, Any], *,
                        trainable: str | None, resume_errored: bool, restart_errored: bool, cpus: int | None,
                        address: str | None, out: TextIO, damage: str | None = None) -> ResumeSummary:
    """Ray's experiment state (or ``damage``: another of its driver state files) is torn: continue every
    unfinished trial, from tunekit's record, in a new experiment."""
    from ray import tune

    from tunekit.trial.warm import WARM_START_KEY, warm_start

    stop = record.get("stop")
    if not record.get("stop_is_dict", True) or not isinstance(stop, dict) or not stop:
        raise ExperimentError(f"{experiment.uri}: the experiment state is torn and tunekit's record holds no stop "
                              "criteria (the run's stop was not a dict); cannot tell where the trials end")
    damage = damage or next(p for p in before.problems if p.startswith("experiment_state")).split("; no older one")[0]
    by_dir = {t.name: t for t in before.trials}
    by_id = {t.trial_id: t for t in before.trials}
    recorded = {str(t.get("trial_id")): t for t in record["trials"] if isinstance(t, dict)}
    order = list(dict.fromkeys([*recorded, *by_id]))
    configs, lines, skipped = [], [], []
    for trial_id in order:
        entry = recorded.get(trial_id, {})
        trial = by_id.get(trial_id) or by_dir.get(str(entry.get("dir")))
        status = trial.status if trial is not None else str(entry.get("status") or "PENDING")
        if status == "TERMINATED" or (status == "ERROR" and not (resume_errored or restart_errored)):
            skipped.append(f"{trial_id} ({status})")
            continue
        config = trial.config if trial is not None and trial.config else entry.get("config")
        if not isinstance(config, dict) or any(isinstance(v, dict) and set(v) == {"unrecorded"}
                                               for v in config.values()):
            raise ExperimentError(f"{experiment.uri}: trial {trial_id}'s config is not in tunekit's record "
                                  "whole; cannot continue it")
        config = {k: v for k, v in config.items() if k != WARM_START_KEY}
        if trial is not None:
            line, good = _continues_from(before, trial, experiment, restart=restart_errored and status == "ERROR",
                                         record=record)
        else:
            line, good = f"  {trial_id} ({status}): starts (it never did), with its recorded config", None
        if good is not None and good.iteration is not None:
            configs.append({**config, **warm_start(good.uri, mode="continue")})
        else:  # no warm start, said outright: Ray fills a key a preset point lacks from the space (another's)
            configs.append({**config, WARM_START_KEY: {"checkpoint": None, "mode": None}})
        lines.append(line)
    if not configs:
        print(f"nothing to resume: {damage}, but every trial had finished ({', '.join(skipped)})", file=out)
        return ResumeSummary(experiment.uri, "", before.counts(), before, ran=False)
    obj, found = find_trainable(experiment, before, trainable, record)
    parent = parent_of(experiment)
    base = posixpath.basename(experiment.path.rstrip("/"))
    target = next(t for t in (parent.join(f"{base}-resumed" + (f"-{n}" if n > 1 else "")) for n in range(1, 1000))
                  if experiment.filesystem.get_file_info(t.path).type == pafs.FileType.NotFound)
    callbacks, lost_callbacks = callbacks_from(record)
    checkpoint = record.get("checkpoint_config") or {}
    fields = {f.name for f in dataclasses.fields(tune.CheckpointConfig)}
    print(f"resuming {experiment.uri}: {damage}; Ray cannot restore it, so {len(configs)} unfinished trials continue "
          f"from tunekit's record (tunekit-experiment.json) and their checkpoints in {target.uri}; not restored: "
          f"{not_restored(experiment, record, lost_callbacks)}", file=out)
    print(f"trainable: {found}", file=out, flush=True)
    for line in lines:
        print(line, file=out, flush=True)
    if skipped:
        print(f"  not run again: {', '.join(skipped)}", file=out, flush=True)
    unsuggested = (record.get("total_num_samples") or 0) - len(recorded)
    if isinstance(unsuggested, int) and unsuggested > 0:
        print(f"  {unsuggested} trials not suggested yet when the driver stopped are not run", file=out, flush=True)
    run_beside(target, obj, configs, "resume", stop=stop, address=address, cpus=cpus, callbacks=callbacks,
                checkpoint_config=tune.CheckpointConfig(**{k: v for k, v in checkpoint.items() if k in fields}))
    after = read_experiment(target)
    return ResumeSummary(experiment.uri, found, before.counts(), after, into=target.uri)


def resume_command(args: argparse.Namespace) -> int:
    """Run ``tunekit resume`` (``--extend`` included) with its parsed arguments; return the exit code."""
    from tunekit.analysis._status_text import print_snapshot
    from tunekit.commands.extend import extend_experiment

    if args.extend is not None:
        if args.resume_errored or args.restart_errored:
            raise UsageError("tunekit resume: --extend continues finished trials; it takes no --resume/--restart-errored")
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
