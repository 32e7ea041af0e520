"""Checkpoints whose write never reached its commit mark, the manifest: interrupted, not damaged.

Implementation tier beside :mod:`tunekit._manifest` (its readers: ``verify``, the read model, ``gc``).
A checkpoint is committed by its manifest, written last (locally by a rename of the whole directory; to
remote storage uploaded after every other file, see :func:`tunekit._ray.report_checkpoint_dir`). A
directory with tunekit's files and no manifest that nothing registered is a write a kill cut short.

Tested in ``tests/tunekit/test_verify.py`` and ``tests/tunekit/test_multiworker.py``.
"""

from __future__ import annotations

import re

import pyarrow.fs as pafs

from tunekit._manifest import MANIFEST_FILE, CheckpointLocation, CheckpointReport, is_tunekit_checkpoint, locate

__all__ = ["INTERRUPTED_WRITE", "interrupted_write"]

#: What readers say of a checkpoint directory :func:`interrupted_write` describes.
INTERRUPTED_WRITE = (f"a write that never completed (tunekit's files without the {MANIFEST_FILE} written last as its "
                     "commit mark: its writer was killed); not damage, nothing registered is lost; the trial's next "
                     "save there, or `tunekit gc --leftovers`, removes it")


def interrupted_write(report: CheckpointReport, location: CheckpointLocation) -> bool:
    """Whether ``report`` (of the checkpoint at ``location``) is a write that never reached its commit mark:
    some of tunekit's files (a multi-worker checkpoint's: a rank's part), no manifest (remote uploads put the
    manifest last; a retry rewrites the same name; a multi-worker checkpoint's manifest over every rank's part
    is written once they all are)."""
    if report.problems != [f"no {MANIFEST_FILE}"]:
        return False
    if is_tunekit_checkpoint(location):
        return True
    where = locate(location)
    names = [i.base_name for i in where.filesystem.get_file_info(pafs.FileSelector(where.path, allow_not_found=True))]
    return any(n == "ranks.json" or re.fullmatch(r"rank-\d+", n) for n in names)
