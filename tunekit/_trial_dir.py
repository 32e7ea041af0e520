"""Every name in a trial directory, and who may still be writing there.

Implementation tier. This is the one place that decides a checkpoint
directory's name, for Ray's and tunekit's:

``checkpoint_NNNNNN``
    A checkpoint Ray registered (Ray picks the index).
``.checkpoint_NNNNNN.partial-HOST-PID-XXXX``
    Its staging directory while tunekit writes it (:func:`stage_checkpoint`);
    renamed to the final name once whole. The writer is alive or not
    (:func:`writer_alive`); :func:`await_write` waits for a live one.
``.checkpoint_NNNNNN.kept``
    The trial's newest complete checkpoint, hard links, kept while a newer
    one is written (:func:`keep_newest_complete`; dropped by :func:`tidy`).
``.checkpoint_NNNNNN.pin-XXXX``
    A PBT donor's checkpoint pinned from the moment the scheduler picks it
    until the clone has read it (:func:`pin_checkpoint`, :func:`is_pinned`):
    Ray's ``num_to_keep`` never deletes it.
``.checkpoint_NNNNNN.damaged``
    A damaged checkpoint's copy kept out of Ray's retention by ``tunekit resume``.
``.tunekit-pin.json``
    The PBT donor's pin this trial restored from (:func:`adopt_pin`), kept
    until the trial has a complete checkpoint of its own after the exploit.
``.tunekit-index``
    The highest checkpoint index this trial ever announced (:func:`claim_index`):
    an index is never announced twice, whatever Ray's own counter says after a
    killed write.

A checkpoint announced by a two-phase save exists from that moment on as an
empty directory (:func:`announce`), which the commit replaces atomically (a
rename onto an empty directory): an empty ``checkpoint_NNNNNN`` is a write in
flight when a live writer's staging directory stands beside it, else a write
that never completed.

:func:`leftovers` lists the hidden ones for ``tunekit verify``. Nothing here
imports Ray or torch.

Tested in ``tests/tunekit/test_two_phase.py`` (staging, kept copies, leftovers) and
``tests/trainables/test_pbt_exploit.py`` (pins: the race with ``num_to_keep``).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import socket
import tempfile
import time
import uuid

import pyarrow.fs as pafs

from tunekit import _env
from tunekit._manifest import MANIFEST_FILE, read_metadata
from tunekit.errors import CheckpointError
from tunekit.storage import Storage

__all__ = [
    "CHECKPOINT_DIR",
    "DAMAGED_COPY",
    "KEPT_COPY",
    "PARTIAL",
    "PINNED_COPY",
    "STAGING",
    "INDEX_FILE",
    "PIN_RECORD",
    "adopt_pin",
    "adopted_pin",
    "announce",
    "await_write",
    "checkpoint_name_of",
    "claim_index",
    "damaged_name",
    "highest_index",
    "is_announced_only",
    "is_pinned",
    "keep_newest_complete",
    "kept_name",
    "leftovers",
    "link_tree",
    "pin_checkpoint",
    "remove_pin",
    "stage_checkpoint",
    "staging_dirs",
    "tidy",
    "unpinned",
    "writer_alive",
    "writer_id",
]

#: Ray Tune's name for a trial's checkpoint directories; group 1 is the index.
CHECKPOINT_DIR = re.compile(r"^checkpoint_(\d+)$")
#: A copy of a damaged checkpoint that ``tunekit resume`` kept out of Ray's retention.
DAMAGED_COPY = re.compile(r"^\.checkpoint_(\d+)\.damaged$")


def kept_name(checkpoint: str) -> str:
    """``checkpoint_N`` -> ``.checkpoint_N.kept``."""
    return f".{checkpoint}.kept"


def damaged_name(checkpoint: str) -> str:
    """``checkpoint_N`` -> ``.checkpoint_N.damaged``."""
    return f".{checkpoint}.damaged"


def checkpoint_name_of(name: str) -> str | None:
    """The ``checkpoint_N`` a directory name stands for (itself, a kept copy or a pin), or None.

    >>> checkpoint_name_of("checkpoint_000004"), checkpoint_name_of(".checkpoint_000004.pin-1f2e")
    ('checkpoint_000004', 'checkpoint_000004')
    """
    if CHECKPOINT_DIR.match(name):
        return name
    if m := (KEPT_COPY.match(name) or DAMAGED_COPY.match(name)):
        return f"checkpoint_{m[1]}"
    if m := PINNED_COPY.match(name):
        return m[1]
    return None


PARTIAL = ".partial-"
#: A checkpoint's staging directory: ``.checkpoint_N.partial-HOST-PID-XXXX`` (older tunekits: no HOST-PID).
STAGING = re.compile(r"^\.(checkpoint_\d+)\.partial-(?:(?P<host>.+)-(?P<pid>\d+)-)?[^-]*$")
#: A complete checkpoint kept (hard links) while a newer one is written.
KEPT_COPY = re.compile(r"^\.checkpoint_(\d+)\.kept$")
#: A donor's checkpoint pinned for a PBT clone that has not read it yet (hard links or a copy).
PINNED_COPY = re.compile(r"^\.(checkpoint_(\d+))\.pin-[0-9a-f]+$")


#: The trial's highest checkpoint index announced so far (a decimal number).
INDEX_FILE = ".tunekit-index"


def claim_index(trial_dir: str, proposed: int) -> int:
    """The index of the trial's next checkpoint: ``proposed`` (Ray's counter), or higher if it was used already.

    Ray's counter lags after a killed write (the driver advances it only when
    a checkpoint is registered, and not when registering it failed), so a new
    worker can be handed an index a checkpoint was announced under before;
    Ray would then register one path twice and delete it as the older of the
    two. The answer is above every index any name in ``trial_dir`` carries
    (checkpoints, staging, kept, pinned and damaged copies) and above the
    highest ever claimed (:data:`INDEX_FILE`, which outlives the tidying of
    interrupted writes), and is recorded there before it is used.
    """
    os.makedirs(trial_dir, exist_ok=True)
    index = max(proposed, highest_index(trial_dir) + 1)
    temporary = os.path.join(trial_dir, f"{INDEX_FILE}.{os.getpid()}")
    with open(temporary, "w") as fh:
        fh.write(str(index))
    os.replace(temporary, os.path.join(trial_dir, INDEX_FILE))  # a killed process leaves the page cache whole
    return index


def highest_index(trial_dir: str) -> int:
    """The highest checkpoint index the trial's directory ever held (-1 if none)."""
    highest = -1
    try:
        with open(os.path.join(trial_dir, INDEX_FILE)) as fh:
            highest = int(fh.read().strip() or -1)
    except (OSError, ValueError):
        pass
    try:
        with os.scandir(trial_dir) as entries:
            for entry in entries:
                name = checkpoint_name_of(entry.name) or ((m := STAGING.match(entry.name)) and m[1])
                if name:
                    highest = max(highest, int(name.rsplit("_", 1)[1]))
    except FileNotFoundError:
        pass
    return highest


#: The PBT donor's pin a trial restored from, until the trial has a complete checkpoint of its own after it.
PIN_RECORD = ".tunekit-pin.json"


def adopt_pin(trial_dir: str, pin: str) -> None:
    """The trial in ``trial_dir`` restored from ``pin`` (a PBT clone): keep the pin while anything may restore
    from it.

    Ray names the pin as the trial's checkpoint until the trial's next one is
    registered, and a worker killed before that next one is whole is
    restored from the pin again, or falls back to it. :func:`tidy` removes the
    pin once a checkpoint of the trial newer than the exploit is complete; a
    pin adopted before it (two exploits before a save) goes at once.
    """
    previous = adopted_pin(trial_dir)
    record = {"pin": pin, "after": highest_index(trial_dir)}
    temporary = os.path.join(trial_dir, f"{PIN_RECORD}.{os.getpid()}")
    with open(temporary, "w") as fh:
        json.dump(record, fh)
    os.replace(temporary, os.path.join(trial_dir, PIN_RECORD))
    if previous is not None and previous[0] != pin:
        shutil.rmtree(previous[0], ignore_errors=True)


def adopted_pin(trial_dir: str) -> tuple[str, int] | None:
    """``(pin path, the trial's highest checkpoint index when it restored from it)``, or None."""
    try:
        with open(os.path.join(trial_dir, PIN_RECORD)) as fh:
            record = json.load(fh)
        return str(record["pin"]), int(record["after"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def announce(final: str) -> None:
    """Create ``final`` empty, before it is announced to Tune: an announced checkpoint always exists.

    The commit renames the written checkpoint onto it (atomic: a rename onto
    an empty directory); until then readers find it empty, a write in flight
    or one that never completed. Ray's ``num_to_keep`` may delete it like any
    registered checkpoint.
    """
    os.makedirs(final, exist_ok=True)


def is_announced_only(path: str) -> bool:
    """Whether local ``path`` is an announced checkpoint whose write has not completed (an empty directory)."""
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def writer_id() -> str:
    """``HOST-PID`` of this process, as staging directories name their writer."""
    host = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"
    return f"{host}-{os.getpid()}"


def writer_alive(host: str | None, pid: int) -> bool:
    """Whether the writer of a staging directory may still be writing."""
    if host is None:
        return False  # written by a tunekit before two-phase saves: never in the background
    if host != writer_id().rsplit("-", 1)[0]:
        return True  # another machine's process: cannot tell, assume it is
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a killed, unreaped worker
    except (OSError, IndexError):
        return True


def staging_dirs(parent: str) -> list[tuple[str, str | None, int]]:
    """``(checkpoint name, host, pid)`` of every staging directory in a trial directory."""
    out = []
    with os.scandir(parent) as entries:
        for entry in entries:
            m = STAGING.match(entry.name)
            if m and entry.is_dir():
                out.append((m[1], m["host"], int(m["pid"] or 0)))
    return out


def leftovers(fs: pafs.FileSystem, trial_dir: str) -> list[tuple[str, str]]:
    """Hidden checkpoint directories of a trial: ``(name, kind)``, kind "kept", "pinned", "damaged",
    "writing" or "interrupted".

    "kept": a complete checkpoint kept while a newer one was written;
    "pinned": a checkpoint pinned for a PBT clone that has not read it yet
    (a paused trial's: its resume reads it);
    "damaged": a damaged checkpoint's copy that ``tunekit resume`` kept;
    "writing": a staging directory whose writer is alive; "interrupted": one
    whose writer is gone (killed in the middle of the write).
    """
    out = []
    for info in fs.get_file_info(pafs.FileSelector(trial_dir, allow_not_found=True)):
        if info.type != pafs.FileType.Directory:
            continue
        if KEPT_COPY.match(info.base_name):
            out.append((info.base_name, "kept"))
        elif PINNED_COPY.match(info.base_name):
            out.append((info.base_name, "pinned"))
        elif DAMAGED_COPY.match(info.base_name):
            out.append((info.base_name, "damaged"))
        elif m := STAGING.match(info.base_name):
            local = isinstance(fs, pafs.LocalFileSystem)
            live = local and m["pid"] is not None and writer_alive(m["host"], int(m["pid"]))
            out.append((info.base_name, "writing" if live else "interrupted"))
    return sorted(out)


def stage_checkpoint(final: str) -> str:
    """Create the hidden staging directory a checkpoint is written in (named after its writer)."""
    parent, name = os.path.split(final)
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=f".{name}{PARTIAL}{writer_id()}-", dir=parent)


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
            m = CHECKPOINT_DIR.match(entry.name) or KEPT_COPY.match(entry.name)
            if not m or int(m[1]) >= below or not os.path.exists(os.path.join(entry.path, MANIFEST_FILE)):
                continue
            candidate = (int(m[1]), entry.path, entry.name.startswith("."))
            if best is None or candidate[:1] > best[:1] or (candidate[0] == best[0] and candidate[2]):
                best = candidate
    if best is None or best[2]:
        return  # nothing complete yet, or the newest complete one is a kept copy already
    index, source, _ = best
    kept = os.path.join(parent, kept_name(os.path.basename(source)))
    if os.path.exists(kept):
        return
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(source)}.keeping-", dir=parent)
    try:
        link_tree(source, staging)
        if not os.path.exists(os.path.join(staging, MANIFEST_FILE)):
            raise FileNotFoundError(source)  # deleted while it was linked: not a whole copy
        os.rename(staging, kept)
    except OSError:
        # Ray deleted it meanwhile (then nothing complete is left to keep), or it was kept already.
        shutil.rmtree(staging, ignore_errors=True)


def tidy(parent: str, completed: int) -> None:
    """After checkpoint ``completed`` is whole: drop kept copies before it, dead writers' leftovers, and the
    PBT pin the trial restored from if ``completed`` is newer (:func:`adopt_pin`)."""
    adopted = adopted_pin(parent)
    if adopted is not None and completed > adopted[1]:
        shutil.rmtree(adopted[0], ignore_errors=True)
        os.remove(os.path.join(parent, PIN_RECORD))
    with os.scandir(parent) as entries:
        names = [(e.name, e.path) for e in entries if e.name.startswith(".checkpoint_")]
    for name, path in names:
        kept = KEPT_COPY.match(name)
        staging = STAGING.match(name)
        if (kept and int(kept[1]) < completed) or ".keeping-" in name or (
            staging and not writer_alive(staging["host"], int(staging["pid"] or 0))
        ):
            shutil.rmtree(path, ignore_errors=True)


def link_tree(source: str, target: str) -> None:
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


def await_write(path: str, *, timeout: float | None = None) -> None:
    """If the local checkpoint ``path`` is still being written by a live process, wait for it.

    Returns when its manifest is there, or when no live writer is left (the
    caller then finds it missing and falls back).

    Raises:
        CheckpointError: still being written after ``timeout`` seconds
            (default ``$TUNEKIT_CHECKPOINT_WAIT_S`` or 600).
    """
    limit = _env.get_float("TUNEKIT_CHECKPOINT_WAIT_S") if timeout is None else timeout
    parent, name = os.path.split(os.path.normpath(path))
    start = time.monotonic()
    delay = 0.005
    while not os.path.exists(os.path.join(path, MANIFEST_FILE)):
        try:
            writers = [(h, p) for ckpt, h, p in staging_dirs(parent) if ckpt == name and writer_alive(h, p)]
        except FileNotFoundError:
            return
        if not writers:
            return
        waited = time.monotonic() - start
        if waited > limit:
            host, pid = writers[0]
            raise CheckpointError(
                f"checkpoint {path} is still being written (by process {pid} on {host}) after {waited:.0f} s; "
                "raise TUNEKIT_CHECKPOINT_WAIT_S to wait longer"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


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
