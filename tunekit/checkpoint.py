"""Write, read and verify tunekit checkpoint directories.

A tunekit checkpoint is a directory holding:

``state.pt``
    The whole training state (:meth:`tunekit.TrainingState.state_dict`), saved
    with ``torch.save``. Every tensor is on the CPU, so the file loads on any
    device. It holds only tensors and plain Python values and is read with
    ``torch.load(..., weights_only=True)``: nothing in it can run code.
``tunekit.json``
    Human-readable metadata: format version, iteration, the trainable, the
    trial's config (JSON-safe part), torch version, the device it was saved on.
``manifest.json``
    Written last, as the commit mark: every other file's name, size and hash,
    plus the hash of the manifest's own content, in canonical JSON (sorted
    keys, no spaces), so a change of any byte of any listed file or of the
    manifest itself is detected. A directory without it is *incomplete*; one
    whose files differ from it is *corrupt*; one whose manifest has a format
    newer than this tunekit knows is *unsupported* (never called damaged).

Manifest formats: ``tunekit-manifest/3`` (written) names the hash of each
file, XXH3-128; ``tunekit-manifest/2`` (still verified) used SHA-256.

Why XXH3-128: the manifest guards against accidental damage (a torn or
truncated write, a lost or cut upload, bit rot), not against an attacker:
whoever can rewrite ``state.pt`` can rewrite an unsigned manifest too, and
``state.pt`` is only ever loaded with ``weights_only=True``. For that job a
128-bit non-cryptographic hash is as good as SHA-256, and restore and
``tunekit verify`` are bound by the hash. Measured on the development
machine (2 CPUs, one thread, 512 MiB in memory): SHA-256 1.8 GB/s, BLAKE3
4.5 GB/s (8.0 GB/s on two threads), CRC32 3.6 GB/s, XXH3-128 28 GB/s. At
that speed hashing costs a few percent of reading the bytes from the page
cache, so a verified restore costs what ``torch.load`` costs.

Checkpoints are verified where they are stored: the functions below take a
local path, a URI, a :class:`tunekit.storage.Storage` or a ``ray.tune.Checkpoint``.

Example:
    >>> import tempfile, torch
    >>> from tunekit import TrainingState
    >>> state = TrainingState(models={"model": torch.nn.Linear(2, 1)})
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = write_checkpoint(d, state.state_dict(), metadata={"iteration": 1})
    ...     verify_checkpoint(d).status
    'good'
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import posixpath
import re
import shutil
import socket
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal, Union

import pyarrow
import pyarrow.fs as pafs

from tunekit.experiment_dir import DAMAGED_COPY
from tunekit.errors import CheckpointError, StorageError, first_line
from tunekit.storage import Storage, resolve_storage

if TYPE_CHECKING:
    import torch
    from ray import tune

# torch and Ray are imported where a function needs them, not here: the offline
# readers (status, verify, report) use this module without either.

__all__ = [
    "MANIFEST_FILE",
    "METADATA_FILE",
    "STATE_FILE",
    "CheckpointLocation",
    "CheckpointReport",
    "confirm_upload",
    "is_tunekit_checkpoint",
    "leftovers",
    "load_model",
    "local_checkpoint",
    "read_metadata",
    "read_state",
    "sync_in_background",
    "verify_checkpoint",
    "wait_for_durability",
    "write_checkpoint",
]

STATE_FILE = "state.pt"
METADATA_FILE = "tunekit.json"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "tunekit-manifest/3"
_MANIFEST_PREFIX = "tunekit-manifest/"
#: Manifest format version -> the hash every file entry (and the manifest's digest) uses.
_HASH_OF_VERSION = {2: "sha256", 3: "xxh3_128"}
_WRITTEN_HASH = _HASH_OF_VERSION[3]
_TUNEKIT_FILES = (STATE_FILE, METADATA_FILE, MANIFEST_FILE)
_CHUNK = 8 * 1024 * 1024

CheckpointLocation = Union[str, "os.PathLike[str]", Storage, "tune.Checkpoint"]


def _locate(location: CheckpointLocation) -> Storage:
    """Where a checkpoint lives, as (filesystem, path)."""
    # A Ray checkpoint can only exist once Ray is imported; looking its class
    # up in sys.modules keeps Ray out of the offline readers.
    for module in ("ray.tune", "ray.train"):
        cls = getattr(sys.modules.get(module), "Checkpoint", None)
        if cls is not None and isinstance(location, cls):
            return Storage(location.filesystem, location.path, str(location.path))
    return resolve_storage(location)


def _new_hash(algorithm: str) -> Any:
    """A hash object (``update``, ``hexdigest``) for an algorithm a manifest names."""
    if algorithm == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128()
    return hashlib.new(algorithm)


def _hash_stream(stream: Any, algorithm: str) -> str:
    digest = _new_hash(algorithm)
    while chunk := stream.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _hash_file(path: str | os.PathLike[str], algorithm: str) -> str:
    """Hash a local file; mapped, not read into buffers (hashing runs at page-cache speed)."""
    import mmap

    digest = _new_hash(algorithm)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size:
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                with contextlib.suppress(AttributeError, OSError):
                    mapped.madvise(mmap.MADV_SEQUENTIAL)
                digest.update(mapped)
    return digest.hexdigest()


def _canonical(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _digest_bytes(data: bytes, algorithm: str) -> str:
    digest = _new_hash(algorithm)
    digest.update(data)
    return digest.hexdigest()


def _manifest_bytes(files: dict[str, dict[str, Any]]) -> bytes:
    body = {"files": files, "format": MANIFEST_FORMAT}
    digest = _digest_bytes(_canonical(body), _WRITTEN_HASH)
    return _canonical({**body, "digest": digest}) + b"\n"


class UnsupportedManifest(ValueError):
    """The manifest is of a format newer than this tunekit reads."""


def manifest_version(raw: bytes) -> int | None:
    """The format version a manifest declares (None if it declares none); no verification."""
    try:
        fmt = json.loads(raw).get("format")
    except (ValueError, AttributeError):
        return None
    if isinstance(fmt, str) and fmt.startswith(_MANIFEST_PREFIX) and fmt[len(_MANIFEST_PREFIX):].isdigit():
        return int(fmt[len(_MANIFEST_PREFIX):])
    return None


def _parse_manifest(raw: bytes) -> tuple[dict[str, dict[str, Any]], str]:
    """The manifest's file table and its hash; ValueError if any byte of it is off.

    Raises:
        UnsupportedManifest: a format newer than this tunekit reads.
        ValueError: anything else that is not a valid manifest.
    """
    manifest = json.loads(raw)
    version = manifest_version(raw) if isinstance(manifest, dict) else None
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
    if _digest_bytes(_canonical(body), algorithm) != manifest.get("digest"):
        raise ValueError("its own digest does not match its content")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(e, dict) and isinstance(e.get("size"), int) and isinstance(e.get(algorithm), str)
        for e in files.values()
    ):
        raise ValueError("malformed file table")
    return files, algorithm


def _json_safe(value: Any) -> Any:
    """Keep what JSON can hold; replace anything else with its repr."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return repr(value)


# Verification on restore and background fsync run on helper threads: the
# hashes and file I/O release the GIL, so verifying overlaps ``torch.load``.
_HELPERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tunekit-hash")
#: Write and fsync helper threads' CPU priority (nice) below the training thread's: on a busy machine a
#: background write takes spare cycles and training keeps its own.
_WRITER_NICE = 10


def _lower_priority() -> None:
    """Run this helper thread at a lower CPU priority than training (Linux: per thread)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _WRITER_NICE)
    except (AttributeError, OSError):  # no per-thread priorities here; the write still runs
        pass


_SYNCER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunekit-fsync", initializer=_lower_priority)
_pending_syncs: list[Future] = []
_pending_lock = threading.Lock()


class _HashingWriter:
    """A write-through file object that keeps the hash and size of what passed.

    ``torch.save`` writes each tensor's bytes in one call; XXH3 hashes them
    at about 28 GB/s, a few percent of the write, so no second pass over the
    file is needed.
    """

    def __init__(self, fh: Any) -> None:
        self.fh, self.digest, self.size = fh, _new_hash(_WRITTEN_HASH), 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self.fh.write(view)
        self.size += view.nbytes
        _write_phase("state")
        return view.nbytes

    def flush(self) -> None:
        self.fh.flush()


#: Fault injection for tests (``tests/trainables/contract.py``): called with the
#: phase of a checkpoint write that was just reached ("state": a chunk of
#: ``state.pt`` written; "manifest": every file written, before the manifest).
#: None (the default) costs one global lookup per write call.
_on_write_phase: Any = None


def _write_phase(phase: str) -> None:
    hook = _on_write_phase
    if hook is not None:
        hook(phase)


def _fsync_paths(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def wait_for_durability() -> None:
    """Block until every checkpoint written with ``durable="background"`` is on disk.

    Raises the first fsync error met (a checkpoint not made durable).
    """
    with _pending_lock:
        pending, _pending_syncs[:] = list(_pending_syncs), []
    for future in pending:
        future.result()


def _write_file(path: Path, data: bytes, *, sync: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_checkpoint(
    directory: str | os.PathLike[str],
    state: dict[str, Any],
    *,
    metadata: dict[str, Any] | None = None,
    durable: bool = True,
) -> Path:
    """Write ``state`` into ``directory`` as a tunekit checkpoint.

    The manifest is written last; a crash before it leaves an *incomplete*
    checkpoint that readers refuse, never a silently damaged one. ``state.pt``
    is hashed while it is written (no second pass over the file).

    Args:
        directory: Where to write (created if missing; other files in it are
            listed in the manifest too, so user files ride along verified).
        state: A state dict, usually :meth:`TrainingState.state_dict`.
        metadata: JSON-like metadata stored in ``tunekit.json``.
        durable: True fsyncs every file before the manifest and the manifest
            before returning. False returns once the files are written (in
            the page cache: safe from a killed process, not from a power
            loss); pass the directory to :func:`sync_in_background` once it
            is where it stays, so training goes on while it reaches the disk.
            A power loss in between can only leave a checkpoint that
            verification reports as damaged (the manifest holds every file's
            hash), which restore then skips.

    Returns:
        The checkpoint directory.
    """
    import torch

    sync = bool(durable)
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    manifest = path / MANIFEST_FILE
    if manifest.exists():
        manifest.unlink()  # an overwritten checkpoint is uncommitted until rewritten
    files: dict[str, dict[str, Any]] = {}
    with open(path / STATE_FILE, "wb") as fh:
        writer = _HashingWriter(fh)
        torch.save(state, writer)
        fh.flush()
        if sync:
            os.fsync(fh.fileno())
    files[STATE_FILE] = {"size": writer.size, _WRITTEN_HASH: writer.digest.hexdigest()}
    meta = {
        "format": "tunekit-checkpoint/1",
        "torch": torch.__version__,
        **_json_safe(metadata or {}),
    }
    meta_bytes = json.dumps(meta, indent=1, sort_keys=True).encode()
    _write_file(path / METADATA_FILE, meta_bytes, sync=sync)
    files[METADATA_FILE] = {"size": len(meta_bytes), _WRITTEN_HASH: _digest_bytes(meta_bytes, _WRITTEN_HASH)}
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = file.relative_to(path).as_posix()
        if rel in files or rel == MANIFEST_FILE:
            continue
        if sync:
            _fsync_paths([file])
        files[rel] = {"size": file.stat().st_size, _WRITTEN_HASH: _hash_file(file, _WRITTEN_HASH)}
    _write_phase("manifest")
    _write_file(manifest, _manifest_bytes(files), sync=sync)
    return path


def sync_in_background(directory: str | os.PathLike[str]) -> None:
    """fsync a checkpoint directory (its files, itself, its parent) on a helper thread.

    For checkpoints written with ``durable=False``; :func:`wait_for_durability`
    waits until it is done.
    """
    path = Path(directory)
    paths = sorted(p for p in path.rglob("*") if p.is_file()) + [path, path.parent]
    with _pending_lock:
        _pending_syncs[:] = [f for f in _pending_syncs if not f.done() or f.exception()]
        _pending_syncs.append(_SYNCER.submit(_fsync_paths, paths))


# -- what two-phase saves leave in a trial directory (tunekit.trial_checkpoint writes them) ---------

_PARTIAL = ".partial-"
#: A checkpoint's staging directory: ``.checkpoint_N.partial-HOST-PID-XXXX`` (older tunekits: no HOST-PID).
_STAGING = re.compile(r"^\.(checkpoint_\d+)\.partial-(?:(?P<host>.+)-(?P<pid>\d+)-)?[^-]*$")
#: A complete checkpoint kept (hard links) while a newer one is written.
_KEPT = re.compile(r"^\.checkpoint_(\d+)\.kept$")
_DAMAGED = DAMAGED_COPY


def _writer_id() -> str:
    host = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"
    return f"{host}-{os.getpid()}"


def _alive(host: str | None, pid: int) -> bool:
    """Whether the writer of a staging directory may still be writing."""
    if host is None:
        return False  # written by a tunekit before two-phase saves: never in the background
    if host != _writer_id().rsplit("-", 1)[0]:
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


def _staging_dirs(parent: str) -> list[tuple[str, str | None, int]]:
    """``(checkpoint name, host, pid)`` of every staging directory in a trial directory."""
    out = []
    with os.scandir(parent) as entries:
        for entry in entries:
            m = _STAGING.match(entry.name)
            if m and entry.is_dir():
                out.append((m[1], m["host"], int(m["pid"] or 0)))
    return out


def leftovers(fs: pafs.FileSystem, trial_dir: str) -> list[tuple[str, str]]:
    """Hidden checkpoint directories of a trial: ``(name, kind)``, kind "kept", "damaged", "writing" or "interrupted".

    "kept": a complete checkpoint kept while a newer one was written;
    "damaged": a damaged checkpoint's copy that ``tunekit resume`` kept;
    "writing": a staging directory whose writer is alive; "interrupted": one
    whose writer is gone (killed in the middle of the write).
    """
    out = []
    for info in fs.get_file_info(pafs.FileSelector(trial_dir, allow_not_found=True)):
        if info.type != pafs.FileType.Directory:
            continue
        if _KEPT.match(info.base_name):
            out.append((info.base_name, "kept"))
        elif _DAMAGED.match(info.base_name):
            out.append((info.base_name, "damaged"))
        elif m := _STAGING.match(info.base_name):
            local = isinstance(fs, pafs.LocalFileSystem)
            live = local and m["pid"] is not None and _alive(m["host"], int(m["pid"]))
            out.append((info.base_name, "writing" if live else "interrupted"))
    return sorted(out)



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


def _read_bytes(fs: pafs.FileSystem, path: str) -> bytes | None:
    """The file's bytes, or None when there is no such file."""
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as stream:
        return stream.read()


def _storage_call(where: Storage, action: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except (OSError, pyarrow.ArrowException) as exc:
        if isinstance(exc, (CheckpointError, StorageError)):
            raise
        first = first_line(exc)
        raise StorageError(f"cannot {action} {where.uri}: {first}") from None


_HASH_NAMES = {"sha256": "SHA-256", "xxh3_128": "XXH3-128"}


def _verify(fs: pafs.FileSystem, path: str, shown: str) -> CheckpointReport:
    info = fs.get_file_info(path)
    if info.type != pafs.FileType.Directory:
        return CheckpointReport(shown, "incomplete", ["directory is missing"])
    raw = _read_bytes(fs, posixpath.join(path, MANIFEST_FILE))
    if raw is None:
        return CheckpointReport(shown, "incomplete", [f"no {MANIFEST_FILE}"])
    try:
        files, algorithm = _parse_manifest(raw)
    except UnsupportedManifest as exc:
        return CheckpointReport(shown, "unsupported", [str(exc)])
    except (ValueError, TypeError) as exc:
        return CheckpointReport(shown, "corrupt", [f"{MANIFEST_FILE} is damaged: {exc}"])
    local = isinstance(fs, pafs.LocalFileSystem)
    problems = []
    if STATE_FILE not in files:
        problems.append(f"{STATE_FILE}: not listed in manifest")
    for rel, entry in sorted(files.items()):
        file = posixpath.join(path, rel)
        file_info = fs.get_file_info(file)
        if file_info.type != pafs.FileType.File:
            problems.append(f"{rel}: missing")
        elif file_info.size != entry["size"]:
            problems.append(f"{rel}: {file_info.size} bytes, manifest says {entry['size']}")
        else:
            if local:
                digest = _hash_file(file, algorithm)
            else:
                with fs.open_input_stream(file) as stream:
                    digest = _hash_stream(stream, algorithm)
            if digest != entry[algorithm]:
                problems.append(f"{rel}: {_HASH_NAMES[algorithm]} differs from manifest")
    return CheckpointReport(shown, "corrupt" if problems else "good", problems)


def verify_checkpoint(location: CheckpointLocation) -> CheckpointReport:
    """Check a checkpoint against its manifest (sizes and hashes), where it is stored.

    Args:
        location: A local path, URI, :class:`~tunekit.storage.Storage` or
            ``ray.tune.Checkpoint``.

    Returns:
        The report: ``good``, ``incomplete`` (no manifest: never committed,
        half-copied or manifest deleted), ``corrupt`` (files differ) or
        ``unsupported`` (a manifest format newer than this tunekit reads).

    Raises:
        StorageError: the storage itself cannot be read.
    """
    where = _locate(location)
    return _storage_call(where, "verify", _verify, where.filesystem, where.path, where.uri)


def _check_listing(fs: pafs.FileSystem, path: str, shown: str) -> list[str]:
    raw = _read_bytes(fs, posixpath.join(path, MANIFEST_FILE))
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
    problems = []
    for rel, entry in sorted(files.items()):
        if rel not in listed:
            problems.append(f"{rel}: missing")
        elif listed[rel] != entry["size"]:
            problems.append(f"{rel}: {listed[rel]} bytes, manifest says {entry['size']}")
    return problems


def confirm_upload(location: CheckpointLocation) -> None:
    """Cheaply confirm that a checkpoint arrived whole: every file, every size.

    One read of the manifest and one listing, no data read: it catches an
    upload that lost or cut a file without saying so.

    Raises:
        CheckpointError: a file is missing or has the wrong size.
    """
    where = _locate(location)
    problems = _storage_call(where, "check", _check_listing, where.filesystem, where.path, where.uri)
    if problems:
        raise CheckpointError(
            f"checkpoint {where.uri} did not arrive whole on storage: {'; '.join(problems)}"
        )


def is_foreign_checkpoint(location: CheckpointLocation) -> bool:
    """True if the directory holds files and none of them is tunekit's: a checkpoint the training code wrote itself."""
    where = _locate(location)
    infos = _storage_call(where, "list", where.filesystem.get_file_info,
                          pafs.FileSelector(where.path, allow_not_found=True))
    names = {info.base_name for info in infos}
    return bool(infos) and not names.intersection(_TUNEKIT_FILES)


def is_tunekit_checkpoint(location: CheckpointLocation) -> bool:
    """True if the directory holds any tunekit file (committed or not)."""
    where = _locate(location)
    fs = where.filesystem
    return any(
        fs.get_file_info(posixpath.join(where.path, name)).type == pafs.FileType.File
        for name in _TUNEKIT_FILES
    )


def unsupported_format(location: CheckpointLocation) -> str | None:
    """Why this tunekit cannot read the checkpoint's manifest format, or None (cheap: no hashing).

    None also when there is no manifest or it is not one at all (that is for
    :func:`verify_checkpoint` to call incomplete or corrupt).
    """
    where = _locate(location)
    raw = _storage_call(
        where, "read", _read_bytes, where.filesystem, posixpath.join(where.path, MANIFEST_FILE)
    )
    version = manifest_version(raw) if raw is not None else None
    if version is None or version in _HASH_OF_VERSION:
        return None
    try:
        _parse_manifest(raw)
    except UnsupportedManifest as exc:
        return str(exc)
    except (ValueError, TypeError):
        pass
    return None


def read_metadata(location: CheckpointLocation) -> dict[str, Any]:
    """Read ``tunekit.json`` of a checkpoint (no verification, no unpickling)."""
    where = _locate(location)
    raw = _storage_call(
        where, "read", _read_bytes, where.filesystem, posixpath.join(where.path, METADATA_FILE)
    )
    if raw is None:
        raise CheckpointError(f"{where.uri}: not a tunekit checkpoint (no {METADATA_FILE})")
    try:
        meta = json.loads(raw)
    except ValueError as exc:
        raise CheckpointError(f"{where.uri}/{METADATA_FILE}: unreadable JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{where.uri}/{METADATA_FILE}: expected a JSON object")
    return meta


@contextlib.contextmanager
def local_checkpoint(location: CheckpointLocation) -> Iterator[str]:
    """The checkpoint as a local directory: in place if local, else a temporary copy."""
    where = _locate(location)
    if where.is_local:
        yield where.path
        return
    tmp = tempfile.mkdtemp(prefix="tunekit-download-")
    try:
        _storage_call(
            where,
            "download",
            lambda: pafs.copy_files(
                where.path,
                tmp,
                source_filesystem=where.filesystem,
                destination_filesystem=pafs.LocalFileSystem(),
            ),
        )
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_state(
    location: CheckpointLocation,
    *,
    map_location: str | torch.device = "cpu",
    verify: bool = True,
) -> dict[str, Any]:
    """Load ``state.pt`` of a checkpoint with ``torch.load(weights_only=True)``.

    Raises:
        CheckpointError: the directory is incomplete or corrupt (``verify``),
            or the file would need arbitrary unpickling to load.
    """
    import torch

    with local_checkpoint(location) as directory:
        shown = _locate(location).uri
        # Verify on a helper thread while torch.load reads the same (cached)
        # bytes; the state is returned only if verification passed.
        check = _HELPERS.submit(_verify, pafs.LocalFileSystem(), directory, shown) if verify else None
        state_file = Path(directory) / STATE_FILE
        state, error = None, None
        try:
            if not state_file.is_file():
                error = f"checkpoint {shown}: no {STATE_FILE}"
            else:
                state = torch.load(state_file, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as exc:
            error = (
                f"checkpoint {shown}/{STATE_FILE} holds objects that need arbitrary "
                f"unpickling, which tunekit refuses ({first_line(exc)})"
            )
        except Exception as exc:  # a damaged file can fail anywhere in the unpickler
            error = f"checkpoint {shown}/{STATE_FILE} cannot be read: {first_line(exc)}"
        finally:
            report = check.result() if check is not None else None
        if report is not None and not report.ok:
            raise CheckpointError(f"checkpoint {report.describe()}")
        if error is not None:
            raise CheckpointError(error)
        return state


def load_model(
    location: CheckpointLocation,
    model: torch.nn.Module,
    *,
    name: str | None = None,
    map_location: str | torch.device = "cpu",
) -> torch.nn.Module:
    """Load a model's weights from a tunekit checkpoint, ready for inference.

    Args:
        location: The checkpoint (verified before loading): a local path, URI,
            :class:`~tunekit.storage.Storage` or ``ray.tune.Checkpoint``.
        model: A module of the same architecture; its weights are replaced.
        name: Which model of the state; defaults to the only/first one.
        map_location: Where to put the tensors while loading.

    Returns:
        ``model``, in eval mode.
    """
    state = read_state(location, map_location=map_location)
    models = state.get("models") or {}
    shown = _locate(location).uri
    if not models:
        raise CheckpointError(f"checkpoint {shown} holds no model")
    key = name if name is not None else next(iter(models))
    if key not in models:
        raise CheckpointError(f"checkpoint {shown} has no model {key!r}; it has {sorted(models)}")
    model.load_state_dict(models[key])
    return model.eval()
