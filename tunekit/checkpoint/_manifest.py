"""The checkpoint format: file names, hashing, the manifest, and verifying one checkpoint directory.

Implementation tier: the public names are re-exported by :mod:`tunekit.checkpoint._directory`,
whose docstring describes the format. No threads, no Ray, no torch, no trial
logic: a checkpoint directory is judged by its files alone.

Contract: :func:`manifest_bytes` makes the manifest a writer writes last; :func:`verify_directory` (and
:func:`verify_checkpoint`, which first resolves a location) answers ``good``, ``incomplete``, ``corrupt`` or
``unsupported`` for a directory, reading each listed file once (or none: sizes alone); the ``is_*``,
``read_metadata``, ``unsupported_format`` and ``manifest_sizes`` readers never hash. Storage errors surface as
one :class:`~tunekit.StorageError` line (:func:`tunekit.storage._location.storage_errors`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import posixpath
import stat as statmod
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Union

import pyarrow.fs as pafs

from tunekit.checkpoint._ranks import RANKS_FILE, rank_problems
from tunekit.errors import CheckpointError, TunekitError
from tunekit.storage._files import file_bytes, loads
from tunekit.storage._location import Storage, resolve_storage, storage_errors

if TYPE_CHECKING:
    from ray import tune

__all__ = [
    "CheckpointLocation", "CheckpointReport", "MANIFEST_FILE", "MANIFEST_FORMAT",
    "METADATA_FILE", "MISSING", "NOT_WRITTEN", "STATE_FILE", "TUNEKIT_FILES", "UnsupportedManifest", "WRITTEN_HASH",
    "confirm_upload", "digest_bytes", "hash_file", "is_foreign_checkpoint",
    "is_tunekit_checkpoint", "json_safe", "locate", "manifest_bytes", "manifest_sizes", "manifest_version",
    "new_hash", "read_metadata", "size_problems", "unsupported_format", "verify_checkpoint", "verify_directory",
]


STATE_FILE = "state.pt"
METADATA_FILE = "tunekit.json"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "tunekit-manifest/3"


_MANIFEST_PREFIX = "tunekit-manifest/"


#: Manifest format version -> the hash every file entry (and the manifest's digest) uses.
_HASH_OF_VERSION = {2: "sha256", 3: "xxh3_128"}


WRITTEN_HASH = _HASH_OF_VERSION[3]
TUNEKIT_FILES = (STATE_FILE, METADATA_FILE, MANIFEST_FILE)
_CHUNK = 8 * 1024 * 1024


CheckpointLocation = Union[str, "os.PathLike[str]", Storage, "tune.Checkpoint"]


def locate(location: CheckpointLocation) -> Storage:
    """Where a checkpoint lives, as (filesystem, path)."""
    # A Ray checkpoint can only exist once Ray is imported; looking its class
    # up in sys.modules keeps Ray out of the offline readers.
    for module in ("ray.tune", "ray.train"):
        cls = getattr(sys.modules.get(module), "Checkpoint", None)
        if cls is not None and isinstance(location, cls):
            return Storage(location.filesystem, location.path, str(location.path))
    return resolve_storage(location)


def new_hash(algorithm: str, data: bytes = b"") -> Any:
    """A hash object (``update``, ``hexdigest``) for an algorithm a manifest names, fed ``data``."""
    if algorithm == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128(data)
    return hashlib.new(algorithm, data)


def _hash_stream(stream: Any, algorithm: str) -> str:
    digest = new_hash(algorithm)
    while chunk := stream.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def hash_file(path: str | os.PathLike[str], algorithm: str) -> str:
    """Hash a local file; mapped, not read into buffers (hashing runs at page-cache speed)."""
    import mmap

    digest = new_hash(algorithm)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size <= _CHUNK:  # (a small file: one read costs less than a mapping)
            digest.update(fh.read())
        else:
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                with contextlib.suppress(AttributeError, OSError):
                    mapped.madvise(mmap.MADV_SEQUENTIAL)
                digest.update(mapped)
    return digest.hexdigest()


def _canonical(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def digest_bytes(data: bytes, algorithm: str) -> str:
    return new_hash(algorithm, data).hexdigest()


def manifest_bytes(files: dict[str, dict[str, Any]]) -> bytes:
    body = {"files": files, "format": MANIFEST_FORMAT}
    digest = digest_bytes(_canonical(body), WRITTEN_HASH)
    return _canonical({**body, "digest": digest}) + b"\n"


class UnsupportedManifest(TunekitError, ValueError):
    """The manifest is of a format newer than this tunekit reads."""


def manifest_version(raw: bytes) -> int | None:
    """The format version a manifest declares (None if it declares none); no verification."""
    try:
        return _format_version(_parse_json(raw).get("format"))
    except (ValueError, AttributeError):
        return None


def _format_version(fmt: Any) -> int | None:
    """N of a ``tunekit-manifest/N`` format string; None for anything else."""
    if isinstance(fmt, str) and fmt.startswith(_MANIFEST_PREFIX) and fmt[len(_MANIFEST_PREFIX):].isdigit():
        return int(fmt[len(_MANIFEST_PREFIX):])
    return None


def _parse_manifest(raw: bytes) -> tuple[dict[str, dict[str, Any]], str]:
    """The manifest's file table and its hash; ValueError if any byte of it is off.

    Raises:
        UnsupportedManifest: a format newer than this tunekit reads.
        ValueError: anything else that is not a valid manifest.
    """
    manifest = _parse_json(raw)
    version = _format_version(manifest.get("format")) if isinstance(manifest, dict) else None
    if version is not None and version > max(_HASH_OF_VERSION):
        raise UnsupportedManifest(
            f"written by a newer tunekit (manifest format {_MANIFEST_PREFIX}{version}; this tunekit "
            f"reads formats {', '.join(map(str, sorted(_HASH_OF_VERSION)))}): upgrade tunekit to read it"
        )
    if version not in _HASH_OF_VERSION:
        raise ValueError(f"not a tunekit manifest (format {manifest.get('format')!r})"
                         if isinstance(manifest, dict) else "not a JSON object")
    algorithm = _HASH_OF_VERSION[version]
    if raw != _canonical(manifest) + b"\n":
        raise ValueError("not in canonical form")
    body = {k: v for k, v in manifest.items() if k != "digest"}
    if digest_bytes(_canonical(body), algorithm) != manifest.get("digest"):
        raise ValueError("its own digest does not match its content")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(e, dict) and isinstance(e.get("size"), int) and isinstance(e.get(algorithm), str)
        for e in files.values()
    ):
        raise ValueError("malformed file table")
    return files, algorithm


def json_safe(value: Any) -> Any:
    """Keep what JSON can hold; replace anything else with its repr."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return repr(value)


@dataclass
class CheckpointReport:
    """Outcome of :func:`verify_checkpoint`."""

    path: str
    status: Literal["good", "incomplete", "corrupt", "unsupported"]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "good"

    def describe(self) -> str:
        """One line: the path, the status and what is wrong."""
        tail = f": {'; '.join(self.problems)}" if self.problems else ""
        return f"{self.path} is {self.status}{tail}"


def _parse_json(raw: bytes) -> Any:
    """JSON by orjson (:func:`~tunekit.storage._files.loads`), strict UTF-8: a flipped byte in a string is damage."""
    return loads(raw.decode())


def _file_size(fs: pafs.FileSystem, path: str) -> int | None:
    """The size of the file at ``path``; None if no file is there. Locally one ``os.stat`` (3x cheaper)."""
    if type(fs) is pafs.LocalFileSystem:
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return st.st_size if statmod.S_ISREG(st.st_mode) else None
    info = fs.get_file_info(path)
    return info.size if info.type == pafs.FileType.File else None


def _digest(fs: pafs.FileSystem, path: str, algorithm: str, local: bool) -> str:
    if local:
        return hash_file(path, algorithm)
    with fs.open_input_stream(path) as stream:
        return _hash_stream(stream, algorithm)


def _storage_call(where: Storage, action: str, fn: Any, *args: Any) -> Any:
    with storage_errors(action, where):
        return fn(*args)


_HASH_NAMES = {"sha256": "SHA-256", "xxh3_128": "XXH3-128"}


#: What :func:`verify_directory` says of a directory that does not exist, and of an empty one (announced).
MISSING, NOT_WRITTEN = "directory is missing", "directory is empty: announced, its write in flight or never completed"


def verify_directory(fs: pafs.FileSystem, path: str, shown: str, *, ranks: Any = None,
                     hashes: bool = True) -> CheckpointReport:
    """Verify one checkpoint directory (a multi-worker one: every rank's part too, or those in ``ranks``); with
    ``hashes=False`` each file's size alone."""
    local = isinstance(fs, pafs.LocalFileSystem)
    if not (os.path.isdir(path) if local else fs.get_file_info(path).type == pafs.FileType.Directory):
        return CheckpointReport(shown, "incomplete", [MISSING])
    raw = file_bytes(fs, posixpath.join(path, MANIFEST_FILE))
    if raw is None:
        empty = not fs.get_file_info(pafs.FileSelector(path))
        return CheckpointReport(shown, "incomplete", [NOT_WRITTEN if empty else f"no {MANIFEST_FILE}"])
    try:
        files, algorithm = _parse_manifest(raw)
    except UnsupportedManifest as exc:
        return CheckpointReport(shown, "unsupported", [str(exc)])
    except (ValueError, TypeError) as exc:
        return CheckpointReport(shown, "corrupt", [f"{MANIFEST_FILE} is damaged: {exc}"])
    problems = []
    if STATE_FILE not in files:
        problems.append(f"{STATE_FILE}: not listed in manifest")
    for rel, entry in sorted(files.items()):
        file = posixpath.join(path, rel)
        size = _file_size(fs, file)
        if size is None:
            problems.append(f"{rel}: missing")
        elif size != entry["size"]:
            problems.append(f"{rel}: {size} bytes, manifest says {entry['size']}")
        elif hashes and _digest(fs, file, algorithm, local) != entry[algorithm]:
            problems.append(f"{rel}: {_HASH_NAMES[algorithm]} differs from manifest")
    each = functools.partial(verify_directory, hashes=hashes)
    incomplete, parts = rank_problems(fs, path, shown, each, ranks) if RANKS_FILE in files else (0, [])
    status = "incomplete" if incomplete else "corrupt" if problems or parts else "good"
    return CheckpointReport(shown, status, problems + parts)


def verify_checkpoint(location: CheckpointLocation, *, hashes: bool = True) -> CheckpointReport:
    """Check a checkpoint against its manifest (sizes and, unless ``hashes=False``, hashes), where it is stored.

    Args:
        location: A local path, URI, :class:`~tunekit.storage._location.Storage` or
            ``ray.tune.Checkpoint``.

    Returns:
        The report: ``good``, ``incomplete`` (no manifest: never committed,
        half-copied or manifest deleted), ``corrupt`` (files differ) or
        ``unsupported`` (a manifest format newer than this tunekit reads).

    Raises:
        StorageError: the storage itself cannot be read.
    """
    where = locate(location)
    return _storage_call(where, "verify", lambda: verify_directory(where.filesystem, where.path, where.uri,
                                                                   hashes=hashes))


def _check_listing(fs: pafs.FileSystem, path: str, shown: str) -> list[str]:
    raw = file_bytes(fs, posixpath.join(path, MANIFEST_FILE))
    if raw is None:
        return [f"no {MANIFEST_FILE}"]
    try:
        files, _ = _parse_manifest(raw)
    except UnsupportedManifest as exc:
        return [f"{MANIFEST_FILE}: {exc}"]
    except (ValueError, TypeError) as exc:
        return [f"{MANIFEST_FILE} is damaged: {exc}"]
    listed = {
        posixpath.relpath(info.path, path): info.size
        for info in fs.get_file_info(pafs.FileSelector(path, recursive=True))
        if info.type == pafs.FileType.File
    }
    return size_problems({rel: entry["size"] for rel, entry in files.items()}, listed)


def size_problems(manifest: dict[str, int], listed: dict[str, int]) -> list[str]:
    """The files of a manifest's table (path -> bytes) missing from ``listed`` (the same, from a listing) or
    of another size there, one line each."""
    return [f"{rel}: missing" if rel not in listed else f"{rel}: {listed[rel]} bytes, manifest says {size}"
            for rel, size in sorted(manifest.items()) if listed.get(rel) != size]


def confirm_upload(location: CheckpointLocation) -> None:
    """Cheaply confirm that a checkpoint arrived whole: every file, every size.

    One read of the manifest and one listing, no data read: it catches an
    upload that lost or cut a file without saying so.

    Raises:
        CheckpointError: a file is missing or has the wrong size.
    """
    where = locate(location)
    problems = _storage_call(where, "check", _check_listing, where.filesystem, where.path, where.uri)
    if problems:
        raise CheckpointError(
            f"checkpoint {where.uri} did not arrive whole on storage: {'; '.join(problems)}"
        )


def is_foreign_checkpoint(location: CheckpointLocation) -> bool:
    """True if the directory holds files and none of them is tunekit's: a checkpoint the training code wrote itself."""
    where = locate(location)
    infos = _storage_call(where, "list", where.filesystem.get_file_info,
                          pafs.FileSelector(where.path, allow_not_found=True))
    names = {info.base_name for info in infos}
    return bool(infos) and not names.intersection(TUNEKIT_FILES)


def is_tunekit_checkpoint(location: CheckpointLocation) -> bool:
    """True if the directory holds any tunekit file (committed or not)."""
    where = locate(location)
    fs = where.filesystem
    return any(fs.get_file_info(posixpath.join(where.path, n)).type == pafs.FileType.File for n in TUNEKIT_FILES)


def unsupported_format(location: CheckpointLocation) -> str | None:
    """Why this tunekit cannot read the checkpoint's manifest format, or None (cheap: no hashing).

    None also when there is no manifest or it is not one at all (that is for
    :func:`verify_checkpoint` to call incomplete or corrupt).
    """
    return manifest_sizes(location)[0]


def manifest_sizes(location: CheckpointLocation) -> tuple[str | None, dict[str, int] | str | None]:
    """One read of the manifest, no hashing: why this tunekit cannot read its format (as :func:`unsupported_format`),
    and the sizes its file table lists (path -> bytes); instead of those, why it is no manifest (damaged), or
    None when there is none (not written yet, or a checkpoint tunekit did not write)."""
    where = locate(location)
    raw = _storage_call(where, "read", file_bytes, where.filesystem, posixpath.join(where.path, MANIFEST_FILE))
    if raw is None:
        return None, None
    try:
        manifest = _parse_json(raw)
        version = _format_version(manifest["format"])
        if version is None:
            raise ValueError(f"not a tunekit manifest (format {manifest['format']!r})")
        if version > max(_HASH_OF_VERSION):
            try:
                _parse_manifest(raw)
            except UnsupportedManifest as exc:  # (its first check)
                return str(exc), None
        return None, {rel: entry["size"] for rel, entry in manifest["files"].items()}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return None, f"{MANIFEST_FILE} is damaged: {type(exc).__name__}: {exc}"


def read_metadata(location: CheckpointLocation) -> dict[str, Any]:
    """Read ``tunekit.json`` of a checkpoint (no verification, no unpickling)."""
    where = locate(location)
    raw = _storage_call(where, "read", file_bytes, where.filesystem, posixpath.join(where.path, METADATA_FILE))
    if raw is None:
        raise CheckpointError(f"{where.uri}: not a tunekit checkpoint (no {METADATA_FILE})")
    try:
        meta = _parse_json(raw)
    except ValueError as exc:
        raise CheckpointError(f"{where.uri}/{METADATA_FILE}: unreadable JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{where.uri}/{METADATA_FILE}: expected a JSON object")
    return meta
