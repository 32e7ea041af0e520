"""Checkpoints on their way to the disk: fsyncs on a helper thread, below training's priority.

Implementation tier, used by :mod:`tunekit.trial._saving`. A checkpoint written with
``durable=False`` is whole in the page cache once its directory is renamed
into place (safe from a killed process); :class:`Durability` then makes it
safe from a power loss while training goes on.

Two ways, chosen per checkpoint by whoever wrote it:

* one ``fsync`` per file, then the directory and its parent (a large
  checkpoint: each of its bytes must reach the disk anyway);
* ``whole_filesystem=True``: one ``syncfs`` of the filesystem the directory is
  on (Linux), for a small checkpoint written in place. Its files and both
  directory entries reach the disk with one system call instead of about
  fifteen (an open, an fsync and a close per path), each of which hands
  Python's GIL back and forth with the training thread; and one ``syncfs``
  covers every small checkpoint written before it began, at most one every
  :data:`SYNCFS_INTERVAL_S` (a checkpoint is on the disk about a second after
  it was written, not the kernel's 30 s). Where ``syncfs`` is missing or the
  filesystem refuses it, the per-path fsyncs run instead.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from tunekit.checkpoint._priority import lend_priority, submit_below
from tunekit.checkpoint._directory import fsync_paths

__all__ = ["Durability", "SYNCFS_INTERVAL_S", "sync_filesystem"]

_SYNCER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunekit-fsync")

try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
    _SYNCFS = _LIBC.syncfs
except (OSError, AttributeError):  # not Linux (or no syncfs in its C library)
    _LIBC = _SYNCFS = None

#: ``syncfs`` errors that mean "not here" (fall back to per-path fsyncs), not "the disk failed".
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTTY}


def sync_filesystem(directory: str) -> bool:
    """``syncfs`` the filesystem ``directory`` is on. False where that is not possible (nothing was done).

    Raises:
        OSError: the filesystem reported a write error.
    """
    if _SYNCFS is None:
        return False
    fd = os.open(directory, os.O_RDONLY)
    try:
        if _SYNCFS(fd) == 0:
            return True
        code = ctypes.get_errno()
    finally:
        os.close(fd)
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), directory)


def _paths_of(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) + [path, path.parent]


def _sync_whole(path: Path) -> bool:
    """``syncfs`` (True: the whole filesystem is synced), else fsync the checkpoint's paths (False)."""
    if sync_filesystem(str(path)):
        return True
    fsync_paths(_paths_of(path))
    return False


#: Seconds from one ``syncfs`` of small checkpoints to the next (each covers all written since the last began).
SYNCFS_INTERVAL_S = 1.0


class _Coalesced:
    """The small checkpoints waiting for a ``syncfs``: one job takes every one asked for before it starts.

    Each ``syncfs`` commits the filesystem's journal, and a commit makes every
    metadata operation on it wait (other trials' saves included): one a second
    in a process, not one a checkpoint.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paths: list[Path] = []
        self._queued: Future | None = None
        self._last = -SYNCFS_INTERVAL_S

    def request(self, path: Path) -> Future:
        with self._lock:
            self._paths.append(path)
            if self._queued is None:
                self._queued = submit_below(_SYNCER, self._run)
            return self._queued

    def _run(self) -> None:
        time.sleep(max(0.0, self._last + SYNCFS_INTERVAL_S - time.monotonic()))
        with self._lock:
            paths, self._paths, self._queued, self._last = self._paths, [], None, time.monotonic()
        done: set[int] = set()
        for path in paths:
            try:
                device = os.stat(path).st_dev
            except FileNotFoundError:
                continue  # deleted since (retention): nothing of it to keep
            if device not in done and _sync_whole(path):
                done.add(device)


_COALESCED = _Coalesced()


class Durability:
    """One trial's checkpoints written with ``durable=False``, on their way to the disk.

    :meth:`sync` fsyncs a checkpoint directory (its files, itself, its parent)
    on a helper thread while training goes on; :meth:`wait` blocks until all
    of them are on disk. Each trial (its :class:`tunekit.trial._checkpointer.TrialCheckpointer`)
    owns one, so waiting concerns that trial's checkpoints only.
    """

    def __init__(self) -> None:
        self._pending: list[Future] = []
        self._lock = threading.Lock()

    def sync(self, directory: str | os.PathLike[str], *, whole_filesystem: bool = False) -> None:
        """fsync ``directory`` (written with ``durable=False``) on the helper thread (``whole_filesystem``:
        with one ``syncfs``, see the module docstring)."""
        path = Path(directory)
        future = _COALESCED.request(path) if whole_filesystem else submit_below(_SYNCER, fsync_paths, _paths_of(path))
        with self._lock:
            self._pending[:] = [f for f in self._pending if not f.done() or f.exception()]
            if future not in self._pending:
                self._pending.append(future)

    def wait(self) -> None:
        """Block until every directory given to :meth:`sync` is on disk; raise the first fsync error."""
        with self._lock:
            pending, self._pending[:] = list(self._pending), []
        for future in pending:
            lend_priority(future)
            future.result()
