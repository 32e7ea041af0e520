"""Checkpoints whose write never reached its commit mark, the manifest: interrupted, not damaged.

Implementation tier beside :mod:`tunekit.checkpoint._manifest` (its readers: ``verify``, the read model, ``gc``).
A checkpoint is committed by its manifest, written last (locally by a rename of the whole directory; to
remote storage uploaded after every other file, see :func:`tunekit._ray.report_checkpoint_dir`). A
directory with tunekit's files and no manifest that nothing registered is a write a kill cut short.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable

import pyarrow.fs as pafs

from tunekit.checkpoint._manifest import (MANIFEST_FILE, NOT_WRITTEN, CheckpointLocation, CheckpointReport,
                               is_tunekit_checkpoint, locate)
from tunekit.checkpoint._ranks import RANKS_FILE, rank_dir, read_ranks

__all__ = ["INTERRUPTED_WRITE", "cut_short_parts", "interrupted_write"]

#: What readers say of a checkpoint directory :func:`interrupted_write` describes.
INTERRUPTED_WRITE = (f"a write that never completed (tunekit's files without the {MANIFEST_FILE} written last as its "
                     "commit mark: its writer was killed); not damage, nothing registered is lost; the trial's next "
                     "save there, or `tunekit gc --leftovers`, removes it")


#: A rank's part of a multi-worker checkpoint that its rank never finished writing (verify's words for it).
_UNWRITTEN_PART = re.compile(rf"rank-\d+/: (missing \(the checkpoint was written by \d+ workers\)|"
                             rf"no {re.escape(MANIFEST_FILE)}|{re.escape(NOT_WRITTEN)})")


def interrupted_write(report: CheckpointReport, location: CheckpointLocation) -> bool:
    """Whether ``report`` (of the checkpoint at ``location``) is a write that never reached its commit mark:
    some of tunekit's files (a multi-worker checkpoint's: a rank's part), no manifest (remote uploads put the
    manifest last; a retry rewrites the same name; a multi-worker checkpoint's manifest over every rank's part
    is written once they all are; a rank killed in its write leaves its part without its manifest, or none)."""
    if report.status == "incomplete" and report.problems and all(_UNWRITTEN_PART.fullmatch(p)
                                                                  for p in report.problems):
        return True
    if report.problems != [f"no {MANIFEST_FILE}"]:
        return False
    if is_tunekit_checkpoint(location):
        return True
    where = locate(location)
    names = [i.base_name for i in where.filesystem.get_file_info(pafs.FileSelector(where.path, allow_not_found=True))]
    return any(n == "ranks.json" or re.fullmatch(r"rank-\d+", n) for n in names)


def cut_short_parts(fs: pafs.FileSystem, run_dir: str, names: Iterable[str]) -> list[str]:
    """Of the multi-worker checkpoints ``names`` in ``run_dir``, those a kill cut short: tunekit's parts
    there, the whole's manifest or some rank's missing. Reads no payload: a listing, ``ranks.json`` and the
    ranks' manifests' existence."""
    out = []
    for name in names:
        path = posixpath.join(run_dir, name)
        listed = {i.base_name for i in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))}
        if RANKS_FILE not in listed and not any(re.fullmatch(r"rank-\d+", n) for n in listed):
            continue  # (not a multi-worker checkpoint of tunekit's)
        if MANIFEST_FILE not in listed:
            out.append(name)
            continue
        try:
            world = int(read_ranks(fs, path)["world_size"])
        except (ValueError, OSError, KeyError, TypeError):
            continue  # (damage, for verify to name)
        marks = fs.get_file_info([posixpath.join(path, rank_dir(r), MANIFEST_FILE) for r in range(world)])
        if any(m.type != pafs.FileType.File for m in marks):
            out.append(name)
    return out
