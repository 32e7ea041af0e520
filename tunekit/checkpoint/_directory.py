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

Why XXH3-128 (a guard against accidental damage, not an attacker; 28 GB/s): docs/checkpoints.md.

Checkpoints are verified where they are stored: the functions below take a
local path, a URI, a :class:`tunekit.storage._location.Storage` or a ``ray.tune.Checkpoint``.

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
import json
import os
import pickle
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow.fs as pafs

from tunekit.checkpoint import _faults
from tunekit.checkpoint._manifest import (
    MANIFEST_FILE, MANIFEST_FORMAT, METADATA_FILE, STATE_FILE, WRITTEN_HASH, CheckpointLocation, CheckpointReport,
    UnsupportedManifest, confirm_upload, digest_bytes, hash_file, is_foreign_checkpoint, is_tunekit_checkpoint,
    json_safe, locate, manifest_bytes, manifest_version, new_hash, read_metadata, unsupported_format,
    verify_checkpoint, verify_directory
)
from tunekit.errors import CheckpointError, first_line
from tunekit.storage._location import storage_errors

if TYPE_CHECKING:
    import torch

# torch and Ray are imported where a function needs them, not here: the offline
# readers (status, verify, report) use this module without either.

__all__ = [
    "CheckpointLocation", "CheckpointReport", "MANIFEST_FILE", "MANIFEST_FORMAT", "METADATA_FILE", "STATE_FILE",
    "UnsupportedManifest", "confirm_upload", "fsync_paths", "is_foreign_checkpoint", "is_tunekit_checkpoint",
    "local_checkpoint", "manifest_version", "read_metadata", "read_state", "unsupported_format",
    "verify_checkpoint", "write_checkpoint"
]


# Verification on restore runs on a helper thread: the hashes and file I/O
# release the GIL, so verifying overlaps ``torch.load``.
_HELPERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tunekit-hash")


class _HashingWriter:
    """A write-through file object that keeps the hash and size of what passed.

    ``torch.save`` writes each tensor's bytes in one call; XXH3 hashes them
    at about 28 GB/s, a few percent of the write, so no second pass over the
    file is needed.
    """

    def __init__(self, fh: Any) -> None:
        self.fh, self.digest, self.size = fh, new_hash(WRITTEN_HASH), 0
        self._on_first_write: Any = None

    def write(self, data: Any) -> int:
        if self._on_first_write is not None:
            self._on_first_write()
            self._on_first_write = None
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self.fh.write(view)
        self.size += view.nbytes
        _faults.reached("state")
        return view.nbytes

    def flush(self) -> None:
        self.fh.flush()


_CRC32_OPTION = threading.Lock()


def _torch_save_without_crc32(state: dict[str, Any], writer: _HashingWriter) -> None:
    """``torch.save(state, writer)`` without the zip format's per-record CRC32.

    The CRC32 is a large share of the write's CPU time, spent on the helper
    thread while training runs on the other core; the manifest's XXH3 hashes already cover every byte and are
    what restore verifies, and ``torch.load`` does not check the CRC. torch's
    switch is process-wide and read once, when ``torch.save`` opens its zip
    writer (before the first write), so it is off only until that first write:
    a ``torch.save`` of the user's in another thread in that short window
    would also skip its CRC32, which costs it nothing ``torch.load`` needs.
    """
    import torch
    import torch.serialization as ts

    if not hasattr(ts, "set_crc32_options"):  # torch < 2.5 has no switch
        torch.save(state, writer)
        return
    _CRC32_OPTION.acquire()  # one writer at a time flips the switch; released at the first write
    before = ts.get_crc32_options()
    restored = False

    def restore() -> None:
        nonlocal restored
        if not restored:
            restored = True
            ts.set_crc32_options(before)
            _CRC32_OPTION.release()

    ts.set_crc32_options(False)
    writer._on_first_write = restore
    try:
        torch.save(state, writer)
    finally:
        restore()


def fsync_paths(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_file(path: Path, data: bytes, *, sync: bool, staged: bool = False) -> None:
    tmp = path if staged else path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())
    if not staged:
        os.replace(tmp, path)


def write_checkpoint(
    directory: str | os.PathLike[str],
    state: dict[str, Any],
    *,
    metadata: dict[str, Any] | None = None,
    durable: bool = True,
    staged: bool = False,
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
            before returning. False returns once the files are in the page
            cache (safe from a killed process, not from a power loss): pass
            the directory to ``Durability.sync`` (:mod:`tunekit.trial._saving`) once
            it is where it stays. A power loss in between can only leave a
            checkpoint that verification reports as damaged, which restore skips.
        staged: ``directory`` is a new staging directory (it exists) holding nothing else,
            renamed into place once written: no temporary names for the files.

    Returns:
        The checkpoint directory.
    """
    import torch

    sync = bool(durable)
    path = Path(directory)
    manifest = path / MANIFEST_FILE
    if not staged:  # (a staging directory is new and empty: made by its writer, see ``staged``)
        path.mkdir(parents=True, exist_ok=True)
        if manifest.exists():
            manifest.unlink()  # an overwritten checkpoint is uncommitted until rewritten
    files: dict[str, dict[str, Any]] = {}
    with open(path / STATE_FILE, "wb") as fh:
        writer = _HashingWriter(fh)
        _torch_save_without_crc32(state, writer)
        fh.flush()
        if sync:
            os.fsync(fh.fileno())
    files[STATE_FILE] = {"size": writer.size, WRITTEN_HASH: writer.digest.hexdigest()}
    meta = {"format": "tunekit-checkpoint/1", "torch": torch.__version__, **json_safe(metadata or {})}
    meta_bytes = json.dumps(meta, sort_keys=True).encode()  # (one line: json's C encoder; indented, 5x the time)
    _write_file(path / METADATA_FILE, meta_bytes, sync=sync, staged=staged)
    files[METADATA_FILE] = {"size": len(meta_bytes), WRITTEN_HASH: digest_bytes(meta_bytes, WRITTEN_HASH)}
    if not staged:  # (a new staging directory holds nothing else)
        _list_other_files(path, files, sync=sync)
    _faults.reached("manifest")
    _write_file(manifest, manifest_bytes(files), sync=sync, staged=staged)
    return path


def _list_other_files(path: Path, files: dict[str, dict[str, Any]], *, sync: bool) -> None:
    """Add every other file under ``path`` (the user's, riding along) to the manifest's table."""
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = file.relative_to(path).as_posix()
        if rel in files or rel == MANIFEST_FILE:
            continue
        if sync:
            fsync_paths([file])
        files[rel] = {"size": file.stat().st_size, WRITTEN_HASH: hash_file(file, WRITTEN_HASH)}


@contextlib.contextmanager
def local_checkpoint(location: CheckpointLocation) -> Iterator[str]:
    """The checkpoint as a local directory: in place if local, else a temporary copy."""
    where = locate(location)
    if where.is_local:
        yield where.path
        return
    tmp = tempfile.mkdtemp(prefix="tunekit-download-")
    try:
        with storage_errors("download", where):
            pafs.copy_files(where.path, tmp, source_filesystem=where.filesystem,
                            destination_filesystem=pafs.LocalFileSystem())
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
        shown = locate(location).uri
        # Verify on a helper thread while torch.load reads the same (cached)
        # bytes; the state is returned only if verification passed.
        check = _HELPERS.submit(verify_directory, pafs.LocalFileSystem(), directory, shown) if verify else None
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


