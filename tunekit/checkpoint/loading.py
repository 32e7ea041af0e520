"""Whole states and models out of tunekit checkpoints, single- or multi-worker, on one process, without Ray.

:func:`load_model` puts a checkpoint's weights into a module for inference (``tunekit.load_model``);
:func:`read_full_state` returns a checkpoint's whole state, a multi-worker one's with every rank's shard
gathered (:mod:`tunekit.multiworker`); :func:`export_dcp` writes a multi-worker checkpoint's shards as one
plain ``torch.distributed.checkpoint`` directory. Built on :mod:`tunekit.checkpoint._directory` (one directory's
format, verification and ``state.pt``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from tunekit.checkpoint._manifest import CheckpointLocation, locate, read_metadata, verify_directory
from tunekit.checkpoint._directory import local_checkpoint, read_state
from tunekit.errors import CheckpointError

if TYPE_CHECKING:
    import torch

__all__ = ["export_dcp", "load_model", "misfit_line", "read_full_state"]


def _pointed_at(location: CheckpointLocation) -> Any:
    """The Train checkpoint a multi-worker trial's Tune checkpoint (a pointer) stands for, else ``location``."""
    from tunekit.checkpoint._layout import POINTER_KEY, pointer_target
    from tunekit.storage._location import resolve_storage

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
    from tunekit.checkpoint._ranks import read_ranks

    try:
        layout = read_ranks(pafs.LocalFileSystem(), local)
    except ValueError:
        return None
    return int(layout["world_size"]) if layout.get("sharded") else None


def _link_shards(local: str, world: int, directory: str | os.PathLike[str]) -> None:
    from tunekit.checkpoint._ranks import rank_dir

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
            :class:`~tunekit.storage._location.Storage` or ``ray.tune.Checkpoint``.
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
