"""A checkpoint directory's way into the trial's storage through Ray: into an index never used, and to remote
storage with tunekit's commit mark, the manifest, last.

Part of :mod:`tunekit._ray` (see its docstring for the private names); re-exported there.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Callable
from typing import Any

from ray import tune
from ray.train._internal.checkpoint_manager import _TrainingResult as TrainingResult

from tunekit import _ray  # (the package this module is part of: its names are looked up when called)

__all__ = ["report_checkpoint_dir", "report_with_checkpoint", "session_storage"]

logger = logging.getLogger(__name__)


def report_checkpoint_dir(trainable: tune.Trainable, directory: str) -> TrainingResult:
    """Upload a checkpoint directory the way a class trainable's ``save`` does (into an unused index).

    To remote storage the manifest, tunekit's commit mark, goes last: first the
    manifest an earlier, unregistered attempt at the same index left there is
    deleted (Ray writes a retry into the index it never registered), then Ray
    uploads the rest, then the manifest. A kill at any point leaves a
    checkpoint without a manifest (an interrupted upload, which readers name
    so), never one whose manifest describes other bytes.
    """
    storage = _ray.trainable_storage(trainable)
    _skip_used_indexes(storage)
    _abort_killed_uploads(storage)
    if not _commits_last(storage, directory):
        return trainable._report_class_trainable_checkpoint(directory, directory)
    from ray.train._internal.storage import StorageContext

    target = posixpath.join(storage.trial_fs_path,
                            StorageContext._make_checkpoint_dir_name(storage.current_checkpoint_index + 1))
    return _manifest_last(storage.storage_filesystem, target, directory,
                          lambda: trainable._report_class_trainable_checkpoint(directory, directory))


def _commits_last(storage: Any, directory: str) -> bool:
    """Whether a checkpoint ``directory`` goes to remote storage with its manifest last (a tunekit one)."""
    import pyarrow.fs as pafs

    from tunekit.checkpoint._manifest import MANIFEST_FILE

    return storage is not None and type(storage.storage_filesystem) is not pafs.LocalFileSystem and \
        os.path.exists(os.path.join(directory, MANIFEST_FILE))


def _manifest_last(fs: Any, target: str, directory: str, upload: Callable[[], Any]) -> Any:
    """Delete the manifest an earlier attempt left at ``target``, ``upload()`` the rest of ``directory``
    there, then write its manifest: a kill at any point leaves no manifest over other bytes."""
    import pyarrow.fs as pafs

    from tunekit.checkpoint._manifest import MANIFEST_FILE

    stale = posixpath.join(target, MANIFEST_FILE)
    if fs.get_file_info(stale).type != pafs.FileType.NotFound:
        fs.delete_file(stale)
    held = os.path.join(directory, MANIFEST_FILE)
    with open(held, "rb") as fh:
        manifest = fh.read()
    os.remove(held)
    result = upload()
    with fs.open_output_stream(stale) as out:
        out.write(manifest)
    return result


def report_with_checkpoint(metrics: dict[str, Any], directory: str) -> None:
    """``tune.report(metrics, checkpoint=directory)`` from a function trial, into an index never used in the
    trial's directory (Ray persists the checkpoint into ``checkpoint_<its counter>``); to remote storage a
    tunekit checkpoint's manifest last, as :func:`report_checkpoint_dir` uploads it."""
    storage = session_storage()
    _skip_used_indexes(storage)
    _abort_killed_uploads(storage)
    checkpoint = tune.Checkpoint.from_directory(directory)
    if not _commits_last(storage, directory):
        tune.report(metrics, checkpoint=checkpoint)
        return
    persist = storage.persist_current_checkpoint  # (Ray calls it with the index it is about to use set)

    def manifest_last(ckpt: Any) -> Any:
        return _manifest_last(storage.storage_filesystem, storage.checkpoint_fs_path, directory,
                              lambda: persist(ckpt))

    storage.persist_current_checkpoint = manifest_last
    try:
        tune.report(metrics, checkpoint=checkpoint)
    finally:
        del storage.persist_current_checkpoint


def session_storage() -> Any:
    """Inside a Tune trial: its ``StorageContext`` (the one Ray persists reported checkpoints through)."""
    return tune.get_context().get_storage()


def _abort_killed_uploads(storage: Any) -> None:
    """At a trial's first save in this worker, abort the multipart uploads an earlier worker of the trial,
    killed inside an upload, left open in its checkpoint directories (remote storage; once a trial)."""
    if storage is None or getattr(storage, "_tunekit_uploads_checked", None) == storage.trial_fs_path:
        return
    storage._tunekit_uploads_checked = storage.trial_fs_path
    from tunekit.checkpoint._uploads import abort_checkpoint_uploads

    try:
        aborted = abort_checkpoint_uploads(storage.storage_filesystem, storage.trial_fs_path)
    except Exception as exc:  # (they stay for the next resume or gc --leftovers; the save goes on)
        logger.warning("tunekit: could not list the interrupted uploads in %s: %s", storage.trial_fs_path, exc)
        return
    if aborted:
        logger.info("tunekit: aborted %d interrupted multipart upload(s) an earlier worker left in %s",
                    aborted, storage.trial_fs_path)


def _skip_used_indexes(storage: Any) -> None:
    """Ray's next checkpoint index raised above any used in the trial's directory (local storage).

    Ray's counter lags after a worker dies between persisting a checkpoint and
    the driver registering it (:func:`tunekit.checkpoint._announced.claim_index`): Ray
    would then write into that directory again, over a checkpoint that may be
    registered already. Ray adds one to the counter before it persists."""
    import pyarrow.fs as pafs

    if storage is None or type(storage.storage_filesystem) is not pafs.LocalFileSystem:
        return
    from tunekit.checkpoint._announced import claim_index

    storage.current_checkpoint_index = claim_index(storage.trial_fs_path, storage.current_checkpoint_index + 1) - 1
