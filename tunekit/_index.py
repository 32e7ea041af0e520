"""The read model's index of a remote experiment: what was read from each file, kept beside the experiment
and trusted only for files one listing shows unchanged.

Implementation tier of :mod:`tunekit.snapshot`. On object stores every file a reader opens is a request
(on S3, tens of milliseconds each, one after another): reading a 2,000-trial experiment file by file takes
tens of thousands. Here the experiment is listed once (recursively: one request per 1,000 objects, every
object's size and modification time), the trial directories and checkpoints are found from that listing,
and what a reader parsed out of each file (a trial's ``params.json``, ``result.json`` and ``error.txt``, a
checkpoint's ``tunekit.json`` and manifest) is taken from ``EXP/.tunekit-index.json`` when the listing shows
the file with the size and time the index recorded for it; a file the listing disagrees with (new, grown,
rewritten) is read the slow way, a file the listing does not show is absent without a request. The
readers write the index back after a read that found anything new (one PUT, atomic on object stores; a
read-only bucket is read the slow way each time). A damaged, foreign or newer-format index is ignored and
rebuilt. Local experiments are read directly: a local file costs microseconds.

Tested in ``tests/trainables/test_quickstart.py`` (requests counted on the S3 server).
"""

from __future__ import annotations

import json
import posixpath
from typing import Any, Callable

import pyarrow.fs as pafs

from tunekit.experiment_dir import files_by_checkpoint
from tunekit.results import read_bytes
from tunekit.storage import Storage, storage_errors

__all__ = ["INDEX_NAME", "RemoteIndex"]

INDEX_NAME = ".tunekit-index.json"
_FORMAT, _VERSION = "tunekit-index", 1


class RemoteIndex:
    """One recursive listing of a remote experiment, and the parsed contents the index holds for its files."""

    def __init__(self, experiment: Storage) -> None:
        self.experiment = experiment
        #: Path inside the experiment -> [size, mtime] for every file the listing shows.
        self.stamps: dict[str, list[Any]] = {}
        #: Directory (path inside the experiment, "" for its top) -> its entries' names -> whether a directory.
        self.tree: dict[str, dict[str, bool]] = {"": {}}
        self._listed = False
        self._cached: dict[str, Any] = {}
        self._fresh: dict[str, Any] = {}
        self.read_slowly = 0  # entries read from their files (not from the index)

    def _list(self) -> None:
        """The experiment listed once, recursively (at the first question: after the reader checked it exists);
        its index read."""
        if self._listed:
            return
        self._listed = True
        with storage_errors("list", self.experiment):
            infos = self.experiment.filesystem.get_file_info(
                pafs.FileSelector(self.experiment.path, recursive=True, allow_not_found=True))
        root = self.experiment.path.rstrip("/") + "/"
        for info in infos:
            if not info.path.startswith(root) or info.type not in (pafs.FileType.File, pafs.FileType.Directory):
                continue
            rel = info.path[len(root):].rstrip("/")
            is_dir = info.type == pafs.FileType.Directory
            if not is_dir:
                self.stamps[rel] = [info.size, info.mtime_ns]
            while rel:  # rel in its directory, and each directory above in its own (object stores list none)
                parent, name = posixpath.split(rel)
                siblings = self.tree.setdefault(parent, {})
                known = name in siblings
                siblings[name] = siblings.get(name, False) or is_dir
                if is_dir:
                    self.tree.setdefault(rel, {})
                if known and is_dir:
                    break
                rel, is_dir = parent, True
        self._cached = self._load()

    def _load(self) -> dict[str, Any]:
        if INDEX_NAME not in self.stamps:
            return {}
        try:
            raw = read_bytes(self.experiment.filesystem, posixpath.join(self.experiment.path, INDEX_NAME))
            index = json.loads(raw) if raw else None
        except (OSError, ValueError):
            return {}
        if not isinstance(index, dict) or index.get("format") != _FORMAT or index.get("version") != _VERSION \
                or not isinstance(index.get("entries"), dict):
            return {}
        return index["entries"]

    def children(self, rel: str) -> list[tuple[str, bool]]:
        """The entries directly in directory ``rel`` ("" for the experiment's top): (name, is a directory)."""
        self._list()
        return sorted(self.tree.get(rel, {}).items())

    def checkpoint_files(self) -> dict[str, dict[str, int]]:
        """:func:`tunekit.experiment_dir.checkpoint_files` from the listing."""
        self._list()
        return files_by_checkpoint((rel, stamp[0] or 0) for rel, stamp in self.stamps.items())

    def value(self, rel: str, read: Callable[[], Any], absent: Any = None) -> Any:
        """What ``read()`` returns for the file ``rel`` (its path inside the experiment): from the index when the
        listing shows the file as the index recorded it; ``absent`` when the listing does not show it (no
        request); else ``read()``, recorded for the next reader."""
        self._list()
        stamp = self.stamps.get(rel)
        if stamp is None:
            return absent
        entry = self._cached.get(rel)
        if isinstance(entry, dict) and entry.get("stamp") == stamp and "value" in entry:
            self._fresh[rel] = entry
            return entry["value"]
        value = read()
        self._fresh[rel] = {"stamp": stamp, "value": value}
        self.read_slowly += 1
        return value

    def save(self) -> None:
        """Write the index back when this read found anything it did not hold (best effort: a bucket that
        cannot be written is read the slow way next time too)."""
        if not self._listed or not self.read_slowly and len(self._fresh) == len(self._cached):
            return
        text = json.dumps({"format": _FORMAT, "version": _VERSION, "entries": self._fresh},
                          separators=(",", ":"), default=str)
        try:
            with self.experiment.filesystem.open_output_stream(
                    posixpath.join(self.experiment.path, INDEX_NAME)) as out:
                out.write(text.encode())
        except (OSError, ValueError):
            pass
