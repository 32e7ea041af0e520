"""Save and restore one trial's TrainingState, shared by class and function trainables.

Saving to local storage goes through :func:`save_in_place`: the checkpoint is
written once, in its final directory's parent, and renamed into place (Ray
would write it to a temporary directory and copy it).

Two-phase saves (the default on local storage, see :class:`BackgroundSaves`):
``save()`` returns once the state is copied into reused CPU buffers, and a
helper thread writes the copy, renames it into place and lets it reach the
disk. At most one such write is in flight per trial. Invariants (each proved
by a test that SIGKILLs the worker inside the write):

* Once a trial has one complete checkpoint, it always has one: before the
  new checkpoint is announced to Tune (whose ``num_to_keep`` may then delete
  the older one), the trial's newest complete checkpoint is kept as hard
  links in ``.checkpoint_NNNNNN.kept`` beside it, removed once the new one
  is complete. A trial's first checkpoint has nothing before it to keep: if
  its writer dies, the retry finds the checkpoint Tune registered never
  completed (a dead writer's staging directory says so) and no other, and
  the trial starts afresh, as it would have without a checkpoint.
* A restore or PBT exploit that meets a checkpoint still being written
  (its hidden ``.checkpoint_NNNNNN.partial-HOST-PID-*`` staging directory is
  there, its writer alive) waits for it (``TUNEKIT_CHECKPOINT_WAIT_S``,
  default 600 s, then a :class:`~tunekit.CheckpointError` naming it); if the
  writer is gone it falls back at once to the newest complete checkpoint,
  kept copies included. Nothing half-written is ever read: a checkpoint
  directory appears only by a rename, after its manifest. Restoring a local
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
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Mapping

import pyarrow.fs as pafs
from ray import tune

from tunekit import _ray
from tunekit._ray import TrainingResult
from tunekit.checkpoint import (
    _KEPT,
    _PARTIAL,
    _STAGING,
    MANIFEST_FILE,
    CheckpointReport,
    _alive,
    _lower_priority,
    _staging_dirs,
    _writer_id,
    confirm_upload,
    is_foreign_checkpoint,
    read_metadata,
    read_state,
    sync_in_background,
    verify_checkpoint,
    write_checkpoint,
)
from tunekit.device import trial_device
from tunekit.errors import CheckpointError, first_line
from tunekit.experiment_dir import CHECKPOINT_DIR
from tunekit.hparams import changed_hyperparameters
from tunekit.state import StateBuffers, TrainingState

__all__ = [
    "BackgroundSaves",
    "trainable_spec",
    "await_write",
    "background_saves_enabled",
    "clone_in_worker",
    "raise_failed_clone",
    "confirm_remote_upload",
    "local_request",
    "prepare_restore",
    "remove_temps",
    "restore_trial_state",
    "save_again",
    "commit_checkpoint",
    "keep_newest_complete",
    "save_in_place",
    "save_snapshot",
    "save_trial_state",
    "stage_checkpoint",
    "trial_payload",
]

logger = logging.getLogger(__name__)


def trainable_spec(cls: type) -> str:
    """``module:qualname`` of the user's trainable class, for ``tunekit resume`` to import.

    ``tune.with_resources`` and ``tune.with_parameters`` hand Tune a subclass
    that Ray makes in ``ray.tune.trainable.util``; the class to record is the
    first one in the MRO that is not Ray's.
    """
    for klass in cls.__mro__:
        if not klass.__module__.startswith("ray."):
            return f"{klass.__module__}:{klass.__qualname__}"
    return f"{cls.__module__}:{cls.__qualname__}"


def trial_payload(
    state: TrainingState,
    *,
    config: Mapping[str, Any],
    mutable: tuple[str, ...],
    trainable: str,
    metrics: Mapping[str, Any] | None = None,
    into: StateBuffers | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a checkpoint of ``state`` holds: ``(state dict, metadata)``.

    ``into``: snapshot the tensors into these reused buffers (two-phase save).
    """
    sd = state.state_dict(into=into)
    hparams = {k: config[k] for k in mutable if k in config}
    sd["hparams"] = hparams
    metadata = {
        "iteration": state.counters.iteration,
        "epoch": state.counters.epoch,
        "trainable": trainable,
        "config": dict(config),
        "hparams": hparams,
        "device": str(trial_device()),
        "models": sorted(state.models),
        "metrics": dict(metrics or {}),
    }
    return sd, metadata


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
    sd, metadata = trial_payload(state, config=config, mutable=mutable, trainable=trainable, metrics=metrics)
    write_checkpoint(directory, sd, metadata=metadata, durable=durable)


# -- two-phase saves --------------------------------------------------------------------

#: Set to 0 (in the workers' environment) to make every save write before it returns.
BACKGROUND_ENV = "TUNEKIT_BACKGROUND_SAVES"
#: Seconds a restore waits for a checkpoint another live process is still writing.
WAIT_ENV = "TUNEKIT_CHECKPOINT_WAIT_S"
_WAIT_DEFAULT_S = 600.0
_WRITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunekit-save", initializer=_lower_priority)


def background_saves_enabled(trainable: tune.Trainable, default: bool = True) -> bool:
    """Whether ``trainable`` saves through :class:`BackgroundSaves`.

    Only on local storage (elsewhere a save is written and uploaded before it
    returns), and not with ``TUNEKIT_BACKGROUND_SAVES=0``.
    """
    value = os.environ.get(BACKGROUND_ENV, "").strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    return default and _ray.has_local_storage(trainable)


class BackgroundSaves:
    """One trial's checkpoint writes, off the training path: at most one in flight.

    A save waits for the previous write (so :attr:`buffers` may be reused),
    snapshots the state into :attr:`buffers` (``TrainingState.state_dict(into=...)``)
    and hands the write of that snapshot to :func:`save_in_place`, which runs
    it on a helper thread. The trainable calls :meth:`wait` before anything
    that needs its checkpoints on storage (restore, reset, stop); a failed
    write is raised there (or by the next save) as a :class:`~tunekit.CheckpointError`.
    """

    def __init__(self) -> None:
        self.buffers = StateBuffers()
        self._future: Future | None = None
        self._target = ""

    def wait(self) -> None:
        """Block until the write in flight (if any) is complete; raise its error."""
        future, self._future = self._future, None
        if future is None:
            return
        error = future.exception()
        if error is not None:
            raise CheckpointError(f"writing checkpoint {self._target} failed: {first_line(error)}") from error

    def submit(self, target: str, job: Callable[[], None]) -> None:
        self.wait()
        self._target = target
        self._future = _WRITER.submit(job)

    def close(self) -> None:
        """Wait for the write in flight, log (not raise) its error, free the buffers."""
        try:
            self.wait()
        except CheckpointError as exc:
            logger.error("tunekit: %s", exc)
        self.buffers.clear()


def await_write(path: str, *, timeout: float | None = None) -> None:
    """If the local checkpoint ``path`` is still being written by a live process, wait for it.

    Returns when its manifest is there, or when no live writer is left (the
    caller then finds it missing and falls back).

    Raises:
        CheckpointError: still being written after ``timeout`` seconds
            (default ``$TUNEKIT_CHECKPOINT_WAIT_S`` or 600).
    """
    limit = float(os.environ.get(WAIT_ENV, _WAIT_DEFAULT_S)) if timeout is None else timeout
    parent, name = os.path.split(os.path.normpath(path))
    start = time.monotonic()
    delay = 0.005
    while not os.path.exists(os.path.join(path, MANIFEST_FILE)):
        try:
            writers = [(h, p) for ckpt, h, p in _staging_dirs(parent) if ckpt == name and _alive(h, p)]
        except FileNotFoundError:
            return
        if not writers:
            return
        waited = time.monotonic() - start
        if waited > limit:
            host, pid = writers[0]
            raise CheckpointError(
                f"checkpoint {path} is still being written (by process {pid} on {host}) after {waited:.0f} s; "
                f"raise {WAIT_ENV} to wait longer"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def keep_newest_complete(final: str) -> None:
    """Before ``final`` is announced: keep the trial's newest complete checkpoint as ``.checkpoint_N.kept``.

    Hard links, so nothing is copied; Tune's ``num_to_keep`` may then delete
    the real directory while ``final`` is still being written. Nothing is
    done when the trial has no complete checkpoint yet, or its newest one is
    kept already.
    """
    parent, name = os.path.split(final)
    match = CHECKPOINT_DIR.match(name)
    if match is None:
        return
    below = int(match[1])
    best: tuple[int, str, bool] | None = None
    with os.scandir(parent) as entries:
        for entry in entries:
            m = CHECKPOINT_DIR.match(entry.name) or _KEPT.match(entry.name)
            if not m or int(m[1]) >= below or not os.path.exists(os.path.join(entry.path, MANIFEST_FILE)):
                continue
            candidate = (int(m[1]), entry.path, entry.name.startswith("."))
            if best is None or candidate[:1] > best[:1] or (candidate[0] == best[0] and candidate[2]):
                best = candidate
    if best is None or best[2]:
        return  # nothing complete yet, or the newest complete one is a kept copy already
    index, source, _ = best
    kept = os.path.join(parent, f".{os.path.basename(source)}.kept")
    if os.path.exists(kept):
        return
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(source)}.keeping-", dir=parent)
    try:
        _link_tree(source, staging)
        if not os.path.exists(os.path.join(staging, MANIFEST_FILE)):
            raise FileNotFoundError(source)  # deleted while it was linked: not a whole copy
        os.rename(staging, kept)
    except OSError:
        # Ray deleted it meanwhile (then nothing complete is left to keep), or it was kept already.
        shutil.rmtree(staging, ignore_errors=True)


def _tidy(parent: str, completed: int) -> None:
    """After checkpoint ``completed`` is whole: drop kept copies before it and dead writers' leftovers."""
    with os.scandir(parent) as entries:
        names = [(e.name, e.path) for e in entries if e.name.startswith(".checkpoint_")]
    for name, path in names:
        kept = _KEPT.match(name)
        staging = _STAGING.match(name)
        if (kept and int(kept[1]) < completed) or ".keeping-" in name or (
            staging and not _alive(staging["host"], int(staging["pid"] or 0))
        ):
            shutil.rmtree(path, ignore_errors=True)


def save_in_place(
    trainable: tune.Trainable, write: Callable[[str], None], *, background: BackgroundSaves | None = None
) -> TrainingResult | None:
    """Save a class trainable's checkpoint straight into local storage.

    Does what ``Trainable.save`` does for a trial on local storage (next
    checkpoint index, the storage check, artifact sync), except that
    ``write(directory)`` writes into a hidden directory beside the final one,
    which is then renamed into place: the bytes are written once, not written
    to a temporary directory and copied. The files reach the disk on a
    helper thread (:func:`tunekit.checkpoint.sync_in_background`) while
    training goes on.

    ``background``: run ``write`` (which must write a snapshot, not live
    state) and the rename on the trial's helper thread, and return at once;
    the trial's newest complete checkpoint is kept until the new one is whole
    (see the module docstring).

    Returns:
        The result ``save()`` returns, or None when the trainable has no local
        storage (the caller then uses ``Trainable.save``).
    """
    target = _ray.next_local_checkpoint(trainable)
    if target is None:
        return None
    final, metrics = target
    staging = stage_checkpoint(final)
    if background is None:
        commit_checkpoint(staging, final, write)
    else:
        background.wait()  # one write in flight; its tidying done before anything is kept
        keep_newest_complete(final)  # nothing to keep before the trial's first: see the module docstring
        background.submit(final, lambda: commit_checkpoint(staging, final, write))
    return _ray.publish_local_checkpoint(trainable, final, metrics)


def save_snapshot(
    trainable: tune.Trainable,
    saves: BackgroundSaves,
    payload: Callable[[StateBuffers], tuple[dict[str, Any], dict[str, Any]]],
) -> TrainingResult | None:
    """A two-phase save: ``payload(buffers)`` snapshots the state now; the helper thread writes it.

    ``payload`` returns ``(state dict, metadata)`` as :func:`trial_payload` does, its
    tensors copied into ``buffers`` (reused from save to save, so the write
    before must be complete first). Returns what :func:`save_in_place` returns.
    """
    saves.wait()
    sd, metadata = payload(saves.buffers)

    def write(directory: str) -> None:
        saves.buffers.wait_copied()
        write_checkpoint(directory, sd, metadata=metadata, durable=False)

    return save_in_place(trainable, write, background=saves)


def stage_checkpoint(final: str) -> str:
    """Create the hidden staging directory a checkpoint is written in (named after its writer)."""
    parent, name = os.path.split(final)
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=f".{name}{_PARTIAL}{_writer_id()}-", dir=parent)


def commit_checkpoint(staging: str, final: str, write: Callable[[str], None]) -> None:
    """Write into ``staging``, rename it to ``final``, fsync in the background, tidy the trial directory."""
    try:
        write(staging)
        if os.path.lexists(final):  # Ray would overwrite it too (a re-saved index)
            shutil.rmtree(final)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    sync_in_background(final)
    parent, name = os.path.split(final)
    if match := CHECKPOINT_DIR.match(name):
        _tidy(parent, int(match[1]))


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


def checkpoint_metrics(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The metrics a checkpoint records (its iteration's), or None.

    A trainable restored from a checkpoint takes them as its own until it
    reports again, so a checkpoint saved before then (PBT saving a trial just
    cloned) records the metrics of the state it holds, not none.
    """
    try:
        metrics = read_metadata(os.fspath(directory)).get("metrics")
    except CheckpointError:
        return None
    return dict(metrics) if isinstance(metrics, dict) and metrics else None


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
        await_write(checkpoint.path)
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
        # Kept copies (two-phase saves) count, after a real directory of the same index.
        other = CHECKPOINT_DIR.match(info.base_name) or _KEPT.match(info.base_name)
        if info.type == pafs.FileType.Directory and other and other[1] != match[1] and (
            newer_too or int(other[1]) < int(match[1])
        ):
            found.append((int(other[1]), not info.base_name.startswith("."), info.path))
    return [tune.Checkpoint(path, filesystem=fs) for _, _, path in sorted(found, reverse=True)]


def local_request(checkpoint: Any) -> TrainingResult | None:
    """What Tune asked to restore, if it is a local directory that exists (else None).

    Such a checkpoint can be loaded directly: :func:`tunekit.checkpoint.read_state`
    verifies it while loading. Only when that fails is :func:`prepare_restore`
    (verify first, fall back) needed.
    """
    requested = _as_training_result(checkpoint)
    ckpt = requested.checkpoint
    if isinstance(ckpt.filesystem, pafs.LocalFileSystem):
        await_write(ckpt.path)  # another worker may still be writing it (a PBT donor)
        if os.path.isdir(ckpt.path):
            return requested
    return None


def prepare_restore(checkpoint: Any, *, trial_dir: str | None = None) -> tuple[TrainingResult | None, list[str]]:
    """Resolve what Tune asked to restore into a good, local checkpoint.

    ``trial_dir``: the restoring trial's own local directory. A checkpoint in
    it that was announced but never completed, because its writer died during
    the trial's first two-phase save (nothing complete before it), means
    "start afresh": the result is then None.

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
        if report.ok:
            return TrainingResult(checkpoint=local, metrics=requested.metrics), temps
        if report.problems == [f"no {MANIFEST_FILE}"] and is_foreign_checkpoint(local):
            # The training code reported it itself (tune.report(checkpoint=...)): hand it back as
            # Ray would, unverified; only checkpoints tunekit wrote are verified and fall back.
            _note_foreign(requested.checkpoint.path)
            return TrainingResult(checkpoint=local, metrics=requested.metrics), temps
        if report.status == "unsupported":  # not damaged: falling back would lose its progress
            raise CheckpointError(f"cannot restore: checkpoint {report.describe()}")
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


_FOREIGN_NOTED: set[str] = set()


def _note_foreign(path: str) -> None:
    """Say once per process that checkpoints the training code writes itself are not verified."""
    if not _FOREIGN_NOTED:
        logger.warning("tunekit: restoring %s, a checkpoint the training code wrote itself: it carries no "
                       "integrity manifest, so it is handed back as Ray would, unverified", path)
    _FOREIGN_NOTED.add(path)


def _first_write_interrupted(checkpoint: tune.Checkpoint, trial_dir: str | None) -> bool:
    """Whether ``checkpoint``, in ``trial_dir``, has a staging directory whose writer is dead."""
    if trial_dir is None or not isinstance(checkpoint.filesystem, pafs.LocalFileSystem):
        return False
    parent, name = os.path.split(os.path.normpath(checkpoint.path))
    if os.path.normpath(parent) != os.path.normpath(trial_dir):
        return False  # another trial's (a PBT donor's): not this trial's start
    try:
        return any(ckpt == name and not _alive(h, p) for ckpt, h, p in _staging_dirs(parent))
    except FileNotFoundError:
        return False


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
    except Exception as exc:
        trainable._tunekit_clone_error = exc
        raise


def raise_failed_clone(trainable: tune.Trainable) -> None:
    """Raise the error of a failed :func:`clone_in_worker`, once."""
    error = trainable.__dict__.pop("_tunekit_clone_error", None)
    if error is not None:
        raise CheckpointError(f"cloning a PBT donor in this worker failed: {first_line(error)}") from error
