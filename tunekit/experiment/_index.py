"""The read model's index of an experiment: what was read from its files, kept beside the experiment and
trusted only for files one listing shows unchanged.

Implementation tier of :mod:`tunekit.experiment.snapshot`. Reading an experiment file by file costs a request per
file on object stores (on S3, tens of milliseconds each, one after another: tens of thousands for 2,000 trials)
and, on any storage, parsing every trial's files again (seconds for 10,000 trials on a local disk). Here the
experiment is listed once (recursively: one request per 1,000 objects, every object's size and modification
time) and ``EXP/.tunekit-index.json`` holds what the readers made of it:

* each trial directory's summary (its checkpoints, parsed results, error, damage), trusted while the listing
  shows every file under the directory with the sizes and times it had then (:meth:`ExperimentIndex.trial`);
* Ray's experiment state as the readers use it, trusted while its state files are unchanged;
* on remote storage, what was parsed out of each small file (:meth:`ExperimentIndex.value`), so a trial of which
  one file changed is read with one request, not one per file.

Whatever the listing disagrees with (new, grown, rewritten, gone) is read the slow way; a file the listing
does not show is absent without a request. The readers write the index back after a read that found anything
new (one PUT, atomic on object stores; locally through a temporary file and a rename; a read-only experiment
is read the slow way each time). A damaged, foreign or older-format index is ignored and rebuilt.

The index is three lines of JSON: the entries of files at the experiment's top (Ray's experiment state), the
rest, then each trial's result rows (most of its bytes), so a reader parses only what it asks for: the first
line alone (``load_results``), or the first two (``status``: each trial's newest row is in its summary).
:mod:`tunekit.experiment._listed` gives the same listing and index to code written against a filesystem
(``tunekit verify``).
"""

from __future__ import annotations

import itertools
import json
import os
import posixpath
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import pyarrow
import pyarrow.fs as pafs
import xxhash

from tunekit.checkpoint._layout import CHECKPOINT_DIR, TRAIN_DIR, files_by_checkpoint
from tunekit.storage._files import file_bytes, loads
from tunekit.storage._location import Storage, storage_errors

__all__ = ["ExperimentIndex", "INDEX_NAME"]

INDEX_NAME = ".tunekit-index.json"
_FORMAT, _VERSION = "tunekit-index", 5
#: The files directly in a trial's directory that the readers open (the others' names alone are listed locally:
#: Ray's ``progress.csv``, TensorBoard event files, ``params.pkl``); every file of a checkpoint is listed whole.
_READ = frozenset({"params.json", "result.json", "error.txt"})
#: Key suffix of a top-level directory's summary (:meth:`ExperimentIndex.trial`).
_TRIAL = "\0trial"


class ExperimentIndex:
    """One recursive listing of an experiment, and what the index holds for its files and trial directories."""

    def __init__(self, experiment: Storage) -> None:
        self.experiment = experiment
        #: Path inside the experiment -> [size, mtime] for every file the listing shows.
        self.stamps: dict[str, list[Any]] = {}
        #: Directory (path inside the experiment, "" for its top) -> its entries' names -> whether a directory.
        self.tree: dict[str, dict[str, bool]] = {"": {}}
        #: Top-level directory -> a digest of every file under it as listed (path, size, time).
        self.dir_stamps: dict[str, str] = {}
        self._listed = False
        self._cached: dict[str, Any] = {}
        self._fresh: dict[str, Any] = {}
        self.read_slowly = 0  # entries read from their files (not from the index)
        self._rows_text: bytes | memoryview = b""  # (the index's third line: the trials' rows, parsed when asked for)
        self._rows: dict[str, Any] | None = None
        self._lock = threading.Lock()  # (listed once when readers on several threads ask at once)
        #: The local listing, its entries below the top not yet in :attr:`tree` and :attr:`stamps` (:meth:`_entries`).
        self._unread: list[pafs.FileInfo] = []
        self._nested: list[tuple[str, str, int]] = []  # (its files below a trial's own files: top, rel, bytes)

    def _list(self) -> None:
        """The experiment listed once, recursively (at the first question: after the reader checked it exists);
        its index read."""
        with self._lock:
            if not self._listed:
                self._list_now()

    def _list_now(self) -> None:
        below: dict[str, list[str]] = {}  # top-level directory -> its files' stamps
        if self.experiment.is_local:
            self._list_local(below)
        else:
            with storage_errors("list", self.experiment):
                self._take_remote(self.experiment.filesystem.get_file_info(
                    pafs.FileSelector(self.experiment.path, recursive=True, allow_not_found=True)), below)
            self._cached = self._load() if INDEX_NAME in self.stamps else {}
        self.dir_stamps = {top: xxhash.xxh3_64_hexdigest("\n".join(sorted(lines)).encode())
                           for top, lines in below.items()}
        self._listed = True

    def _list_local(self, below: dict[str, list[str]]) -> None:
        """The experiment listed by pyarrow, recursively, on a thread of its own (in C++, without the GIL) while the
        index is parsed here; each top-level directory's digest made from it at once, its entries put into
        :attr:`tree` and :attr:`stamps` only when a reader asks for them (:meth:`_entries`). A file directly in a
        trial's directory that no reader opens (Ray's ``progress.csv``, TensorBoard event files, ``params.pkl``)
        counts by its name alone. Should a directory go while pyarrow lists it (retention deletes checkpoints
        during a sweep), the experiment is walked by ``os.scandir``, which skips what went."""
        root = self.experiment.path.rstrip("/")
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunekit-list") as pool:
            listing = pool.submit(self.experiment.filesystem.get_file_info,
                                  pafs.FileSelector(root, recursive=True, allow_not_found=True))
            self._cached = self._load()
            try:
                infos = listing.result()
            except (OSError, pyarrow.ArrowException):
                infos = None
        if infos is None:
            with storage_errors("list", self.experiment):
                self._walk(root, "", below, None, "")
            return
        cut, nested = len(root) + 1, self._nested
        for info in infos:
            size = info.size
            top, sep, rest = info.path[cut:].partition("/")
            if not sep:
                self.tree[""][top] = size is None
                if size is None:
                    below.setdefault(top, [])
                else:
                    self.stamps[top] = [size, info.mtime_ns]
            elif size is not None:  # (a directory has none)
                lines = below.setdefault(top, [])
                if "/" in rest:  # (in a checkpoint, or another directory of the trial's)
                    lines.append(f"{rest}\t{size}\t{info.mtime_ns}")
                    nested.append((top, rest, size))
                else:
                    lines.append(f"{rest}\t{size}\t{info.mtime_ns}" if rest in _READ else rest)
        self._unread = infos

    def _entries(self) -> None:
        """The local listing's entries below the top into :attr:`tree` and :attr:`stamps` (when first asked for)."""
        infos, self._unread = self._unread, []
        tree, stamps, cut = self.tree, self.stamps, len(self.experiment.path.rstrip("/")) + 1
        for info in infos:
            rel, size = info.path[cut:], info.size
            parent, _, base = rel.rpartition("/")
            if parent:
                tree.setdefault(parent, {})[base] = size is None
                if size is None:
                    tree.setdefault(rel, {})
                else:
                    stamps[rel] = [size, info.mtime_ns]

    def _walk(self, path: str, rel: str, below: dict[str, list[str]], lines: list[str] | None, sub: str) -> None:
        """The local directory ``path`` (``rel`` inside the experiment, ``sub`` inside its top-level directory,
        whose files' stamps go into ``lines``) into the listing, recursively, by ``os.scandir``."""
        entries = self.tree.setdefault(rel, {})
        prefix = f"{rel}/" if rel else ""
        try:
            with os.scandir(path) as listing:
                for entry in listing:
                    name = entry.name
                    if entry.is_file():
                        entries[name] = False
                        stat = entry.stat()
                        size, mtime = stat.st_size, stat.st_mtime_ns
                        self.stamps[prefix + name] = [size, mtime]
                        if lines is not None:
                            lines.append(f"{sub}{name}\t{size}\t{mtime}" if sub or name in _READ else name)
                    elif entry.is_dir(follow_symlinks=False):
                        entries[name] = True
                        self._walk(entry.path, prefix + name, below,
                                   below.setdefault(name, []) if lines is None else lines,
                                   "" if lines is None else f"{sub}{name}/")
        except (FileNotFoundError, NotADirectoryError):
            pass

    def _take_remote(self, infos: list[pafs.FileInfo], below: dict[str, list[str]]) -> None:
        root = self.experiment.path.rstrip("/") + "/"
        cut, file_type, dir_type = len(root), pafs.FileType.File, pafs.FileType.Directory
        for info in infos:
            kind, path = info.type, info.path
            if (kind != file_type and kind != dir_type) or not path.startswith(root):
                continue
            rel = path[cut:].rstrip("/")
            if kind == file_type:
                size, mtime = info.size, info.mtime_ns
                self.stamps[rel] = [size, mtime]
                top, sep, rest = rel.partition("/")
                if sep:
                    below.setdefault(top, []).append(f"{rest}\t{size}\t{mtime}")
                self._add(rel, False)
            else:
                self._add(rel, True)

    def _add(self, rel: str, is_dir: bool) -> None:
        """``rel`` in its directory's entries, and each directory above it in its own (object stores list none)."""
        while rel:
            parent, _, name = rel.rpartition("/")
            siblings = self.tree.get(parent)
            if siblings is None:
                siblings = self.tree[parent] = {}
            known = name in siblings
            if is_dir:
                siblings[name] = True
                if rel not in self.tree:
                    self.tree[rel] = {}
                if known:
                    return
            elif not known:
                siblings[name] = False
            rel, is_dir = parent, True

    def _load(self, *, top_only: bool = False) -> dict[str, Any]:
        """The entries of the index (none: no index, or one damaged, foreign or of another format or path);
        ``top_only``: those of files at the experiment's top alone (its first line: no trial's entries parsed).
        The trials' rows (its third line) are kept unparsed for :meth:`trial_rows`."""
        try:  # (remote: asked only when the listing shows it, and then read without asking again)
            data = file_bytes(self.experiment.filesystem, posixpath.join(self.experiment.path, INDEX_NAME)) or b""
            # (JSON text holds no raw line break: the lines split there, and are parsed in place)
            first, view = data.find(b"\n"), memoryview(data)
            index = loads(view[:first] if first >= 0 else view) if data else None
            second = data.find(b"\n", first + 1) if first >= 0 else -1
            if top_only or not isinstance(index, dict) or second < 0 or not data.endswith(b"}"):
                below = None  # (an index cut short: its rows line, parsed only when asked for, is cut too)
            else:
                below = loads(view[first + 1:second])
                self._rows_text = view[second + 1:]
        except (OSError, ValueError):
            return {}
        if not isinstance(index, dict) or index.get("format") != _FORMAT or index.get("version") != _VERSION \
                or not isinstance(index.get("entries"), dict) or index.get("location") != self.experiment.path:
            return {}  # (another location's: what it says of damage names that one)
        if top_only:
            return index["entries"]
        return {**index["entries"], **below} if isinstance(below, dict) else {}

    def _stored_rows(self) -> dict[str, Any]:
        """The index's third line: trial summary key -> its rows' JSON text ({} when damaged)."""
        with self._lock:
            if self._rows is None:
                try:
                    rows = loads(self._rows_text) if self._rows_text else {}
                except ValueError:
                    rows = {}
                self._rows, self._rows_text = rows if isinstance(rows, dict) else {}, b""
            return self._rows

    def stored(self, key: str, files: list[str], build: Callable[[], Any]) -> Any:
        """What ``build()`` makes of the files ``files`` at the experiment's top (the index's entry ``key``), from the
        index while they are as it recorded them, and without a listing (``read_experiment(results=False)``)."""
        paths = [posixpath.join(self.experiment.path, name) for name in files]
        with storage_errors("read", self.experiment):
            infos = self.experiment.filesystem.get_file_info(paths) if paths else []
        stamp = [[name, info.size, info.mtime_ns] if info.type == pafs.FileType.File else [name, None, None]
                 for name, info in zip(files, infos)]
        entry = self._load(top_only=True).get(key)
        if isinstance(entry, dict) and entry.get("stamp") == stamp and "value" in entry:
            return entry["value"]
        return build()

    def top(self) -> tuple[list[str], list[str]]:
        """The directories and the files at the experiment's top, each sorted by name."""
        self._list()
        entries = sorted(self.tree.get("", {}).items())
        return [name for name, is_dir in entries if is_dir], [name for name, is_dir in entries if not is_dir]

    def root_stamp(self, names: list[str]) -> list[Any]:
        """The stamp of the files ``names`` at the experiment's top, as listed (for :meth:`cached`)."""
        self._list()
        return [[name, *self.stamps.get(name, [None, None])] for name in names]

    def children(self, rel: str) -> list[tuple[str, bool]]:
        """The entries directly in directory ``rel`` ("" for the experiment's top): (name, is a directory)."""
        self._list()
        self._entries()
        return sorted(self.tree.get(rel, {}).items())

    def checkpoint_files(self) -> dict[str, dict[str, int]]:
        """:func:`tunekit.checkpoint._layout.checkpoint_files` from the listing."""
        self._list()
        out = files_by_checkpoint((rel, stamp[0] or 0) for rel, stamp in self.stamps.items())
        if not self._unread:
            return out
        train, at, files = [], None, None  # (what the local listing holds below the trials' own files)
        for top, rel, size in self._nested:
            sub, _, inner = rel.partition("/")
            if sub == TRAIN_DIR:
                train.append((f"{top}/{rel}", size))
                continue
            if (top, sub) != at:  # (a directory's files come one after another)
                at, files = (top, sub), out.setdefault(f"{top}/{sub}", {}) if CHECKPOINT_DIR.match(sub) else None
            if files is not None:
                files[inner] = size
        return {**out, **files_by_checkpoint(train)}

    def value(self, rel: str, read: Callable[[], Any], absent: Any = None, *, key: str | None = None) -> Any:
        """What ``read()`` returns for the file ``rel`` (its path inside the experiment): from the index when the
        listing shows the file as the index recorded it; ``absent`` when the listing does not show it (no
        request); else ``read()``, recorded for the next reader (under ``key``: another reading of the file)."""
        self._list()
        self._entries()
        stamp = self.stamps.get(rel)
        if stamp is None:
            return absent
        return self.cached(rel if key is None else key, stamp, read)

    def trial(self, name: str, build: Callable[[], Any]) -> Any:
        """What ``build()`` makes of the top-level directory ``name`` (a trial's summary): from the index while the
        listing shows every file under it as it was when the index recorded it, else built and recorded. A summary
        from the index holds no ``"rows"``: :meth:`trial_rows` gives them."""
        self._list()
        return self.cached(name + _TRIAL, self.dir_stamps.get(name), build)

    def trial_rows(self, name: str, summary: dict[str, Any], build: Callable[[], Any]) -> str:
        """The rows' JSON text of the trial summary :meth:`trial` gave for ``name``: the summary's own, else the
        index's (read when first asked for), else ``build()``'s (an index whose rows line is damaged)."""
        if "rows" in summary:
            return summary["rows"]
        text = self._stored_rows().get(name + _TRIAL)
        if isinstance(text, str):
            return text
        summary["rows"] = text = build()["rows"]
        return text

    def cached(self, key: str, stamp: Any, build: Callable[[], Any]) -> Any:
        """What ``build()`` returned under ``key`` when the files it read had ``stamp`` (JSON: sizes and times from
        the listing), while they still have it; else ``build()``, recorded for the next reader."""
        self._list()
        entry = self._cached.get(key)
        if isinstance(entry, dict) and entry.get("stamp") == stamp and "value" in entry:
            self._fresh[key] = entry
            return entry["value"]
        value = build()
        self._fresh[key] = {"stamp": stamp, "value": value}
        self.read_slowly += 1
        return value

    def _stamp_now(self, key: str, stamp: Any) -> Any:
        """The stamp the listing gives the entry ``key`` (recorded with ``stamp``) now; None: one it cannot confirm."""
        rel, _, kind = key.partition("\0")
        if kind == _TRIAL[1:]:
            return self.dir_stamps.get(rel)
        if rel:
            self._entries()
            return self.stamps.get(rel)
        ok = isinstance(stamp, list) and all(isinstance(s, list) and s and isinstance(s[0], str) for s in stamp)
        return self.root_stamp([s[0] for s in stamp]) if ok else None  # (made of files at the top: those now)

    def save(self) -> None:
        """Write the index back when this read found anything it did not hold or a file changed (best effort: an
        experiment that cannot be written is read the slow way next time too). Entries this read did not use stay
        while the listing shows their files unchanged: another reader's (``verify``'s bytes, ``status``'s parsed
        values) serve that reader next time."""
        if not self._listed:
            return
        kept = {key: entry for key, entry in self._cached.items() if key not in self._fresh and isinstance(entry, dict)
                and entry.get("stamp") is not None and entry.get("stamp") == self._stamp_now(key, entry.get("stamp"))}
        if not self.read_slowly and len(kept) + len(self._fresh) == len(self._cached):
            return
        entries = {**kept, **self._fresh}
        top = {key: entry for key, entry in entries.items() if key.startswith("\0")}  # (the top's first)
        rest, rows = self._split_rows({key: entry for key, entry in entries.items() if key not in top})
        data = b"\n".join(json.dumps(part, separators=(",", ":"), default=str).encode() for part in (
            {"format": _FORMAT, "version": _VERSION, "location": self.experiment.path, "entries": top}, rest, rows))
        path = posixpath.join(self.experiment.path, INDEX_NAME)
        try:
            if self.experiment.is_local:  # (a reader at the same time sees the old index or the new one)
                temporary = f"{path}.{os.getpid()}.tmp"
                with open(temporary, "wb") as out:
                    out.write(data)
                os.replace(temporary, path)
            else:
                with self.experiment.filesystem.open_output_stream(path) as out:
                    out.write(data)
        except (OSError, ValueError):
            pass

    def _split_rows(self, entries: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """``entries`` without the trial summaries' rows, and those rows by key (the index's second and third
        lines). A summary from the index takes its rows from the index's rows line; one whose rows are not there
        (a damaged line) is left out, to be built again by the next reader."""
        rest: dict[str, Any] = {}
        rows: dict[str, str] = {}
        for key, entry in entries.items():
            value = entry.get("value")
            if not key.endswith(_TRIAL) or not isinstance(value, dict):
                rest[key] = entry
                continue
            text = value["rows"] if "rows" in value else self._stored_rows().get(key)
            if isinstance(text, str):
                rest[key] = {**entry, "value": {k: v for k, v in value.items() if k != "rows"}}
                rows[key] = text
        return rest, rows

