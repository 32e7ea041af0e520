"""A multi-worker trial's Tune checkpoint: a pointer to its Ray Train checkpoint; and the Train checkpoints a
kill cut short, which the trial's next pointer's write removes.

Implementation tier of :mod:`tunekit.multiworker` (see :mod:`tunekit.multiworker.trial`).
"""

from __future__ import annotations

import logging
import posixpath
from typing import Any

import pyarrow.fs as pafs

from tunekit.checkpoint._interrupted import cut_short_parts
from tunekit.checkpoint._manifest import read_metadata
from tunekit.checkpoint._directory import write_checkpoint
from tunekit.errors import CheckpointError
from tunekit.checkpoint._layout import POINTER_KEY, pointer_value
from tunekit.checkpoint._trial_dir import is_train_checkpoint
from tunekit.storage._location import resolve_storage

__all__ = ["checkpoint_names", "drop_cut_short", "write_pointer"]

logger = logging.getLogger("tunekit.multiworker.trial")


def checkpoint_names(filesystem: Any, run_dir: str) -> list[str]:
    """The checkpoint directories a Train run has written so far (none: an empty list)."""
    where = resolve_storage(run_dir, filesystem=filesystem)
    try:
        infos = where.filesystem.get_file_info(pafs.FileSelector(where.path, allow_not_found=True))
    except OSError:
        return []
    return sorted(posixpath.basename(i.path) for i in infos
                  if i.type == pafs.FileType.Directory and is_train_checkpoint(posixpath.basename(i.path)))


def drop_cut_short(filesystem: Any, path: str, checked: set[str]) -> None:
    """Delete the Train checkpoints older than ``path`` (just reported) beside it that a kill cut short (a
    rank's part or the whole's manifest missing: never reported, no pointer names them), as a single-worker
    trial's next save removes its interrupted writes. Each name is looked at once; payloads are not read."""
    where = resolve_storage(path, filesystem=filesystem)
    run_dir, newest = posixpath.split(where.path.rstrip("/"))
    checked.add(newest)
    try:
        older = [n for n in checkpoint_names(filesystem, posixpath.dirname(path.rstrip("/")))
                 if n < newest and n not in checked]
        checked.update(older)
        for cut in cut_short_parts(where.filesystem, run_dir, older):
            where.filesystem.delete_dir(posixpath.join(run_dir, cut))
            logger.info("tunekit: %s: removed %s, a checkpoint write a kill cut short", run_dir, cut)
    except OSError as exc:  # tidying only: `tunekit gc --leftovers` removes what is left
        logger.warning("tunekit: %s: could not remove a cut-short checkpoint write: %s", run_dir, exc)


def write_pointer(directory: str, path: str, name: str, config: dict[str, Any], filesystem: Any, *,
                  trial_path: str | None = None) -> None:
    """Write into ``directory`` the Tune checkpoint that points at the Train checkpoint ``path`` (relative to the
    pointer when both are in ``trial_path``, the trial's directory: see :data:`POINTER_KEY`)."""
    try:
        iteration = read_metadata(resolve_storage(path, filesystem=filesystem)).get("iteration")
    except CheckpointError:
        iteration = None  # not a tunekit checkpoint (a loop reporting its own): the pointer says so
    value = pointer_value(trial_path, path) if trial_path else path
    meta = {POINTER_KEY: value, "trainable": name, "config": config, "iteration": iteration}
    write_checkpoint(directory, {POINTER_KEY: value}, metadata=meta, durable=False)
