"""A read-only filesystem over an experiment's listing and index, for code written against a filesystem
(``tunekit verify`` on remote storage): file infos and directory listings answered from the one listing,
tunekit's and Ray's small files read from the index (:mod:`tunekit.experiment._index`), every other read going
to the storage.

Implementation tier of :mod:`tunekit.experiment.verify`.
"""

from __future__ import annotations

import base64
import posixpath
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from tunekit.checkpoint._manifest import MANIFEST_FILE, METADATA_FILE
from tunekit.experiment._index import ExperimentIndex
from tunekit.storage._location import Storage

__all__ = ["listed_storage"]


#: The largest file :func:`listed_storage` keeps whole in the index (tunekit's and Ray's small files).
_KEPT_MAX = 256 * 1024


def _payload(rel: str) -> bool:
    """Whether ``rel`` is a checkpoint's payload (any file in a checkpoint directory but tunekit's manifest and
    metadata): never kept in the index, so ``verify --full`` hashes the bytes on storage, whatever their size."""
    *parents, name = rel.split("/")
    return any(p.lstrip(".").startswith("checkpoint_") for p in parents) and name not in (MANIFEST_FILE, METADATA_FILE)


class _Listed(pafs.FileSystemHandler):
    """A read-only filesystem over a :class:`ExperimentIndex`: infos and listings from its one listing, small JSON
    files from the index, everything else read from the storage."""

    def __init__(self, index: ExperimentIndex) -> None:
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


def listed_storage(index: ExperimentIndex) -> Storage:
    """The experiment of ``index`` on a filesystem that answers from its listing and index (see the module)."""
    experiment = index.experiment
    return Storage(pafs.PyFileSystem(_Listed(index)), experiment.path, experiment.uri)
