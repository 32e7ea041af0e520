"""Files on storage read whole, in as few requests as the storage allows, and JSON parsed fast.
"""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Iterator
from typing import Any

import orjson
import pyarrow.fs as pafs

from tunekit.storage._location import storage_errors

__all__ = ["file_bytes", "gc_paused", "loads", "read_bytes", "read_text"]


def read_bytes(fs: pafs.FileSystem, path: str) -> bytes | None:
    """A file's bytes, or None if there is no such file; storage errors are raised (naming ``path``)."""
    with storage_errors("read", path):
        return file_bytes(fs, path)


def file_bytes(fs: pafs.FileSystem, path: str) -> bytes | None:
    """A file's bytes, or None if there is no such file; the storage's own errors pass (the caller names where)."""
    if type(fs) is pafs.LocalFileSystem:  # Python's own read: cheaper than pyarrow's stream, for Ray's large
        try:                              # experiment state and for each of a sweep's small files alike
            with open(path, "rb") as file:
                return file.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
    try:  # (a file opened for random access is read in one request; a stream, in one per 256 KiB on S3)
        with fs.open_input_file(path) as file:
            return file.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except OSError:  # (a filesystem that fails otherwise for a directory or nothing: no file there)
        if fs.get_file_info(path).type != pafs.FileType.File:
            return None
        raise


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off while a reader builds what it parsed (as it was before,
    after). Most of what a reader parses (Ray's experiment state, every trial's state) lives only until it
    returns, and reference counting frees it then; collections in between scan it in vain and move it to the
    older generations, whose full collections (long in a process that imported pandas, Arrow and Ray)
    then come every few reads, each longer than the read itself. Nothing is kept from collection: what is
    left when the collector is back is collected as before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_text(fs: pafs.FileSystem, path: str) -> str | None:
    """A file's text, or None if there is no such file; storage errors are raised."""
    data = read_bytes(fs, path)
    return None if data is None else data.decode("utf-8", errors="replace")


def loads(data: bytes | memoryview | str) -> Any:
    """JSON, by orjson (faster than Python's json on Ray's large experiment state) where it can read it, else by
    Python's json, which also reads what orjson refuses (``NaN``, ``Infinity``, integers beyond 64 bits) and
    whose error (a ``ValueError``) names where a damaged text breaks off.

    >>> loads(b'{"loss": NaN, "it": 3}')["it"]
    3
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(bytes(data).decode("utf-8", errors="replace") if not isinstance(data, str) else data)
