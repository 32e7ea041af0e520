"""The read model's index of a remote experiment: what was read from each file, kept beside the experiment
and trusted only for files one listing shows unchanged.

Implementation tier of :mod:`tunekit.experiment.snapshot`. On object stores every file a reader opens is a request
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

:func:`listed_storage` gives the same listing and index to code written against a filesystem
(``tunekit verify``): a filesystem that answers file infos and directory listings from the listing and
reads tunekit's small JSON files from the index, every other read going to the storage.
"""

from __future__ import annotations

import base64
import json
import posixpath
import threading
from typing import Any, Callable

import pyarrow as pa
import pyarrow.fs as pafs

from tunekit.checkpoint._manifest import MANIFEST_FILE, METADATA_FILE
from tunekit.checkpoint._layout import files_by_checkpoint
from tunekit.storage._location import Storage, storage_errors

__all__ = ["INDEX_NAME", "RemoteIndex", "listed_storage"]

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
        self._lock = threading.Lock()  # (listed once when readers on several threads ask at once)

    def _list(self) -> None:
        """The experiment listed once, recursively (at the first question: after the reader checked it exists);
        its index read."""
        with self._lock:
            if not self._listed:
                self._list_now()

    def _list_now(self) -> None:
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
        self._listed = True

    def _load(self) -> dict[str, Any]:
        if INDEX_NAME not in self.stamps:
            return {}
        try:  # (the listing shows it: read without asking again whether it is there)
            with self.experiment.filesystem.open_input_file(posixpath.join(self.experiment.path, INDEX_NAME)) as f:
                index = json.loads(f.read())  # (random access: one request, where a stream takes one per 256 KiB)
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
        """:func:`tunekit.checkpoint._layout.checkpoint_files` from the listing."""
        self._list()
        return files_by_checkpoint((rel, stamp[0] or 0) for rel, stamp in self.stamps.items())

    def value(self, rel: str, read: Callable[[], Any], absent: Any = None, *, key: str | None = None) -> Any:
        """What ``read()`` returns for the file ``rel`` (its path inside the experiment): from the index when the
        listing shows the file as the index recorded it; ``absent`` when the listing does not show it (no
        request); else ``read()``, recorded for the next reader (under ``key``: another reading of the file)."""
        self._list()
        stamp = self.stamps.get(rel)
        if stamp is None:
            return absent
        key = rel if key is None else key
        entry = self._cached.get(key)
        if isinstance(entry, dict) and entry.get("stamp") == stamp and "value" in entry:
            self._fresh[key] = entry
            return entry["value"]
        value = read()
        self._fresh[key] = {"stamp": stamp, "value": value}
        self.read_slowly += 1
        return value

    def save(self) -> None:
        """Write the index back when this read found anything it did not hold or a file changed (best effort: a
        bucket that cannot be written is read the slow way next time too). Entries this read did not use stay
        while the listing shows their files unchanged: another reader's (``verify``'s bytes, ``status``'s parsed
        values) serve that reader next time."""
        if not self._listed:
            return
        kept = {key: entry for key, entry in self._cached.items() if key not in self._fresh and isinstance(entry, dict)
                and entry.get("stamp") == self.stamps.get(key.partition("\0")[0])}
        if not self.read_slowly and len(kept) + len(self._fresh) == len(self._cached):
            return
        text = json.dumps({"format": _FORMAT, "version": _VERSION, "entries": {**kept, **self._fresh}},
                          separators=(",", ":"), default=str)
        try:
            with self.experiment.filesystem.open_output_stream(
                    posixpath.join(self.experiment.path, INDEX_NAME)) as out:
                out.write(text.encode())
        except (OSError, ValueError):
            pass


#: The largest file :func:`listed_storage` keeps whole in the index (tunekit's and Ray's small files).
_KEPT_MAX = 256 * 1024


def _payload(rel: str) -> bool:
    """Whether ``rel`` is a checkpoint's payload (any file in a checkpoint directory but tunekit's manifest and
    metadata): never kept in the index, so ``verify --full`` hashes the bytes on storage, whatever their size."""
    *parents, name = rel.split("/")
    return any(p.lstrip(".").startswith("checkpoint_") for p in parents) and name not in (MANIFEST_FILE, METADATA_FILE)


class _Listed(pafs.FileSystemHandler):
    """A read-only filesystem over a :class:`RemoteIndex`: infos and listings from its one listing, small JSON
    files from the index, everything else read from the storage."""

    def __init__(self, index: RemoteIndex) -> None:
        self.index = index
        self.fs = index.experiment.filesystem
        self.root = index.experiment.path.rstrip("/")

    def _rel(self, path: str) -> str | None:
        path = path.rstrip("/")
        if path == self.root:
            return ""
        return path[len(self.root) + 1:] if path.startswith(self.root + "/") else None

    def _info(self, path: str, rel: str) -> pafs.FileInfo:
        stamp = self.index.stamps.get(rel)
        if stamp is not None:
            return pafs.FileInfo(path, pafs.FileType.File, size=stamp[0], mtime_ns=stamp[1])
        if rel in self.index.tree:
            return pafs.FileInfo(path, pafs.FileType.Directory)
        return pafs.FileInfo(path, pafs.FileType.NotFound)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        self.index._list()
        out = []
        for path in paths:
            rel = self._rel(path)  # (outside the experiment, or its top with nothing listed: the storage says)
            out.append(self.fs.get_file_info(path) if rel is None or rel == "" and not self.index.stamps
                       else self._info(path, rel))
        return out

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        rel = self._rel(selector.base_dir)
        if rel is None:
            return self.fs.get_file_info(selector)
        self.index._list()
        if rel not in self.index.tree:
            if selector.allow_not_found:
                return []
            raise FileNotFoundError(f"{selector.base_dir}: no such directory")
        out, todo = [], [rel]
        while todo:
            top = todo.pop()
            for name, is_dir in sorted(self.index.tree.get(top, {}).items()):
                child = posixpath.join(top, name) if top else name
                out.append(self._info(posixpath.join(self.root, child), child))
                if is_dir and selector.recursive:
                    todo.append(child)
        return out

    def _whole(self, path: str) -> Any:
        rel = self._rel(path)
        stamp = self.index.stamps.get(rel) if rel else None
        if stamp is None or (stamp[0] or 0) > _KEPT_MAX or _payload(rel):
            return None

        def read() -> dict[str, str]:
            with self.fs.open_input_stream(path) as stream:
                data = stream.read()
            try:
                return {"text": data.decode()}
            except UnicodeDecodeError:
                return {"base64": base64.b64encode(data).decode()}

        kept = self.index.value(rel, read, key=f"{rel}\0bytes")
        if not isinstance(kept, dict):
            return None
        data = kept["text"].encode() if isinstance(kept.get("text"), str) else \
            base64.b64decode(kept["base64"]) if isinstance(kept.get("base64"), str) else None
        return None if data is None else pa.BufferReader(data)

    def _absent(self, path: str) -> None:
        """Raise as the storage would for a path inside the experiment the listing shows as no file (no request)."""
        rel = self._rel(path)
        if rel is not None and rel not in self.index.stamps:
            self.index._list()
            if rel in self.index.tree:
                raise IsADirectoryError(f"{path}: a directory")
            if rel not in self.index.stamps:
                raise FileNotFoundError(f"{path}: no such file")

    def open_input_stream(self, path: str) -> Any:
        self._absent(path)
        kept = self._whole(path)
        return self.fs.open_input_stream(path) if kept is None else kept

    def open_input_file(self, path: str) -> Any:
        self._absent(path)
        kept = self._whole(path)
        return self.fs.open_input_file(path) if kept is None else kept

    def get_type_name(self) -> str:  # (ends with the storage's own: "py::tunekit-listed+s3")
        return f"tunekit-listed+{self.fs.type_name}"

    def normalize_path(self, path: str) -> str:
        return path

    def equals(self, other: Any) -> bool:
        return other is self

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise OSError("an experiment read from its listing is read-only")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = _read_only
    move = copy_file = open_output_stream = open_append_stream = _read_only


def listed_storage(index: RemoteIndex) -> Storage:
    """The experiment of ``index`` on a filesystem that answers from its listing and index (see the module)."""
    experiment = index.experiment
    return Storage(pafs.PyFileSystem(_Listed(index)), experiment.path, experiment.uri)
