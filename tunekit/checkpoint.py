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
local path, a URI, a :class:`tunekit.storage.Storage` or a ``ray.tune.Checkpoint``.

Example:
    >>> import tempfile, torch
    >>> from tunekit import TrainingState
    >>> state = TrainingState(models={"model": torch.nn.Linear(2, 1)})
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = write_checkpoint(d, state.state_dict(), metadata={"iteration": 1})
    ...     verify_checkpoint(d).status
    'good'

Tested in ``tests/tunekit/test_integrity.py`` and ``tests/tunekit/test_verify.py``.
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

from tunekit._manifest import (
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    METADATA_FILE,
    STATE_FILE,
    WRITTEN_HASH,
    CheckpointLocation,
    CheckpointReport,
    UnsupportedManifest,
    confirm_upload,
    digest_bytes,
    hash_file,
    is_foreign_checkpoint,
    is_tunekit_checkpoint,
    json_safe,
    locate,
    manifest_bytes,
    manifest_version,
    new_hash,
    read_metadata,
    unsupported_format,
    verify_checkpoint,
    verify_directory,
)
from tunekit.errors import CheckpointError, first_line
from tunekit.storage import storage_errors

if TYPE_CHECKING:
    import torch

# torch and Ray are imported where a function needs them, not here: the offline
# readers (status, verify, report) use this module without either.

__all__ = [
    "CheckpointLocation",
    "CheckpointReport",
    "MANIFEST_FILE",
    "MANIFEST_FORMAT",
    "METADATA_FILE",
    "STATE_FILE",
    "UnsupportedManifest",
    "confirm_upload",
    "export_dcp",
    "fsync_paths",
    "is_foreign_checkpoint",
    "is_tunekit_checkpoint",
    "load_model",
    "local_checkpoint",
    "manifest_version",
    "misfit_line",
    "read_full_state",
    "read_metadata",
    "read_state",
    "unsupported_format",
    "verify_checkpoint",
    "write_checkpoint",
    "write_phase",
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
        write_phase("state")
        return view.nbytes

    def flush(self) -> None:
        self.fh.flush()


#: Fault injection for tests (``tests/support/contract.py``): called with the
#: phase of a checkpoint write that was just reached ("state": a chunk of
#: ``state.pt`` written; "manifest": every file written, before the manifest;
#: "committed": a save renamed into place). None (the default) costs one global lookup per call.
_on_write_phase: Any = None


def write_phase(phase: str) -> None:
    """A checkpoint write reached ``phase``: the fault-injection point (``_on_write_phase``) for kill tests."""
    hook = _on_write_phase
    if hook is not None:
        hook(phase)


_CRC32_OPTION = threading.Lock()


def _torch_save_without_crc32(state: dict[str, Any], writer: _HashingWriter) -> None:
    """``torch.save(state, writer)`` without the zip format's per-record CRC32.

    The CRC32 is about 40% of the write's CPU time (0.17 s of 0.42 s for
    0.75 GiB here), spent on the helper thread while training runs on the
    other core; the manifest's XXH3 hashes already cover every byte and are
    what restore verifies, and ``torch.load`` does not check the CRC. torch's
    switch is process-wide and read once, when ``torch.save`` opens its zip
    writer (before the first write), so it is off only until that first write:
    a ``torch.save`` of the user's in another thread in that window (a few ms)
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
            the directory to ``Durability.sync`` (:mod:`tunekit._saving`) once
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
    write_phase("manifest")
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


def _pointed_at(location: CheckpointLocation) -> Any:
    """The Train checkpoint a multi-worker trial's Tune checkpoint (a pointer) stands for, else ``location``."""
    from tunekit.experiment_dir import POINTER_KEY, pointer_target
    from tunekit.storage import resolve_storage

    where = locate(location)
    try:
        value = read_metadata(where).get(POINTER_KEY)
    except CheckpointError:
        return location  # (read_state says what is wrong with it)
    if not isinstance(value, str):
        return location
    return resolve_storage(pointer_target(where.filesystem, where.path, value), filesystem=where.filesystem)


def export_dcp(location: CheckpointLocation, directory: str | os.PathLike[str]) -> str:
    """Write the sharded state of a multi-worker checkpoint into ``directory`` as one plain
    ``torch.distributed.checkpoint`` directory (every rank's ``__<r>_0.distcp`` and the ``.metadata``, hard
    links where the disk allows, else copies): DCP's own readers work on it, e.g.
    ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save(directory, "full.pt")``.

    ``location``: a Train checkpoint of :mod:`tunekit.multiworker`, or the Tune checkpoint that points at it;
    it is verified first (every rank's part).

    Raises:
        CheckpointError: it does not verify, or holds no sharded state (a DDP checkpoint's ``state.pt`` is
            whole already: :func:`read_full_state`).
    """
    train = _pointed_at(location)
    shown = locate(train).uri
    with local_checkpoint(train) as local:
        report = verify_directory(pafs.LocalFileSystem(), local, shown)
        if not report.ok:
            raise CheckpointError(f"checkpoint {report.describe()}")
        world = _sharded_world(local)
        if world is None:
            raise CheckpointError(f"checkpoint {shown} holds no sharded state (torch.distributed.checkpoint): "
                                  "read_full_state reads it whole")
        _link_shards(local, world, directory)
    return os.fspath(directory)


def _sharded_world(local: str) -> int | None:
    """The number of workers that wrote the local checkpoint ``local``, if it holds sharded state."""
    from tunekit._ranks import read_ranks

    try:
        layout = read_ranks(pafs.LocalFileSystem(), local)
    except ValueError:
        return None
    return int(layout["world_size"]) if layout.get("sharded") else None


def _link_shards(local: str, world: int, directory: str | os.PathLike[str]) -> None:
    from tunekit._ranks import rank_dir

    os.makedirs(directory, exist_ok=True)
    for rank in range(world):
        own = os.path.join(local, rank_dir(rank))
        for name in os.listdir(own):
            if name.endswith(".distcp") or name == ".metadata":
                try:
                    os.link(os.path.join(own, name), os.path.join(directory, name))
                except OSError:
                    shutil.copy2(os.path.join(own, name), os.path.join(directory, name))


def read_full_state(location: CheckpointLocation, *, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The whole state of a checkpoint as one process holds it, verified, without Ray or a process group.

    A single-worker checkpoint's is its ``state.pt`` (:func:`read_state`). A multi-worker one's (a Train
    checkpoint of :mod:`tunekit.multiworker`, or the Tune checkpoint that points at it): the replicated state,
    with the models and optimizers every rank's shard holds gathered into full tensors
    (``torch.distributed.checkpoint``'s ``dcp_to_torch_save``, on this one CPU process). Each rank's own RNG
    streams and data position stay in its ``rank-<r>/``.
    """
    import torch

    train = _pointed_at(location)
    with local_checkpoint(train) as local:
        state = read_state(local, map_location=map_location)  # (verified: every rank's part too)
        world = _sharded_world(local)
        if world is None:
            return state
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory(prefix="tunekit-full-") as tmp:
            _link_shards(local, world, os.path.join(tmp, "dcp"))
            dcp_to_torch_save(os.path.join(tmp, "dcp"), os.path.join(tmp, "full.pt"))
            full = torch.load(os.path.join(tmp, "full.pt"), map_location=map_location, weights_only=True)
    return {**state, "models": full.get("models", {}), "optimizers": full.get("optimizers", {})}


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
    state = read_full_state(location, map_location=map_location)
    models = state.get("models") or {}
    shown = locate(location).uri
    if not models:
        raise CheckpointError(f"checkpoint {shown} holds no model")
    key = name if name is not None else next(iter(models))
    if key not in models:
        raise CheckpointError(f"checkpoint {shown} has no model {key!r}; it has {sorted(models)}")
    try:
        model.load_state_dict(models[key])
    except RuntimeError as exc:  # torch's missing/unexpected keys and size mismatches, many lines
        raise CheckpointError(misfit_line(shown, key, models[key], model)) from exc
    return model.eval()


def misfit_line(shown: str, key: str, saved: dict[str, Any], model: torch.nn.Module) -> str:
    """One line: which checkpoint, what its model holds, and how ``model`` differs."""
    wanted = model.state_dict()
    shapes = {k: tuple(getattr(v, "shape", ())) for k, v in saved.items()}
    differ = [f"missing in the checkpoint: {k}" for k in wanted if k not in saved] + \
        [f"not in {type(model).__name__}: {k}" for k in saved if k not in wanted] + \
        [f"{k} {shapes[k]} vs {tuple(v.shape)}" for k, v in wanted.items() if k in saved and shapes[k] != tuple(v.shape)]
    held = ", ".join(f"{k} {v}" for k, v in list(shapes.items())[:4]) + (", ..." if len(shapes) > 4 else "")
    return (f"checkpoint {shown}: model {key!r} does not fit the {type(model).__name__} given "
            f"({'; '.join(differ[:4]) or 'load_state_dict refused it'}); the checkpoint holds {len(saved)} tensors: {held}")
