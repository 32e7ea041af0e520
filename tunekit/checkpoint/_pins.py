"""PBT donors' checkpoints pinned for their clones: made when the scheduler picks the donor, kept while
anything may restore from them.

Implementation tier, beside :mod:`tunekit.checkpoint._trial_dir` (the names: ``.checkpoint_N.pin-XXXX``).
Ray's ``num_to_keep`` never deletes a pin. The clone that restores from one
adopts it (:func:`adopt_pin`): Ray names the pin as the clone's checkpoint until
the clone's next checkpoint is registered, so the pin stays until a
checkpoint of the clone newer than the exploit is complete
(:func:`release_adopted_pin`). Ray may name the pin after that (the driver
had not registered that checkpoint yet, or was killed first): a restore of it
then takes the clone's own checkpoints after the exploit (:func:`cloned_from`).
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import uuid

import pyarrow.fs as pafs

from tunekit.checkpoint._announced import highest_index
from tunekit.checkpoint._manifest import MANIFEST_FILE, read_metadata
from tunekit.checkpoint._trial_dir import CHECKPOINT_DIR, PINNED_COPY, await_write, kept_name, link_tree
from tunekit.errors import CheckpointError
from tunekit.storage._location import Storage

__all__ = [
    "PIN_RECORD", "adopt_pin", "adopted_pin", "cloned_from", "is_pinned", "pin_checkpoint", "release_adopted_pin",
    "remove_pin", "unpinned"
]

#: The PBT donor's pin a trial restored from, until the trial has a complete checkpoint of its own after it.
PIN_RECORD = ".tunekit-pin.json"


def adopt_pin(trial_dir: str, pin: str, fs: pafs.FileSystem | None = None) -> None:
    """The trial in ``trial_dir`` (on ``fs``; default local disk) restored from ``pin`` (a PBT clone): keep the
    pin while anything may restore from it.

    Ray names the pin as the trial's checkpoint until the trial's next one is
    registered, and a worker killed before that next one is whole is
    restored from the pin again, or falls back to it. :func:`release_adopted_pin` removes the
    pin once a checkpoint of the trial newer than the exploit is complete; a
    pin adopted before it (two exploits before a save) goes at once. The same
    on every storage: the record is a file of the trial's directory there.
    """
    previous = adopted_pin(trial_dir, fs)
    _write_record(trial_dir, {"pin": pin, "after": _highest(trial_dir, fs)}, fs)
    if previous is not None and previous[0] != pin:
        _remove(fs, previous[0])


def adopted_pin(trial_dir: str, fs: pafs.FileSystem | None = None) -> tuple[str, int] | None:
    """``(pin path, the trial's highest checkpoint index when it restored from it)``, or None (also once the
    pin is released)."""
    record = _read_record(trial_dir, fs)
    return None if record is None or record[2] else record[:2]


def cloned_from(trial_dir: str, fs: pafs.FileSystem | None = None) -> tuple[str, int] | None:
    """``(pin path, the trial's highest checkpoint index when it restored from it)`` of the trial's last
    clone, the pin kept or released; None if the trial never restored from a pin here."""
    record = _read_record(trial_dir, fs)
    return None if record is None else record[:2]


def _local(fs: pafs.FileSystem | None) -> bool:
    return fs is None or isinstance(fs, pafs.LocalFileSystem)


def _read_record(trial_dir: str, fs: pafs.FileSystem | None = None) -> tuple[str, int, bool] | None:
    path = posixpath.join(trial_dir, PIN_RECORD)
    try:
        if _local(fs):
            with open(path) as fh:
                record = json.load(fh)
        else:
            with fs.open_input_stream(path) as stream:  # type: ignore[union-attr]
                record = json.loads(stream.read())
        return str(record["pin"]), int(record["after"]), bool(record.get("released"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_record(trial_dir: str, record: dict[str, object], fs: pafs.FileSystem | None = None) -> None:
    if not _local(fs):  # (an object appears whole or not at all)
        with fs.open_output_stream(posixpath.join(trial_dir, PIN_RECORD)) as out:  # type: ignore[union-attr]
            out.write(json.dumps(record).encode())
        return
    temporary = os.path.join(trial_dir, f"{PIN_RECORD}.{os.getpid()}")
    with open(temporary, "w") as fh:
        json.dump(record, fh)
    os.replace(temporary, os.path.join(trial_dir, PIN_RECORD))


def _highest(trial_dir: str, fs: pafs.FileSystem | None) -> int:
    """The highest checkpoint index the trial's directory holds (-1 if none)."""
    if _local(fs):
        return highest_index(trial_dir)
    found = [int(m[1]) for info in fs.get_file_info(pafs.FileSelector(trial_dir, allow_not_found=True))  # type: ignore[union-attr]
             if (m := CHECKPOINT_DIR.match(info.base_name))]
    return max(found, default=-1)


def _remove(fs: pafs.FileSystem | None, path: str) -> None:
    if _local(fs):
        shutil.rmtree(path, ignore_errors=True)
    else:
        _delete(fs, path)  # type: ignore[arg-type]


def release_adopted_pin(trial_dir: str, completed: int, fs: pafs.FileSystem | None = None) -> None:
    """Checkpoint ``completed`` of the trial is whole: the pin it restored from goes if the checkpoint is newer.

    The record stays, marked released: Ray may still name the pin as the trial's checkpoint (the driver
    registers ``completed`` later, or was killed before it did), and a restore of the gone pin then takes
    the trial's own checkpoints after the clone (:func:`cloned_from`), not the donor's others.
    """
    adopted = adopted_pin(trial_dir, fs)
    if adopted is not None and completed > adopted[1]:
        _write_record(trial_dir, {"pin": adopted[0], "after": adopted[1], "released": True}, fs)
        _remove(fs, adopted[0])


def unpinned(path: str) -> str:
    """The checkpoint a pin stands for (``.../.checkpoint_N.pin-X`` -> ``.../checkpoint_N``); other paths as given."""
    parent, name = posixpath.split(path.rstrip("/"))
    m = PINNED_COPY.match(name)
    return posixpath.join(parent, m[1]) if m else path


def is_pinned(path: str) -> bool:
    """Whether ``path`` is a pinned copy (:func:`pin_checkpoint`), which its one reader removes."""
    return PINNED_COPY.match(posixpath.basename(path.rstrip("/"))) is not None


def pin_checkpoint(fs: pafs.FileSystem, path: str, iteration: int | None = None) -> str | None:
    """Pin checkpoint ``path`` for a PBT clone that reads it later: a copy beside it, named
    ``.checkpoint_N.pin-XXXX``, that Ray's ``num_to_keep`` never deletes.

    Local storage: hard links (no bytes copied), after a write still in
    flight (a two-phase save of the donor) is complete. Other storage: a copy
    on the storage itself (``copy_file``, server-side on S3), the manifest
    last. The reader removes the pin once it has read it.

    If Ray deleted ``path`` already, what holds the same state is pinned: its
    kept copy, or (``iteration`` given) a checkpoint of the same trial saved
    at that iteration. Tune saves one iteration twice when PBT's save and the
    frequency save meet, and ``num_to_keep=1`` deletes the first of the two
    at once, sometimes the very one PBT recorded as the donor's.

    Returns:
        The pin's path, or None when nothing holding that state is left: the
        clone then reads ``path`` as before (and falls back if it is gone).
    """
    parent, name = posixpath.split(path.rstrip("/"))
    if not CHECKPOINT_DIR.match(name):
        return None
    pin = posixpath.join(parent, f".{name}.pin-{uuid.uuid4().hex[:12]}")
    if isinstance(fs, pafs.LocalFileSystem):
        # A two-phase save announces its checkpoint before the directory exists (renamed into place once
        # written): wait for the donor's write in flight, or it looks deleted and nothing is pinned.
        await_write(path)
    for source in _same_state(fs, parent, name, iteration):
        if isinstance(fs, pafs.LocalFileSystem):
            staging = f"{pin}.linking"
            try:
                os.makedirs(staging)
                link_tree(source, staging)
                if os.path.isdir(source):  # still there after linking it: a whole copy
                    os.rename(staging, pin)
                    return pin
            except OSError:
                pass  # deleted while it was linked
            shutil.rmtree(staging, ignore_errors=True)
            continue
        try:
            files = [i for i in fs.get_file_info(pafs.FileSelector(source, recursive=True))
                     if i.type == pafs.FileType.File]
            files.sort(key=lambda i: posixpath.basename(i.path) == MANIFEST_FILE)  # the manifest last
            for info in files:
                fs.copy_file(info.path, posixpath.join(pin, posixpath.relpath(info.path, source)))
            if files:
                return pin
        except (OSError, FileNotFoundError):
            _delete(fs, pin)
    return None


def _same_state(fs: pafs.FileSystem, parent: str, name: str, iteration: int | None) -> list[str]:
    """``parent/name`` if it is there, else its kept copy, else the trial's checkpoints of ``iteration``."""
    path = posixpath.join(parent, name)
    # Whole only with its manifest: an announced checkpoint whose write died is an empty directory.
    if fs.get_file_info(posixpath.join(path, MANIFEST_FILE)).type == pafs.FileType.File:
        return [path]
    kept = posixpath.join(parent, kept_name(name))
    if fs.get_file_info(posixpath.join(kept, MANIFEST_FILE)).type == pafs.FileType.File:
        return [kept]
    if iteration is None:
        return []
    twins = []
    for info in fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True)):
        if info.type == pafs.FileType.Directory and CHECKPOINT_DIR.match(info.base_name):
            try:
                if read_metadata(Storage(fs, info.path, info.path)).get("iteration") == iteration:
                    twins.append(info.path)
            except (CheckpointError, OSError):
                continue  # being written, or deleted meanwhile
    return sorted(twins, reverse=True)


def remove_pin(fs: pafs.FileSystem, path: str) -> None:
    """Remove a pinned copy once its one reader has it (gone already is fine); other paths are left alone."""
    if is_pinned(path):
        _delete(fs, path)


def _delete(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_dir(path)
    except (OSError, FileNotFoundError):
        pass
