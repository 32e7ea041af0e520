"""Resume an interrupted experiment: find its trainable, ``Tuner.restore``, run to the end.

The trainable is found, in this order, from:

1. ``trainable="module:attr"`` given by the caller;
2. the ``trainable`` recorded in ``tunekit.json`` of the experiment's
   checkpoints (tunekit trainables record their ``module:qualname``);
3. the references in ``tuner.pkl`` whose name is the recorded
   ``trainable_name``, found by reading the pickle's opcodes (never loading it).

A function found this way that is not a Tune trainable class is wrapped with
:func:`tunekit.function_trainable` if it uses a :class:`~tunekit.FunctionSession`
(tunekit records those), and handed to Tune as is otherwise.
"""

from __future__ import annotations

import contextlib
import posixpath
import sys
from dataclasses import dataclass
from typing import Any, Iterator, TextIO

import pyarrow.fs as pafs

from tunekit._trial_dir import damaged_name
from tunekit.errors import ConfigError, ExperimentError
from tunekit._connect import ray_for
from tunekit._find_trainable import alias_moved_packages, find_trainable, import_trainable
from tunekit.snapshot import CheckpointSummary, ExperimentSnapshot, TrialSnapshot, format_counts, read_experiment
from tunekit.storage import Storage, resolve_storage

__all__ = [
    "ResumeSummary",
    "extend_experiment",
    "find_trainable",
    "import_trainable",
    "newest_good",
    "resume_experiment",
]


@dataclass
class ResumeSummary:
    """What ``tunekit resume`` did."""

    experiment: str
    trainable: str
    before: dict[str, int]
    after: ExperimentSnapshot
    #: False when there was nothing to do (every trial finished): nothing was started or written.
    ran: bool = True

    @property
    def ok(self) -> bool:
        return all(t.status == "TERMINATED" for t in self.after.trials)


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
    before = read_experiment(experiment)
    if before.state_file is None:
        raise ExperimentError(f"{experiment.uri}: no experiment_state-*.json, so Ray Tune cannot restore it")
    damaged = [p for p in before.problems if p.startswith("experiment_state")]
    if damaged:
        raise ExperimentError(f"{experiment.uri}: {damaged[0]}; Ray Tune cannot restore from it")
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
    obj, found = find_trainable(experiment, before, trainable)

    print(f"resuming {experiment.uri}: {len(before.trials)} trials ({summary})", file=out)
    print(f"trainable: {found}", file=out, flush=True)
    for trial in todo:
        print(_continues_from(before, trial, experiment, restart=restart_errored and trial.status == "ERROR"),
              file=out, flush=True)
    alias_moved_packages(experiment)

    from ray import tune

    with _quiet(), ray_for("resume", address=address, cpus=cpus):
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


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Ray's notices that do not apply to a resume (its config box, PBT's num_to_keep warning) left out."""
    import warnings

    from tunekit._ray import quiet_ray_notices, quiet_tune_banner

    undo = [quiet_ray_notices(), quiet_tune_banner()]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Using `CheckpointConfig.num_to_keep <= 2` with PBT")
            yield
    finally:
        for restore in undo:
            restore()


def newest_good(snapshot: ExperimentSnapshot, trial: TrialSnapshot) -> tuple[CheckpointSummary | None, list[str]]:
    """A trial's newest checkpoint that verifies, and one line for each newer one that does not."""
    damaged = []
    for ckpt in sorted(trial.checkpoints, key=lambda c: (c.iteration or 0, c.name), reverse=True):
        ok, why = snapshot.verdict(ckpt)
        if ok:
            return ckpt, damaged
        damaged.append(f"{ckpt.name} is {why}")
    return None, damaged


def _preserve(experiment: Storage, trial: TrialSnapshot, ckpt: CheckpointSummary) -> str:
    """Keep a damaged checkpoint out of Ray's retention: a copy as ``.checkpoint_N.damaged`` beside it."""
    trial_dir = experiment.join(trial.name)
    target = posixpath.join(trial_dir.path, damaged_name(ckpt.name))
    fs = experiment.filesystem
    if fs.get_file_info(target).type == pafs.FileType.NotFound:
        source = posixpath.join(trial_dir.path, ckpt.name)
        if experiment.is_local:
            import shutil

            shutil.copytree(source, target, copy_function=_link_or_copy)
        else:
            pafs.copy_files(source, target, source_filesystem=fs, destination_filesystem=fs)
    return f"{trial_dir.uri.rstrip('/')}/{damaged_name(ckpt.name)}"


def _link_or_copy(src: str, dst: str) -> None:
    import os
    import shutil

    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _continues_from(snapshot: ExperimentSnapshot, trial: TrialSnapshot, experiment: Storage, *, restart: bool) -> str:
    """One line: where an unfinished trial goes on from; damaged checkpoints named and kept."""
    if restart:
        return f"  {trial.trial_id} ({trial.status}): restarts from scratch (--restart-errored)"
    good, damaged = newest_good(snapshot, trial)
    kept = [_preserve(experiment, trial, c) for c in trial.checkpoints
            if not snapshot.verdict(c)[0] and not c.unsupported]
    where = f"{good.name} (iteration {good.iteration})" if good else "the start (no checkpoint that verifies)"
    line = f"  {trial.trial_id} ({trial.status}): continues from {where}"
    if damaged:
        line += f"; passed over: {'; '.join(damaged)}"
    if kept:
        line += f"; damaged copies kept as {', '.join(posixpath.basename(k) for k in kept)}"
    return line


def extend_experiment(
    location: str | Storage,
    iterations: int,
    *,
    trainable: str | None = None,
    cpus: int | None = None,
    address: str | None = None,
    stream: TextIO | None = None,
) -> ResumeSummary:
    """Continue every trial of a finished experiment to ``iterations`` in a new experiment beside it.

    Each trial of ``EXP`` is started again from its newest checkpoint, complete
    state (:func:`tunekit.warm_start` with ``mode="continue"``: bit-exact with
    one longer run), with its config, and stops at ``training_iteration ==
    iterations``. The new experiment is ``EXP-to-ITERATIONS`` in the same
    storage; :func:`tunekit.load_results` of it holds every iteration once
    (the rows up to the checkpoint come from ``EXP``, marked ``inherited_from``).
    ``EXP`` itself is not changed. A trial whose newest checkpoint does not
    verify continues from its newest one that does, and says so. Schedulers, search algorithms and
    callbacks of the original run are not carried over: the trials run to the
    new stopping point, a checkpoint at the end.

    Raises:
        ConfigError: ``iterations`` is not above every trial's checkpoint, or no trainable is found.
        ExperimentError: not an experiment, a trial without a checkpoint, or the target exists.
    """
    from tunekit.warm import WARM_START_KEY, warm_start

    out = stream or sys.stdout
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ConfigError(f"extend: iterations={iterations!r}: expected a positive whole number")
    experiment = resolve_storage(location)
    before = read_experiment(experiment)
    if not before.trials:
        raise ExperimentError(f"{experiment.uri}: no trials to extend")
    configs = []
    notes = []
    for trial in before.trials:
        newest, damaged = newest_good(before, trial)
        if newest is None or newest.iteration is None:
            passed = f" ({'; '.join(damaged)})" if damaged else ""
            raise ExperimentError(f"extend {experiment.uri}: trial {trial.trial_id} has no checkpoint that verifies "
                                  f"to continue from{passed}")
        if damaged:
            notes.append(f"  {trial.trial_id}: continues from {newest.name} (iteration {newest.iteration}); "
                         f"passed over: {'; '.join(damaged)}")
        if (newest.iteration or 0) >= iterations:
            raise ConfigError(
                f"extend {experiment.uri} to {iterations}: trial {trial.trial_id} has a checkpoint at iteration "
                f"{newest.iteration} already; give more iterations than that"
            )
        config = {k: v for k, v in trial.config.items() if k != WARM_START_KEY}
        configs.append({**config, **warm_start(newest.uri, mode="continue")})
    obj, found = find_trainable(experiment, before, trainable)
    parent = Storage(experiment.filesystem, posixpath.dirname(experiment.path.rstrip("/")),
                     posixpath.dirname(experiment.uri.partition("?")[0].rstrip("/")))
    name = f"{posixpath.basename(experiment.path.rstrip('/'))}-to-{iterations}"
    target = parent.join(name)
    if experiment.filesystem.get_file_info(target.path).type != pafs.FileType.NotFound:
        raise ExperimentError(f"extend: {target.uri} exists already; remove it or resume it with tunekit resume")

    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    print(f"extending {experiment.uri}: {len(configs)} trials to iteration {iterations}, into {target.uri}", file=out)
    print(f"trainable: {found}", file=out, flush=True)
    for note in notes:
        print(note, file=out, flush=True)
    with _quiet(), ray_for("resume --extend", address=address, cpus=cpus):
        tune.Tuner(
            obj,
            tune_config=tune.TuneConfig(search_alg=BasicVariantGenerator(points_to_evaluate=configs),
                                        num_samples=len(configs)),
            param_space=_space_of(configs),
            run_config=tune.RunConfig(
                name=name, stop={"training_iteration": iterations}, verbose=0,
                checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True),
                storage_path=parent.path, storage_filesystem=parent.filesystem,
            ),
        ).fit()
    after = read_experiment(target)
    return ResumeSummary(target.uri, found, before.counts(), after)


def _space_of(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """A param_space every config in ``configs`` fits, so that Ray takes each as a preset point quietly.

    Ray resolves each point against the space (every key must be in it) and
    warns when a point differs from a constant there: a key whose values
    differ between the configs becomes a choice of them.
    """
    from ray import tune

    space: dict[str, Any] = {}
    for key in dict.fromkeys(k for c in configs for k in c):
        values = [c[key] for c in configs if key in c]
        if all(isinstance(v, dict) for v in values):
            space[key] = _space_of(values)
            continue
        distinct: list[Any] = []
        for value in values:
            if value not in distinct:
                distinct.append(value)
        space[key] = distinct[0] if len(distinct) == 1 else tune.choice(distinct)
    return space
