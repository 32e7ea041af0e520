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
``.checkpoint_NNNNNN.keeping-XXXX``, ``.checkpoint_NNNNNN.standin-XXXX``
    A kept copy, or the stand-in for an announced checkpoint whose write never
    completed (:func:`tunekit.trial._restoring`), while its hard links are made;
    renamed once whole. One left behind is what a worker killed while making it
    leaves (:func:`tidy` drops it).
``.checkpoint_NNNNNN.pin-XXXX``
    A PBT donor's checkpoint pinned from the moment the scheduler picks it
    while anything may restore from it (:mod:`tunekit.checkpoint._pins`): Ray's
    ``num_to_keep`` never deletes it.
``.checkpoint_NNNNNN.damaged``
    A damaged checkpoint's copy kept out of Ray's retention by ``tunekit resume``.
``.tunekit-pin.json``
    The PBT donor's pin this trial restored from (:func:`tunekit.checkpoint._pins.adopt_pin`), and once the pin is
    gone, which of the trial's checkpoints came after it (:func:`tunekit.checkpoint._pins.cloned_from`).
``.tunekit-index``
    The highest checkpoint index this trial ever announced (:mod:`tunekit.checkpoint._announced`).

A checkpoint announced by a two-phase save exists from that moment on as an
empty directory (:func:`tunekit.checkpoint._announced.announce`), which the commit
replaces atomically: an empty ``checkpoint_NNNNNN`` is a write in flight when
a live writer's staging directory stands beside it, else a write that never
completed.

:func:`leftovers` lists the hidden ones for ``tunekit verify``. Nothing here
imports Ray or torch.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Collection
from typing import NamedTuple

import pyarrow.fs as pafs

from tunekit import _env
from tunekit.checkpoint._manifest import MANIFEST_FILE
from tunekit.errors import CheckpointError

__all__ = [
    "CHECKPOINT_DIR", "DAMAGED_COPY", "Entry", "KEPT_COPY", "LOCAL", "PARTIAL", "PINNED_COPY", "STAGING",
    "TEMPORARY", "await_write", "checkpoint_name_of", "damaged_name", "has_hidden_checkpoints",
    "is_train_checkpoint", "keep_newest_complete", "kept_name", "leftovers", "link_tree", "restorable_checkpoints",
    "scan", "stage_checkpoint", "staging_of", "tidy", "writer_alive", "writer_id"
]

#: The local disk, for :func:`scan` of a local trial directory.
LOCAL = pafs.LocalFileSystem()
#: Ray Tune's name for a trial's checkpoint directories; group 1 is the index.
CHECKPOINT_DIR = re.compile(r"^checkpoint_(?P<index>\d+)$")
#: A copy of a damaged checkpoint that ``tunekit resume`` kept out of Ray's retention.
DAMAGED_COPY = re.compile(r"^\.checkpoint_(?P<index>\d+)\.damaged$")


def kept_name(checkpoint: str) -> str:
    """``checkpoint_N`` -> ``.checkpoint_N.kept``."""
    return f".{checkpoint}.kept"


def damaged_name(checkpoint: str) -> str:
    """``checkpoint_N`` -> ``.checkpoint_N.damaged``."""
    return f".{checkpoint}.damaged"


def checkpoint_name_of(name: str) -> str | None:
    """The ``checkpoint_N`` a directory name stands for (itself, a kept, pinned or damaged copy, its staging
    directory), or None.

    >>> checkpoint_name_of("checkpoint_000004"), checkpoint_name_of(".checkpoint_000004.pin-1f2e")
    ('checkpoint_000004', 'checkpoint_000004')
    """
    if CHECKPOINT_DIR.match(name):
        return name
    if m := (KEPT_COPY.match(name) or DAMAGED_COPY.match(name)):
        return f"checkpoint_{m[1]}"
    if m := (PINNED_COPY.match(name) or STAGING.match(name)):
        return m[1]
    return None


def is_train_checkpoint(name: str) -> bool:
    """Whether ``name`` is a Ray Train checkpoint directory's (``checkpoint_<time>``, in a multi-worker trial's
    ``train/``)."""
    return name.startswith("checkpoint_")


class Entry(NamedTuple):
    """One checkpoint directory of a trial's, as :func:`scan` names it."""

    name: str
    path: str
    #: "checkpoint" (Ray's ``checkpoint_N``), "kept", "pinned", "damaged", "temporary", "writing", "interrupted"
    #: (or "staging": a staging directory whose writer was not looked up).
    kind: str
    #: The ``N`` of the checkpoint it stands for.
    index: int

    @property
    def checkpoint(self) -> str:
        """The ``checkpoint_N`` it stands for."""
        return checkpoint_name_of(self.name)  # type: ignore[return-value]

    @property
    def writer(self) -> tuple[str | None, int]:
        """A staging directory's writer, ``(host, pid)``; ``(None, 0)`` for any other (or an older tunekit's)."""
        staging = staging_of(self.name)
        return staging[1:] if staging else (None, 0)


def staging_of(name: str) -> tuple[str, str | None, int] | None:
    """``(checkpoint name, writer's host, writer's pid)`` of a staging directory's name (an older tunekit's:
    host None, pid 0), or None for any other name."""
    m = STAGING.match(name)
    return (m[1], m["host"], int(m["pid"] or 0)) if m else None


def scan(fs: pafs.FileSystem, trial_dir: str, kinds: Collection[str] | None = None) -> list[Entry]:
    """Every checkpoint directory of ``trial_dir`` (those of ``kinds`` only, if given), typed, in one listing
    (none if it is missing): ``os.scandir`` on a local disk, pyarrow elsewhere.

    "kept": a complete checkpoint kept while a newer one was written; "pinned": a checkpoint pinned for a PBT
    clone that has not read it yet (a paused trial's: its resume reads it); "damaged": a damaged checkpoint's
    copy that ``tunekit resume`` kept; "temporary": a kept copy or a stand-in while its hard links are made (or
    left half made by a killed worker); "writing": a staging directory whose writer is alive; "interrupted":
    one whose writer is gone (killed in the middle of the write). A staging directory's writer is looked up
    only when ``kinds`` asks for one of those two; ``kinds`` with "staging" lists them all unlooked-up.
    """
    raw = kinds is not None and "staging" in kinds
    looked_up = kinds is None or "writing" in kinds or "interrupted" in kinds
    out = []
    for name, path in _directories(fs, trial_dir):
        for kind, pattern in _KINDS:
            if m := pattern.match(name):
                if kind == "staging" and not raw:
                    if not looked_up:
                        break
                    local = isinstance(fs, pafs.LocalFileSystem)
                    live = local and m["pid"] is not None and writer_alive(m["host"], int(m["pid"]))
                    kind = "writing" if live else "interrupted"
                if kinds is None or kind in kinds:
                    out.append(Entry(name, path, kind, int(m["index"])))
                break
    return out


def _directories(fs: pafs.FileSystem, trial_dir: str) -> list[tuple[str, str]]:
    """``(name, path)`` of the directories in ``trial_dir`` whose name may be a checkpoint's (none if it is
    missing). Locally by ``os.scandir``, which knows each entry's type without a ``stat``."""
    if isinstance(fs, pafs.LocalFileSystem):
        try:
            with os.scandir(trial_dir) as entries:
                return [(e.name, e.path) for e in entries if "checkpoint_" in e.name and e.is_dir()]
        except (FileNotFoundError, NotADirectoryError):
            return []
    return [(i.base_name, i.path) for i in fs.get_file_info(pafs.FileSelector(trial_dir, allow_not_found=True))
            if i.type == pafs.FileType.Directory]


def restorable_checkpoints(fs: pafs.FileSystem, trial_dir: str, wanted: Callable[[int], bool]) -> list[tuple[int, str]]:
    """The checkpoint directories and kept copies in ``trial_dir`` whose index ``wanted`` accepts, in one
    listing: ``(index, path)`` each, newest first, a real directory before the kept copy of its index."""
    found = [(e.index, e.kind == "checkpoint", e.path) for e in scan(fs, trial_dir, ("checkpoint", "kept"))
             if wanted(e.index)]
    return [(index, path) for index, _, path in sorted(found, reverse=True)]


PARTIAL = ".partial-"
#: A checkpoint's staging directory: ``.checkpoint_N.partial-HOST-PID-XXXX`` (older tunekits: no HOST-PID).
STAGING = re.compile(r"^\.(checkpoint_(?P<index>\d+))\.partial-(?:(?P<host>.+)-(?P<pid>\d+)-)?[^-]*$")
#: A complete checkpoint kept (hard links) while a newer one is written.
KEPT_COPY = re.compile(r"^\.checkpoint_(?P<index>\d+)\.kept$")
#: A donor's checkpoint pinned for a PBT clone that has not read it yet (hard links or a copy).
PINNED_COPY = re.compile(r"^\.(checkpoint_(?P<index>\d+))\.pin-[0-9a-f]+$")
#: A kept copy or a stand-in while its hard links are made (:func:`keep_newest_complete`, the restore's stand-in).
TEMPORARY = re.compile(r"^\.checkpoint_(?P<index>\d+)\.(?:keeping|standin)-[^/]+$")
#: How :func:`scan` types a directory by its name.
_KINDS = (("checkpoint", CHECKPOINT_DIR), ("kept", KEPT_COPY), ("pinned", PINNED_COPY), ("damaged", DAMAGED_COPY),
          ("temporary", TEMPORARY), ("staging", STAGING))


def writer_id() -> str:
    """``HOST-PID`` of this process, as staging directories name their writer."""
    return f"{_host()}-{os.getpid()}"


@functools.lru_cache(maxsize=1)
def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"


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


def leftovers(fs: pafs.FileSystem, trial_dir: str) -> list[tuple[str, str]]:
    """Hidden checkpoint directories of a trial: ``(name, kind)`` (every kind :func:`scan` names but Ray's)."""
    return sorted((e.name, e.kind) for e in scan(fs, trial_dir) if e.kind != "checkpoint")


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
    for entry in scan(LOCAL, parent, ("checkpoint", "kept")):
        if entry.index >= below or not os.path.exists(os.path.join(entry.path, MANIFEST_FILE)):
            continue
        candidate = (entry.index, entry.path, entry.kind == "kept")
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


def has_hidden_checkpoints(parent: str) -> bool:
    """Whether ``parent`` holds any ``.checkpoint_*`` name (staging directories, kept, pinned, damaged copies):
    when it holds none, :func:`tidy` and :func:`tunekit.checkpoint._announced.drop_unregistered` have nothing to do."""
    with os.scandir(parent) as entries:
        return any(e.name.startswith(".checkpoint_") for e in entries)


def tidy(parent: str, completed: int) -> None:
    """After checkpoint ``completed`` is whole, in the trial's own process (so no copy of its is being made): drop
    kept copies before it, copies left half made and dead writers' staging directories."""
    for entry in scan(LOCAL, parent, ("kept", "temporary", "interrupted")):
        if entry.kind != "kept" or entry.index < completed:
            shutil.rmtree(entry.path, ignore_errors=True)


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
        writers = [e.writer for e in scan(LOCAL, parent, ("writing",)) if e.checkpoint == name]
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
