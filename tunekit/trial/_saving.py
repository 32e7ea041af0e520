"""Saving one trial's checkpoint: the two-phase pipeline, in-place writes, second saves as links.

Implementation tier, shared by :class:`tunekit.TorchTrainable` and the function
adapter (:func:`tunekit.function_trainable`).

Saving to local storage goes through :func:`save_in_place`: the checkpoint is
written once, in a staging directory beside its final one
(:func:`tunekit.checkpoint._trial_dir.stage_checkpoint`), and renamed into place (Ray
would write it to a temporary directory and copy it). Elsewhere the caller
saves as Ray does and :func:`confirm_remote_upload` checks what arrived.

Two-phase saves (the default on local storage for a state of at least
``background_saves_min_bytes``, see :class:`BackgroundSaves` and
:meth:`tunekit.trial._checkpointer.TrialCheckpointer.save`):
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
* Nothing half-written is ever read: an announced checkpoint is an empty
  directory (:func:`tunekit.checkpoint._announced.announce`) until a rename puts the
  whole checkpoint, manifest last, in its place.
* An index is announced once: :func:`tunekit.checkpoint._announced.claim_index` takes
  one above every index the trial's directory ever held, so Ray never
  registers one path twice and a save never replaces (or deletes) a
  directory Ray registered.
* A worker handed to another trial (actor reuse) does not wait for the
  previous trial's write (:meth:`BackgroundSaves.hand_over`).

Call order (followed by :class:`tunekit.trial._checkpointer.TrialCheckpointer`, the
one caller): :meth:`BackgroundSaves.wait` before anything that needs the
trial's checkpoints on storage (restore, reset, stop); per save, one of
:func:`save_again` (the iteration was saved already), :func:`save_snapshot`
(two-phase), :func:`save_in_place` (written now) or Ray's own ``save`` then
:func:`confirm_remote_upload`; :meth:`BackgroundSaves.close` at cleanup. Every
local write is fsynced through the trial's :class:`Durability`.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import pyarrow.fs as pafs
from ray import tune

from tunekit import _env, _ray

from tunekit.checkpoint import _faults
from tunekit._ray import TrainingResult
from tunekit.checkpoint._announced import announce, claim_index, drop_unregistered
from tunekit.checkpoint._durability import Durability
from tunekit.checkpoint._pins import release_adopted_pin
from tunekit.checkpoint._priority import lend_priority, submit_below
from tunekit.checkpoint._trial_dir import (CHECKPOINT_DIR, has_hidden_checkpoints, keep_newest_complete, link_tree,
                               stage_checkpoint, tidy)
from tunekit.checkpoint._directory import confirm_upload, write_checkpoint
from tunekit.errors import CheckpointError, first_line
from tunekit.trial.state import StateBuffers
from tunekit.storage._location import directory_bytes

__all__ = [
    "BackgroundSaves", "Durability", "background_saves_enabled", "commit_checkpoint", "confirm_remote_upload",
    "drain_writes", "release_remote_pin", "save_again", "save_in_place", "save_snapshot", "trainable_spec",
    "write_and_report"
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


_WRITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunekit-save")
#: Writes whose save waits for them (:attr:`BackgroundSaves.urgent`), at training's priority: training waits.
_URGENT = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunekit-save-now")


def drain_writes() -> None:
    """Block until every two-phase write submitted in this process so far is complete (for tests and tools)."""
    for pool in (_WRITER, _URGENT):
        pool.submit(lambda: None).result()


def background_saves_enabled(trainable: tune.Trainable, default: bool = True) -> bool:
    """Whether ``trainable`` saves through :class:`BackgroundSaves`.

    Only on local storage (elsewhere a save is written and uploaded before it
    returns), and not with ``TUNEKIT_BACKGROUND_SAVES=0``.
    """
    if not _env.get_flag("TUNEKIT_BACKGROUND_SAVES"):
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
        self._previous_trial = False
        #: Seconds the last completed write took (the autopilot's write time), None before one completed.
        self.last_write_s: float | None = None
        #: The next write's save waits for it: it runs on a thread of training's priority, not a lower one.
        self.urgent = False

    def wait(self) -> None:
        """Block until the write in flight (if any) is complete; raise its error (log it if it was the
        previous trial's: see :meth:`hand_over`)."""
        future, self._future = self._future, None
        if future is None:
            return
        lend_priority(future)  # (training waits for it now: not below training's priority any more)
        error = future.exception()
        previous, self._previous_trial = self._previous_trial, False
        if error is None:
            return
        failure = CheckpointError(f"writing checkpoint {self._target} failed: {first_line(error)}")
        if previous:  # not this trial's to fail for; that trial falls back to its kept checkpoint
            logger.error("tunekit: %s", failure)
            return
        raise failure from error

    def hand_over(self) -> None:
        """The worker takes a new trial (actor reuse) while this write may still be in flight.

        The write goes on (it reads only :attr:`buffers`, which the next save
        reuses after :meth:`wait`); its failure is the previous trial's, so it
        is logged, never raised to the new one. Not waiting here keeps Tune's
        ``reset`` short: a worker killed inside ``reset`` reports its death
        twice to Tune, which then errors the trial it was starting instead of
        retrying it.
        """
        if self._future is not None:
            self._previous_trial = True

    def submit(self, target: str, job: Callable[[], None]) -> None:
        self.wait()
        self._target = target
        self._future = (submit_below(_URGENT, self._timed, job, step=0) if self.urgent
                        else submit_below(_WRITER, self._timed, job))

    def _timed(self, job: Callable[[], None]) -> None:
        start = time.perf_counter()
        job()
        self.last_write_s = time.perf_counter() - start

    def close(self) -> None:
        """Wait for the write in flight, log (not raise) its error, free the buffers."""
        try:
            self.wait()
        except CheckpointError as exc:
            logger.error("tunekit: %s", exc)
        self.buffers.clear()


def save_in_place(
    trainable: tune.Trainable,
    write: Callable[[str], None],
    *,
    durability: Durability,
    background: BackgroundSaves | None = None,
    whole_filesystem: bool = False,
) -> TrainingResult | None:
    """Save a class trainable's checkpoint straight into local storage.

    Does what ``Trainable.save`` does for a trial on local storage (next
    checkpoint index, the storage check, artifact sync), except that
    ``write(directory)`` writes into a hidden directory beside the final one,
    which is then renamed into place: the bytes are written once, not written
    to a temporary directory and copied. The files reach the disk on a
    helper thread (``durability``, :meth:`Durability.sync`) while
    training goes on.

    ``background``: run ``write`` (which must write a snapshot, not live
    state) and the rename on the trial's helper thread, and return at once;
    the trial's newest complete checkpoint is kept until the new one is whole
    (see the module docstring). ``whole_filesystem``: see :meth:`Durability.sync`.

    Returns:
        The result ``save()`` returns, or None when the trainable has no local
        storage (the caller then uses ``Trainable.save``).
    """
    # (announced before it is whole: the index is recorded; written now: its name is its record)
    target = _ray.next_local_checkpoint(trainable, claim_index if background is not None else _unrecorded)
    if target is None:
        return None
    final, metrics = target
    staging = stage_checkpoint(final)
    if background is None:
        commit_checkpoint(staging, final, write, durability, whole_filesystem=whole_filesystem)
    else:
        background.wait()  # one write in flight; its tidying done before anything is kept
        keep_newest_complete(final)  # nothing to keep before the trial's first: see the module docstring
        announce(final)
        background.submit(final, lambda: commit_checkpoint(staging, final, write, durability))
    return _ray.publish_local_checkpoint(trainable, final, metrics)


def _unrecorded(trial_dir: str, proposed: int) -> int:
    return claim_index(trial_dir, proposed, record=False)


def save_snapshot(
    trainable: tune.Trainable,
    saves: BackgroundSaves,
    payload: Callable[[StateBuffers], tuple[dict[str, Any], dict[str, Any]]],
    *,
    durability: Durability,
) -> TrainingResult | None:
    """A two-phase save: ``payload(buffers)`` snapshots the state now; the helper thread writes it.

    ``payload`` returns ``(state dict, metadata)`` as
    :meth:`tunekit.trial._checkpointer.TrialContent.payload` does, its
    tensors copied into ``buffers`` (reused from save to save, so the write
    before must be complete first). Returns what :func:`save_in_place` returns.
    """
    saves.wait()
    sd, metadata = payload(saves.buffers)

    def write(directory: str) -> None:
        saves.buffers.wait_copied()
        write_checkpoint(directory, sd, metadata=metadata, durable=False, staged=True)

    return save_in_place(trainable, write, durability=durability, background=saves)


def commit_checkpoint(staging: str, final: str, write: Callable[[str], None], durability: Durability, *,
                      whole_filesystem: bool = False) -> None:
    """Write into ``staging``, rename it to ``final``, fsync in the background, tidy the trial directory."""
    try:
        write(staging)
        # ``final`` is absent, or the empty directory :func:`announce` made: the rename replaces it atomically.
        # Its index was never used before (:func:`claim_index`), so nothing else can be there; were it, the
        # rename fails (a directory not empty) and nothing of anyone's is deleted.
        os.rename(staging, final)
        _faults.reached("committed")
    except BaseException as exc:
        written = _local_bytes(staging) if _no_space(exc) else None
        shutil.rmtree(staging, ignore_errors=True)
        if written is not None:
            raise CheckpointError(_no_space_line(final, written)) from exc
        raise
    durability.sync(final, whole_filesystem=whole_filesystem)
    parent, name = os.path.split(final)
    if match := CHECKPOINT_DIR.match(name):
        if has_hidden_checkpoints(parent):  # (one scan, not three, when nothing is left over: the usual case)
            drop_unregistered(parent, int(match[1]))  # first: it needs the dead writers' staging directories
            tidy(parent, int(match[1]))
        release_adopted_pin(parent, int(match[1]))


def _no_space(exc: BaseException) -> bool:
    """Whether a write failed for lack of space (torch.save wraps the ``OSError`` in a ``RuntimeError``)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _local_bytes(path: str) -> int:
    return directory_bytes(pafs.LocalFileSystem(), path)


def _no_space_line(final: str, written: int) -> str:
    """One line: where the disk is full, about how many bytes the checkpoint needs, how many are free."""
    from tunekit.table import format_bytes

    parent, name = os.path.split(final)
    previous = [e for e in os.scandir(parent) if CHECKPOINT_DIR.match(e.name) and e.path != final] \
        if os.path.isdir(parent) else []
    sizes = [written] + ([_local_bytes(max(previous, key=lambda e: e.name).path)] if previous else [])
    needs = max(sizes)  # the previous checkpoint holds the same state: about as many bytes
    free = shutil.disk_usage(parent).free if os.path.isdir(parent) else 0
    return (f"no space left on the device of {parent}: {name} needs about {format_bytes(needs)} ({needs} bytes), "
            f"{format_bytes(free)} free; its partial write was removed, the trial's previous checkpoint is untouched")


def save_again(trainable: tune.Trainable, previous: Any, *, durability: Durability) -> TrainingResult | None:
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
    return save_in_place(trainable, lambda staging: link_tree(source, staging), durability=durability)


def write_and_report(trainable: tune.Trainable, write: Callable[[str], Any]) -> TrainingResult:
    """Write a checkpoint with ``write`` into a temporary directory that Ray then persists into the trial's
    next index, as ``Trainable.save`` does (to remote storage with the manifest last:
    :func:`tunekit._ray.report_checkpoint_dir`)."""
    import tempfile

    directory = tempfile.mkdtemp(prefix="tunekit-ckpt-")
    try:
        write(directory)
        return _ray.report_checkpoint_dir(trainable, directory)
    finally:
        if _ray.trainable_storage(trainable) is not None:  # (without storage, outside Tune: the checkpoint)
            shutil.rmtree(directory, ignore_errors=True)


def release_remote_pin(trainable: tune.Trainable, result: Any) -> None:
    """A checkpoint of the trial is whole on remote storage: the PBT donor's pin it cloned goes if it is newer
    (:func:`tunekit.checkpoint._pins.release_adopted_pin`; a local checkpoint's commit does the same)."""
    checkpoint = getattr(result, "checkpoint", None)
    storage = _ray.trainable_storage(trainable)
    if checkpoint is None or storage is None or isinstance(checkpoint.filesystem, pafs.LocalFileSystem):
        return
    match = CHECKPOINT_DIR.match(os.path.basename(checkpoint.path.rstrip("/")))
    if match:
        release_adopted_pin(storage.trial_fs_path, int(match[1]), checkpoint.filesystem)


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
