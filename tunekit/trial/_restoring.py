"""Restoring one trial's checkpoint: verify while loading, fall back to the newest good one.

Implementation tier, shared by :class:`tunekit.TorchTrainable` and the function
adapter (:func:`tunekit.function_trainable`).

Call order on ``restore(checkpoint)`` (followed by
:meth:`tunekit.trial._checkpointer.TrialCheckpointer.restore`, the one caller):

1. wait for its own write in flight (:meth:`tunekit.trial._saving.BackgroundSaves.wait`);
2. :func:`local_request`: a local checkpoint is loaded and verified in one
   pass (:meth:`tunekit.trial._checkpointer.TrialContent.load`, which applies
   hyperparameters a PBT exploit mutated); a local checkpoint still being written by a live
   process (a PBT donor's) is waited for first
   (:func:`tunekit.checkpoint._trial_dir.await_write`, ``TUNEKIT_CHECKPOINT_WAIT_S``);
3. otherwise, or when that finds damage, :func:`prepare_restore`: the
   checkpoint is fetched once (a local copy if it lives on remote storage)
   and verified. A damaged one is skipped for the same trial's newest good
   checkpoint before it (kept copies included), a deleted one for its newest
   good one (a PBT donor's deleted one: the donor's newest before it, else the
   restoring trial's own newest, see :func:`_candidates`), with a warning naming what was skipped; if there is none,
   restoring fails with a :class:`~tunekit.CheckpointError` saying so. The
   first-write-interrupted rule: a trial whose first two-phase write died
   starts afresh. A checkpoint the training code wrote itself (no tunekit
   files) is handed back unverified, as Ray would, with a one-time note;
4. :func:`remove_temps` once the state is loaded.

A PBT exploit in a running worker goes through :func:`clone_in_worker`
(reset, then restore); its failure is raised by the trial's next step
(:func:`raise_failed_clone`).
"""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
import tempfile
from typing import Any

import pyarrow.fs as pafs
from ray import tune

from tunekit import _ray
from tunekit._ray import TrainingResult
from tunekit.checkpoint._announced import is_announced_only, registered_unwritten
from tunekit.checkpoint._pins import adopt_pin, adopted_pin, cloned_from, is_pinned, remove_pin, unpinned
from tunekit.checkpoint._trial_dir import (CHECKPOINT_DIR, LOCAL, await_write, checkpoint_name_of, link_tree,
                                           restorable_checkpoints, scan)
from tunekit.checkpoint._manifest import MISSING, NOT_WRITTEN
from tunekit.checkpoint._directory import (
    MANIFEST_FILE, CheckpointReport, is_foreign_checkpoint, read_metadata, verify_checkpoint
)
from tunekit.errors import CheckpointError, first_line

__all__ = [
    "align_iteration", "clone_in_worker", "local_request", "prepare_restore", "raise_failed_clone", "remove_temps",
    "writer_trial"
]

logger = logging.getLogger(__name__)


def _as_training_result(checkpoint: Any) -> TrainingResult:
    if isinstance(checkpoint, (str, os.PathLike)):
        checkpoint = tune.Checkpoint.from_directory(os.fspath(checkpoint))
    if isinstance(checkpoint, tune.Checkpoint):
        return TrainingResult(checkpoint=checkpoint, metrics={})
    if isinstance(checkpoint, TrainingResult):
        return checkpoint
    raise CheckpointError(
        f"cannot restore from {type(checkpoint).__name__}: expected a checkpoint "
        "directory, a ray.tune.Checkpoint or the result of save()"
    )


def writer_trial(checkpoint: Any) -> str | None:
    """The name of the trial directory whose checkpoint ``checkpoint`` is (for a PBT donor's pinned copy:
    the donor's), or None when it is not a trial's ``checkpoint_*`` directory."""
    try:
        path = unpinned(_as_training_result(checkpoint).checkpoint.path.rstrip("/"))
    except CheckpointError:
        return None
    parent, name = posixpath.split(path)
    if checkpoint_name_of(name) is None:
        return None
    return posixpath.basename(parent) or None


def _fetch(checkpoint: tune.Checkpoint, temps: list[str]) -> tuple[tune.Checkpoint, CheckpointReport]:
    """A local, verified view of ``checkpoint`` (downloaded once if remote)."""
    if isinstance(checkpoint.filesystem, pafs.LocalFileSystem):
        await_write(checkpoint.path)
        return checkpoint, verify_checkpoint(checkpoint)
    if checkpoint.filesystem.get_file_info(checkpoint.path).type == pafs.FileType.NotFound:
        return checkpoint, CheckpointReport(checkpoint.path, "incomplete", [MISSING])
    local = tempfile.mkdtemp(prefix="tunekit-restore-")
    temps.append(local)
    try:
        checkpoint.to_directory(local)
    except (OSError, FileNotFoundError) as exc:  # storage errors are raised, with context
        raise CheckpointError(f"cannot download checkpoint {checkpoint.path}: {exc}") from None
    report = verify_checkpoint(local)
    report.path = checkpoint.path
    return tune.Checkpoint.from_directory(local), report


def _other_checkpoints(checkpoint: tune.Checkpoint, *, newer_too: bool) -> list[tune.Checkpoint]:
    """The same trial's other checkpoints (before ``checkpoint`` unless ``newer_too``), newest first."""
    fs = checkpoint.filesystem
    return [tune.Checkpoint(path, filesystem=fs) for _, path, older in _others_of(checkpoint) if newer_too or older]


def _others_of(checkpoint: tune.Checkpoint) -> list[tuple[int, str, bool]]:
    """The trial's other checkpoints than ``checkpoint``, newest first (one listing), each as (index, path,
    whether it comes before ``checkpoint``: older, or the PBT donor's state a clone restored from)."""
    name = checkpoint_name_of(posixpath.basename(checkpoint.path.rstrip("/")))
    match = CHECKPOINT_DIR.match(name or "")
    if not match:
        return []
    fs, trial_dir, own = checkpoint.filesystem, posixpath.dirname(checkpoint.path.rstrip("/")), int(match[1])
    # (kept copies of two-phase saves count, after a real directory of the same index)
    ordered = [(i, path, i < own) for i, path in restorable_checkpoints(fs, trial_dir, lambda index: index != own)]
    adopted = adopted_pin(trial_dir, fs)
    if adopted is not None and fs.get_file_info(adopted[0]).type == pafs.FileType.Directory:
        # A PBT clone: the donor's state it restored from comes before its own checkpoints from before the
        # exploit (falling back to those would undo the exploit); its own ones since come first.
        pin, after = adopted
        ordered = [c for c in ordered if c[0] > after] + [(after, pin, True)] + [c for c in ordered if c[0] <= after]
    return ordered


def local_request(checkpoint: Any) -> TrainingResult | None:
    """What Tune asked to restore, if it is a local directory that exists (else None).

    Such a checkpoint can be loaded directly: :func:`tunekit.checkpoint._directory.read_state`
    verifies it while loading. Only when that fails is :func:`prepare_restore`
    (verify first, fall back) needed.
    """
    requested = _as_training_result(checkpoint)
    ckpt = requested.checkpoint
    if isinstance(ckpt.filesystem, pafs.LocalFileSystem) and not is_pinned(ckpt.path):
        await_write(ckpt.path)  # another worker may still be writing it (a PBT donor)
        if os.path.isdir(ckpt.path):
            return requested
    return None


def prepare_restore(checkpoint: Any, *, trial_dir: str | None = None,
                    trial_path: str | None = None) -> tuple[TrainingResult | None, list[str]]:
    """Resolve what Tune asked to restore into a good, local checkpoint.

    ``trial_dir``: the restoring trial's own local directory. A checkpoint in it announced but never
    completed by the trial's first two-phase save (nothing complete before it) means "start afresh": None.
    ``trial_path``: the trial's directory on its storage, whatever the storage (where a pin's record goes).
    A PBT donor's pin is adopted by the trial (:func:`_release_pin`), on any storage. An announced
    checkpoint whose write died gets the files of the one the trial goes on from instead.

    Returns:
        The result to restore (its checkpoint local and verified), or None to
        start afresh, and the temporary directories the caller removes once
        restored.

    Raises:
        CheckpointError: the checkpoint is damaged and the trial has no good
            checkpoint before it.
    """
    requested = _as_training_result(checkpoint)
    temps: list[str] = []
    try:
        local, report = _fetch(requested.checkpoint, temps)
        _release_pin(requested.checkpoint, temps, trial_dir or trial_path)
        if report.ok:
            return TrainingResult(checkpoint=local, metrics=requested.metrics), temps
        if report.problems == [f"no {MANIFEST_FILE}"] and is_foreign_checkpoint(local):
            # The training code reported it itself (tune.report(checkpoint=...)): hand it back as
            # Ray would, unverified; only checkpoints tunekit wrote are verified and fall back.
            _note_foreign(requested.checkpoint.path)
            return TrainingResult(checkpoint=local, metrics=requested.metrics), temps
        if report.status == "unsupported":  # not damaged: falling back would lose its progress
            raise CheckpointError(f"cannot restore: checkpoint {report.describe()}")
        # A checkpoint deleted meanwhile (Ray keeps only ``num_to_keep``; a PBT
        # donor may have moved on) is replaced by the trial's newest good one;
        # a damaged one by the newest good one before it.
        # Announced and never written (empty) counts as missing: any good checkpoint of the trial may stand in.
        missing = report.problems in ([MISSING], [NOT_WRITTEN])
        announced = report.problems == [NOT_WRITTEN] and isinstance(requested.checkpoint.filesystem, pafs.LocalFileSystem)
        if announced:
            registered_unwritten(requested.checkpoint.path)  # Ray registered it: tunekit never removes it
        instead = _first_good(requested, report, temps,
                              _candidates(requested.checkpoint, trial_dir or trial_path, missing))
        if instead is not None:
            if announced:  # what Ray registered gets the state the trial goes on from
                _stand_in(requested.checkpoint.path, instead.checkpoint.path)
            return instead, temps
        if missing and _first_write_interrupted(requested.checkpoint, trial_dir):
            logger.warning(
                "tunekit: checkpoint %s was never completed (its writer died during the trial's first "
                "checkpoint write) and the trial has no other; it starts afresh", requested.checkpoint.path,
            )
            return None, temps
        raise CheckpointError(
            f"cannot restore: checkpoint {report.describe()}; the trial has no good "
            f"checkpoint {'left' if missing else 'before it'} to fall back to"
        )
    except BaseException:
        remove_temps(temps)
        raise


def _candidates(checkpoint: tune.Checkpoint, trial_dir: str | None, missing: bool) -> list[tune.Checkpoint]:
    """What may stand in for ``checkpoint``, best first: for a PBT clone's pin released meanwhile the clone's own
    checkpoints since (:func:`_after_clone`); the trial's others (:func:`_other_checkpoints`).

    A PBT donor's checkpoint deleted before the clone read it (Ray's own PBT keeps no pin: the donor trained
    on and ``num_to_keep`` deleted it) stands for the donor's state at the iteration PBT chose. What stands in,
    best first: the donor's newest checkpoint before it; the restoring trial's own newest (the exploit undone:
    the trial goes on from its own state with the new config); only then the donor's newer ones, oldest
    first, which carry the clone past the iteration PBT chose (and a trial that clones a finished donor past
    its stop)."""
    if not missing:
        return _other_checkpoints(checkpoint, newer_too=False)
    after_clone = _after_clone(checkpoint, trial_dir)
    donor = posixpath.dirname(checkpoint.path.rstrip("/"))
    if trial_dir is None or posixpath.basename(donor) == posixpath.basename(trial_dir.rstrip("/")):
        return after_clone + _other_checkpoints(checkpoint, newer_too=True)
    fs = checkpoint.filesystem
    own = [tune.Checkpoint(path, filesystem=fs) for _, path in restorable_checkpoints(fs, trial_dir, lambda i: True)]
    others = _others_of(checkpoint)
    older = [tune.Checkpoint(path, filesystem=fs) for _, path, before in others if before]
    newer = [tune.Checkpoint(path, filesystem=fs) for _, path, before in reversed(others) if not before]
    return after_clone + older + own + newer


def _after_clone(checkpoint: tune.Checkpoint, trial_dir: str | None) -> list[tune.Checkpoint]:
    """``checkpoint`` is the PBT donor's pin the trial in ``trial_dir`` restored from, now gone: the trial's own
    checkpoints written after that restore, newest first (else none).

    The pin goes once such a checkpoint is complete (:func:`tunekit.checkpoint._pins.release_adopted_pin`), and Ray names
    the pin until the driver has registered it: a driver killed in between, or a worker killed before the
    registration, asks for the pin. The donor's other checkpoints are not what the trial had become."""
    fs = checkpoint.filesystem
    if trial_dir is None or not is_pinned(checkpoint.path):
        return []
    record = cloned_from(trial_dir, fs)
    if record is None or posixpath.normpath(record[0]) != posixpath.normpath(checkpoint.path):
        return []
    return [tune.Checkpoint(path, filesystem=fs) for _, path in restorable_checkpoints(fs, trial_dir,
                                                                                        lambda i: i > record[1])]


def _first_good(requested: TrainingResult, report: CheckpointReport, temps: list[str],
                candidates: list[tune.Checkpoint]) -> TrainingResult | None:
    """The first of ``candidates`` (the trial's others, newest first) that verifies, to restore instead."""
    skipped = [report]
    for candidate in candidates:
        local, candidate_report = _fetch(candidate, temps)
        if not candidate_report.ok:
            skipped.append(candidate_report)
            continue
        iteration = int(read_metadata(local).get("iteration", 0))
        logger.warning(
            "tunekit: skipped damaged checkpoint(s) %s; restoring from %s (iteration %d) instead",
            " | ".join(r.describe() for r in skipped),
            candidate.path,
            iteration,
        )
        return TrainingResult(checkpoint=local, metrics={**requested.metrics, "training_iteration": iteration})
    return None


_FOREIGN_NOTED: set[str] = set()


def _note_foreign(path: str) -> None:
    """Say once per process that checkpoints the training code writes itself are not verified."""
    if not _FOREIGN_NOTED:
        logger.warning("tunekit: restoring %s, a checkpoint the training code wrote itself: it carries no "
                       "integrity manifest, so it is handed back as Ray would, unverified", path)
    _FOREIGN_NOTED.add(path)


def _first_write_interrupted(checkpoint: tune.Checkpoint, trial_dir: str | None) -> bool:
    """Whether ``checkpoint``, in ``trial_dir``, was announced and its writer is dead: a staging directory
    whose writer is gone, or the empty directory announced for it and no live writer."""
    if trial_dir is None or not isinstance(checkpoint.filesystem, pafs.LocalFileSystem):
        return False
    parent, name = os.path.split(os.path.normpath(checkpoint.path))
    if os.path.normpath(parent) != os.path.normpath(trial_dir):
        return False  # another trial's (a PBT donor's): not this trial's start
    writers = [e.kind == "writing" for e in scan(LOCAL, parent, ("writing", "interrupted")) if e.checkpoint == name]
    if any(writers):
        return False
    return bool(writers) or is_announced_only(checkpoint.path)


def _stand_in(announced: str, source: str) -> None:
    """Ray registered ``announced`` (it asked to restore it) but its write never completed: it gets the files of
    ``source``, the checkpoint the trial goes on from instead (hard links), so that what Ray names exists and
    verifies. It holds ``source``'s iteration (its ``tunekit.json`` says which)."""
    parent = os.path.dirname(os.path.normpath(announced))
    if os.path.dirname(os.path.normpath(source)) != parent:
        return  # not the same trial's
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(announced)}.standin-", dir=parent)
    try:
        link_tree(source, staging)
        os.rename(staging, announced)  # onto the empty directory: atomic
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)


def _release_pin(checkpoint: tune.Checkpoint, temps: list[str], trial_dir: str | None) -> None:
    """A pin is read by one clone, and stays while the clone may be restored from it again
    (:func:`tunekit.checkpoint._pins.adopt_pin`, on any storage: ``trial_dir`` is the clone's directory there). Outside
    Tune (no trial directory) a local one goes with the temporary directories, a remote one now."""
    if not is_pinned(checkpoint.path):
        return
    fs = checkpoint.filesystem
    if isinstance(fs, pafs.LocalFileSystem):
        if not os.path.isdir(checkpoint.path):
            return  # gone (released, see :func:`_after_clone`): its record says what came after it
        if trial_dir is not None and os.path.isdir(trial_dir):
            adopt_pin(trial_dir, checkpoint.path)
        else:
            temps.append(checkpoint.path)
    elif trial_dir is not None:
        if fs.get_file_info(checkpoint.path).type == pafs.FileType.Directory:
            adopt_pin(trial_dir, checkpoint.path, fs)
    else:
        remove_pin(fs, checkpoint.path)


def remove_temps(temps: list[str]) -> None:
    """Remove temporary directories made by :func:`prepare_restore`."""
    while temps:
        shutil.rmtree(temps.pop(), ignore_errors=True)


def clone_in_worker(trainable: tune.Trainable, config: dict[str, Any], checkpoint: Any, storage: Any) -> None:
    """A PBT exploit in the trial's own worker (``tunekit_clone``): ``reset`` to ``config``, restore ``checkpoint``.

    Sent by :func:`tunekit._ray.clone_in_place` ahead of Tune's next task for
    the trial; a failure is kept and raised by that task
    (:func:`raise_failed_clone`), so Tune sees it as the trial's failure.
    """
    try:
        if not trainable.reset(config, storage=storage):
            raise CheckpointError(f"{type(trainable).__name__}.reset_config() returned False")
        trainable.restore(checkpoint)
        # A save Tune asks for at this same result is registered under the donor's result, the state it holds.
        _ray.adopt_result(trainable, dict(getattr(checkpoint, "metrics", None) or {}))
    except Exception as exc:
        trainable._tunekit_clone_error = exc
        raise


def align_iteration(trainable: tune.Trainable, state_iteration: int, checkpoint: str) -> None:
    """After a restore: Ray's iteration counter is the loaded state's own (``tunekit.json``), whatever the
    metrics the checkpoint was registered under say, so the trial goes on at the iteration after its state's
    and its stop criteria count the iterations it really ran."""
    registered = trainable.iteration
    if registered == state_iteration:
        return
    logger.warning("tunekit: %s holds the state of iteration %d but was registered at iteration %s; the trial "
                   "continues at iteration %d", checkpoint, state_iteration, registered, state_iteration + 1)
    _ray.set_iteration(trainable, state_iteration)


def raise_failed_clone(trainable: tune.Trainable) -> None:
    """Raise the error of a failed :func:`clone_in_worker`, once."""
    error = trainable.__dict__.pop("_tunekit_clone_error", None)
    if error is not None:
        raise CheckpointError(f"cloning a PBT donor in this worker failed: {first_line(error)}") from error
