"""Save and restore one trial's TrainingState, shared by class and function trainables.

Saving to local storage goes through :func:`save_in_place`: the checkpoint is
written once, in its final directory's parent, and renamed into place (Ray
would write it to a temporary directory and copy it). Restoring a local
checkpoint loads and verifies it in one pass (:func:`local_request`); otherwise,
or when that finds damage, :func:`prepare_restore` runs: the checkpoint Tune asks
for is fetched once (a local copy if it lives on remote storage) and verified
against its manifest. A damaged one is skipped for the same trial's newest
good checkpoint before it, with a warning naming what was skipped; if there is
none, restoring fails with a :class:`~tunekit.CheckpointError` saying so.
"""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
import tempfile
from typing import Any, Callable, Mapping

import pyarrow.fs as pafs
from ray import tune

from tunekit import _ray
from tunekit._ray import TrainingResult
from tunekit.checkpoint import (
    CheckpointReport,
    confirm_upload,
    read_metadata,
    read_state,
    sync_in_background,
    verify_checkpoint,
    write_checkpoint,
)
from tunekit.device import trial_device
from tunekit.errors import CheckpointError
from tunekit.experiment_dir import CHECKPOINT_DIR
from tunekit.hparams import changed_hyperparameters
from tunekit.state import TrainingState

__all__ = [
    "confirm_remote_upload",
    "local_request",
    "prepare_restore",
    "remove_temps",
    "restore_trial_state",
    "save_again",
    "save_in_place",
    "save_trial_state",
]

logger = logging.getLogger(__name__)


def save_trial_state(
    directory: str | os.PathLike[str],
    state: TrainingState,
    *,
    config: Mapping[str, Any],
    mutable: tuple[str, ...],
    trainable: str,
    metrics: Mapping[str, Any] | None = None,
    durable: bool = True,
) -> None:
    """Write ``state`` plus the trial's current mutable hyperparameters.

    ``metrics``: the reported metrics of the iteration saved, kept in the
    metadata so the checkpoint says how good it is without ``result.json``.
    ``durable=False``: see :func:`tunekit.checkpoint.write_checkpoint`.
    """
    sd = state.state_dict()
    hparams = {k: config[k] for k in mutable if k in config}
    sd["hparams"] = hparams
    write_checkpoint(
        directory,
        sd,
        metadata={
            "iteration": state.counters.iteration,
            "epoch": state.counters.epoch,
            "trainable": trainable,
            "config": dict(config),
            "hparams": hparams,
            "device": str(trial_device()),
            "models": sorted(state.models),
            "metrics": dict(metrics or {}),
        },
        durable=durable,
    )


def save_in_place(trainable: tune.Trainable, write: Callable[[str], None]) -> TrainingResult | None:
    """Save a class trainable's checkpoint straight into local storage.

    Does what ``Trainable.save`` does for a trial on local storage (next
    checkpoint index, the storage check, artifact sync), except that
    ``write(directory)`` writes into a hidden directory beside the final one,
    which is then renamed into place: the bytes are written once, not written
    to a temporary directory and copied. The files reach the disk on a
    helper thread (:func:`tunekit.checkpoint.sync_in_background`) while
    training goes on.

    Returns:
        The result ``save()`` returns, or None when the trainable has no local
        storage (the caller then uses ``Trainable.save``).
    """
    target = _ray.next_local_checkpoint(trainable)
    if target is None:
        return None
    final, metrics = target
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(final)}.partial-", dir=parent)
    try:
        write(staging)
        if os.path.lexists(final):  # Ray would overwrite it too (a re-saved index)
            shutil.rmtree(final)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    sync_in_background(final)
    return _ray.publish_local_checkpoint(trainable, final, metrics)


def save_again(trainable: tune.Trainable, previous: Any) -> TrainingResult | None:
    """A second checkpoint of a state saved already, as hard links to the first one's files.

    Tune may save one iteration twice (PBT's save and ``checkpoint_frequency``
    at the same result, or a pause right after either). Each save must be a
    checkpoint of its own: Tune's ``num_to_keep`` deletes the older of two
    registered results, and if both named one directory it would delete the
    checkpoint it keeps. Answering "nothing saved" instead would leave Ray's
    PBT, which may be waiting on that very save, without a donor checkpoint.
    So the second save is a new checkpoint directory whose files are hard
    links to the first one's (copied where links are not possible): no bytes
    rewritten, and deleting either directory leaves the other whole.

    Returns:
        The result ``save()`` returns, or None when this does not apply (the
        storage is not local, or the first checkpoint is gone): the caller
        then saves as usual.
    """
    source = getattr(getattr(previous, "checkpoint", None), "path", None)
    if not source or not os.path.isdir(source):
        return None
    return save_in_place(trainable, lambda staging: _link_tree(source, staging))


def _link_tree(source: str, target: str) -> None:
    """Hard-link every file under ``source`` to the same place under ``target`` (copy where links fail)."""
    for root, dirs, files in os.walk(source):
        rel = os.path.relpath(root, source)
        for d in dirs:
            os.makedirs(os.path.join(target, rel, d), exist_ok=True)
        for f in files:
            src, dst = os.path.join(root, f), os.path.join(target, rel, f)
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)


def restore_trial_state(
    directory: str | os.PathLike[str],
    state: TrainingState,
    *,
    config: Mapping[str, Any],
    mutable: tuple[str, ...],
    apply: Callable[[dict[str, Any]], None],
    verify: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint into ``state``, then apply hyperparameters that changed.

    A PBT exploit restores the donor's optimizer (with the donor's ``lr``) into
    a trial whose config was just mutated; the mutated values win.

    Returns:
        The hyperparameters that differed from the checkpoint and were applied.
    """
    sd = read_state(directory, verify=verify)
    state.load_state_dict(sd)
    changed = changed_hyperparameters(sd.get("hparams") or {}, config, mutable)
    if changed:
        apply(changed)
    return changed


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


def _fetch(checkpoint: tune.Checkpoint, temps: list[str]) -> tuple[tune.Checkpoint, CheckpointReport]:
    """A local, verified view of ``checkpoint`` (downloaded once if remote)."""
    if isinstance(checkpoint.filesystem, pafs.LocalFileSystem):
        return checkpoint, verify_checkpoint(checkpoint)
    if checkpoint.filesystem.get_file_info(checkpoint.path).type == pafs.FileType.NotFound:
        return checkpoint, CheckpointReport(checkpoint.path, "incomplete", ["directory is missing"])
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
    match = CHECKPOINT_DIR.match(posixpath.basename(checkpoint.path.rstrip("/")))
    if not match:
        return []
    fs, trial_dir = checkpoint.filesystem, posixpath.dirname(checkpoint.path.rstrip("/"))
    found = []
    for info in fs.get_file_info(pafs.FileSelector(trial_dir, allow_not_found=True)):
        other = CHECKPOINT_DIR.match(info.base_name)
        if info.type == pafs.FileType.Directory and other and other[1] != match[1] and (
            newer_too or int(other[1]) < int(match[1])
        ):
            found.append((int(other[1]), info.path))
    return [tune.Checkpoint(path, filesystem=fs) for _, path in sorted(found, reverse=True)]


def local_request(checkpoint: Any) -> TrainingResult | None:
    """What Tune asked to restore, if it is a local directory that exists (else None).

    Such a checkpoint can be loaded directly: :func:`tunekit.checkpoint.read_state`
    verifies it while loading. Only when that fails is :func:`prepare_restore`
    (verify first, fall back) needed.
    """
    requested = _as_training_result(checkpoint)
    ckpt = requested.checkpoint
    if isinstance(ckpt.filesystem, pafs.LocalFileSystem) and os.path.isdir(ckpt.path):
        return requested
    return None


def prepare_restore(checkpoint: Any) -> tuple[TrainingResult, list[str]]:
    """Resolve what Tune asked to restore into a good, local checkpoint.

    Returns:
        The result to restore (its checkpoint local and verified) and the
        temporary directories the caller removes once restored.

    Raises:
        CheckpointError: the checkpoint is damaged and the trial has no good
            checkpoint before it.
    """
    requested = _as_training_result(checkpoint)
    temps: list[str] = []
    try:
        local, report = _fetch(requested.checkpoint, temps)
        if report.ok:
            return TrainingResult(checkpoint=local, metrics=requested.metrics), temps
        skipped = [report]
        # A checkpoint deleted meanwhile (Ray keeps only ``num_to_keep``; a PBT
        # donor may have moved on) is replaced by the trial's newest good one;
        # a damaged one by the newest good one before it.
        missing = report.problems == ["directory is missing"]
        for candidate in _other_checkpoints(requested.checkpoint, newer_too=missing):
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
            metrics = {**requested.metrics, "training_iteration": iteration}
            return TrainingResult(checkpoint=local, metrics=metrics), temps
        raise CheckpointError(
            f"cannot restore: checkpoint {report.describe()}; the trial has no good "
            f"checkpoint {'left' if missing else 'before it'} to fall back to"
        )
    except BaseException:
        remove_temps(temps)
        raise


def remove_temps(temps: list[str]) -> None:
    """Remove temporary directories made by :func:`prepare_restore`."""
    while temps:
        shutil.rmtree(temps.pop(), ignore_errors=True)


def confirm_remote_upload(result: Any) -> None:
    """After Tune uploaded a checkpoint to remote storage, confirm it arrived whole.

    An upload interrupted by a storage outage has been seen to leave a
    checkpoint without its ``state.pt`` while Tune reported success; raising
    here fails the trial (which Tune retries from its last good checkpoint)
    instead of registering a checkpoint that cannot be restored.
    """
    checkpoint = getattr(result, "checkpoint", None)
    if checkpoint is None or isinstance(checkpoint.filesystem, pafs.LocalFileSystem):
        return
    confirm_upload(checkpoint)
