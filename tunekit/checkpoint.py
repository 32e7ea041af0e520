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
    Written last, as the commit mark: every other file's name, size and
    SHA-256. A directory without it is *incomplete*; one whose files differ
    from it is *corrupt*.

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

import hashlib
import json
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from tunekit.errors import CheckpointError

__all__ = [
    "MANIFEST_FILE",
    "METADATA_FILE",
    "STATE_FILE",
    "CheckpointReport",
    "is_tunekit_checkpoint",
    "load_model",
    "read_metadata",
    "read_state",
    "verify_checkpoint",
    "write_checkpoint",
]

STATE_FILE = "state.pt"
METADATA_FILE = "tunekit.json"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "tunekit-manifest/1"
_CHUNK = 8 * 1024 * 1024


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _json_safe(value: Any) -> Any:
    """Keep what JSON can hold; replace anything else with its repr."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return repr(value)


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(payload, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_checkpoint(
    directory: str | os.PathLike[str],
    state: dict[str, Any],
    *,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write ``state`` into ``directory`` as a tunekit checkpoint.

    The manifest is written last; a crash before it leaves an *incomplete*
    checkpoint that readers refuse, never a silently damaged one.

    Args:
        directory: Where to write (created if missing; other files in it are
            listed in the manifest too, so user files ride along verified).
        state: A state dict, usually :meth:`TrainingState.state_dict`.
        metadata: JSON-like metadata stored in ``tunekit.json``.

    Returns:
        The checkpoint directory.
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    manifest = path / MANIFEST_FILE
    if manifest.exists():
        manifest.unlink()  # an overwritten checkpoint is uncommitted until rewritten
    with open(path / STATE_FILE, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    meta = {
        "format": "tunekit-checkpoint/1",
        "torch": torch.__version__,
        **_json_safe(metadata or {}),
    }
    _write_json(path / METADATA_FILE, meta)
    files = {}
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = file.relative_to(path).as_posix()
        if rel == MANIFEST_FILE:
            continue
        files[rel] = {"size": file.stat().st_size, "sha256": _sha256(file)}
    _write_json(manifest, {"format": MANIFEST_FORMAT, "files": files})
    return path


@dataclass
class CheckpointReport:
    """Outcome of :func:`verify_checkpoint`."""

    path: str
    status: Literal["good", "incomplete", "corrupt"]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "good"


def verify_checkpoint(directory: str | os.PathLike[str]) -> CheckpointReport:
    """Check a checkpoint directory against its manifest (sizes and SHA-256)."""
    path = Path(directory)
    if not path.is_dir():
        return CheckpointReport(str(path), "incomplete", ["directory is missing"])
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.is_file():
        return CheckpointReport(str(path), "incomplete", [f"no {MANIFEST_FILE}"])
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
        if manifest.get("format") != MANIFEST_FORMAT or not isinstance(files, dict):
            raise ValueError("unknown manifest format")
    except (ValueError, KeyError, TypeError) as exc:
        return CheckpointReport(str(path), "corrupt", [f"{MANIFEST_FILE} unreadable: {exc}"])
    problems = []
    for rel, entry in sorted(files.items()):
        file = path / rel
        if not file.is_file():
            problems.append(f"{rel}: missing")
            continue
        size = file.stat().st_size
        if size != entry.get("size"):
            problems.append(f"{rel}: size {size}, manifest says {entry.get('size')}")
        elif _sha256(file) != entry.get("sha256"):
            problems.append(f"{rel}: SHA-256 differs from manifest")
    if STATE_FILE not in files and not problems:
        problems.append(f"{STATE_FILE}: not listed in manifest")
    return CheckpointReport(str(path), "corrupt" if problems else "good", problems)


def is_tunekit_checkpoint(directory: str | os.PathLike[str]) -> bool:
    """True if ``directory`` looks like a tunekit checkpoint (committed or not)."""
    path = Path(directory)
    return (path / STATE_FILE).is_file() or (path / METADATA_FILE).is_file()


def read_metadata(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``tunekit.json`` of a checkpoint (no verification, no unpickling)."""
    path = Path(directory) / METADATA_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{directory}: not a tunekit checkpoint (no {METADATA_FILE})") from None
    except ValueError as exc:
        raise CheckpointError(f"{path}: unreadable JSON ({exc})") from None


def read_state(
    directory: str | os.PathLike[str],
    *,
    map_location: str | torch.device = "cpu",
    verify: bool = True,
) -> dict[str, Any]:
    """Load ``state.pt`` of a checkpoint with ``torch.load(weights_only=True)``.

    Raises:
        CheckpointError: the directory is incomplete or corrupt (``verify``),
            or the file would need arbitrary unpickling to load.
    """
    path = Path(directory)
    if verify:
        report = verify_checkpoint(path)
        if not report.ok:
            raise CheckpointError(
                f"checkpoint {path} is {report.status}: {'; '.join(report.problems)}"
            )
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise CheckpointError(f"checkpoint {path}: no {STATE_FILE}")
    try:
        return torch.load(state_file, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"checkpoint {state_file} holds objects that need arbitrary unpickling, "
            f"which tunekit refuses ({first})"
        ) from None
    except (RuntimeError, EOFError, OSError) as exc:
        raise CheckpointError(f"checkpoint {state_file} cannot be read: {exc}") from None


def load_model(
    directory: str | os.PathLike[str],
    model: torch.nn.Module,
    *,
    name: str | None = None,
    map_location: str | torch.device = "cpu",
) -> torch.nn.Module:
    """Load a model's weights from a tunekit checkpoint, ready for inference.

    Args:
        directory: The checkpoint directory (verified before loading).
        model: A module of the same architecture; its weights are replaced.
        name: Which model of the state; defaults to the only/first one.
        map_location: Where to put the tensors while loading.

    Returns:
        ``model``, in eval mode.
    """
    state = read_state(directory, map_location=map_location)
    models = state.get("models") or {}
    if not models:
        raise CheckpointError(f"checkpoint {directory} holds no model")
    key = name if name is not None else next(iter(models))
    if key not in models:
        raise CheckpointError(
            f"checkpoint {directory} has no model {key!r}; it has {sorted(models)}"
        )
    model.load_state_dict(models[key])
    return model.eval()
