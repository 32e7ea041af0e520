"""What each rank of a multi-worker trial writes and reads: the replicated state, its own part, its shard.

Implementation tier of :mod:`tunekit.multiworker` (layout: :mod:`tunekit.checkpoint._ranks`). Replicated state
(DDP: the model and optimizer every rank holds) is written once, by rank 0, as a tunekit checkpoint;
each rank writes its own RNG streams and data position under ``rank-<r>/``; sharded state (FSDP2
``fully_shard``, FSDP1, any DTensor state) goes through ``torch.distributed.checkpoint``: every rank
writes only its shard (``rank-<r>/__<r>_0.distcp``), nobody gathers the model. Each rank's manifest
covers its shard, so a checkpoint verifies only when every shard does.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from tunekit.checkpoint._ranks import RANKS_FILE, rank_dir, ranks_bytes
from tunekit.checkpoint._directory import read_state, write_checkpoint
from tunekit.errors import CheckpointError
from tunekit.trial.rng import capture_rng, restore_rng
from tunekit.trial.state import FORMAT, Counters, StateBuffers, TrainingState

__all__ = ["is_sharded", "load_parts", "shard_stager", "stage_parts", "write_parts"]

_RANK_KEYS = ("data", "rng")


def is_sharded(state: TrainingState) -> bool:
    """Whether any model holds sharded parameters (DTensor: FSDP2; or is an FSDP1 module)."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    return any(isinstance(m, FullyShardedDataParallel) or any(isinstance(p, DTensor) for p in m.parameters())
               for m in state.models.values())


def _model_of(state: TrainingState, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for model in state.models.values():
        if any(id(p) in params for p in model.parameters()):
            return model
    raise CheckpointError("tunekit.multiworker: an optimizer holds parameters of none of the state's models")


def _sharded_dict(state: TrainingState) -> dict[str, Any]:
    """The models' and optimizers' state as DCP state dicts (sharded tensors stay sharded)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {"models": {k: get_model_state_dict(m) for k, m in state.models.items()},
            "optimizers": {k: get_optimizer_state_dict(_model_of(state, o), o) for k, o in state.optimizers.items()}}


def _replicated_rest(state: TrainingState) -> dict[str, Any]:
    """What every rank holds alike besides models and optimizers (written by rank 0)."""
    from tunekit.trial.state import to_cpu

    return to_cpu({"format": FORMAT, "models": {}, "optimizers": {},
                   "schedulers": {k: s.state_dict() for k, s in state.schedulers.items()},
                   "scaler": state.scaler.state_dict() if state.scaler is not None else None,
                   "counters": dataclasses.asdict(state.counters), "extras": dict(state.extras)})


def shard_stager(kept: Any = None) -> Any:
    """DCP's stager for ``async_save``, kept from save to save: it copies the shard into CPU buffers it keeps
    (the default stager is made anew for each save, its buffers too: an allocation the size of the shard);
    pinned and non-blocking only where a GPU is. One write in flight at a time (the buffers are reused).

    ``kept``: the stager of the previous save, returned if this torch's stagers stage more than once, else a
    new one is. torch 2.11 closes a ``DefaultStager`` at the end of each stage (pytorch/pytorch#183413: the
    next ``async_save`` with it raised ``KeyError: <class 'type'>``, seen on a GPU). Which torch this is, a
    throwaway stager tells, once per process: the kept one is never staged to find out (that closed it)."""
    import torch

    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    except ImportError:  # a torch without DCP's DefaultStager: async_save stages by itself, each save anew
        return None
    if kept is not None and _stages_again(DefaultStager, StagingOptions):
        return kept
    gpu = torch.cuda.is_available()
    return DefaultStager(StagingOptions(use_pinned_memory=gpu, use_shared_memory=False, use_async_staging=False,
                                        use_non_blocking_copy=gpu))


#: Whether a DefaultStager stages again after a stage, per ``DefaultStager._stage`` (the answer of this torch).
_STAGES_AGAIN: dict[Any, bool] = {}


def _stages_again(stager_class: Any, options: Any) -> bool:
    key = getattr(stager_class, "_stage", stager_class)
    if key not in _STAGES_AGAIN:
        probe = stager_class(options(use_pinned_memory=False, use_shared_memory=False, use_async_staging=False,
                                     use_non_blocking_copy=False))
        try:
            probe.stage({"probe": 1})
            probe.stage({"probe": 1})
            _STAGES_AGAIN[key] = True
        except Exception:  # closed by its first stage
            _STAGES_AGAIN[key] = False
        finally:
            probe.close()
    return _STAGES_AGAIN[key]


def write_parts(state: TrainingState, directory: str, *, rank: int, world_size: int, sharded: bool,
                metadata: dict[str, Any]) -> None:
    """Write this rank's parts of a checkpoint of ``state`` into ``directory`` (this rank's local copy of
    the one checkpoint directory: Ray Train merges every rank's into one on storage)."""
    stage_parts(state, directory, rank=rank, world_size=world_size, sharded=sharded, metadata=metadata)()


def stage_parts(state: TrainingState, directory: str, *, rank: int, world_size: int, sharded: bool,
                metadata: dict[str, Any], buffers: StateBuffers | None = None,
                process_group: Any = None, stager: Any = None) -> Callable[[], None]:
    """Copy what this rank writes of a checkpoint of ``state`` (the blocking half of a save); the returned
    function writes it into ``directory`` (the other half: on another thread while training goes on).

    ``buffers``: reused CPU buffers for the copy (None: nothing copied, for a caller that writes at once);
    ``process_group``: a process group of
    its own for the sharded state's write (``torch.distributed.checkpoint.async_save``: staged now, written
    on DCP's thread; its collectives must not meet training's), else the shard is written now; ``stager``:
    DCP's ``async_stager`` (:func:`shard_stager`: reused CPU buffers).
    """
    rest = None
    if rank == 0:  # only rank 0 copies the replicated state
        if sharded:
            rest = _replicated_rest(state)
            rest = buffers.copy(rest) if buffers is not None else rest
        else:
            rest = {k: v for k, v in state.state_dict(into=buffers).items() if k not in _RANK_KEYS}
    mine = {"format": FORMAT, "data": copy.deepcopy(state.data.state_dict()) if state.data is not None else None,
            "rng": capture_rng()}
    shards = tempfile.mkdtemp(prefix="tunekit-shard-") if sharded else None
    pending = None
    if sharded:
        import torch.distributed.checkpoint as dcp

        writer = dcp.FileSystemWriter(shards)
        if process_group is None:
            dcp.save(_sharded_dict(state), storage_writer=writer)  # collective: every rank
        else:
            pending = dcp.async_save(_sharded_dict(state), storage_writer=writer, process_group=process_group,
                                     async_stager=stager)

    def write() -> None:
        own = os.path.join(directory, rank_dir(rank))
        try:
            os.makedirs(directory, exist_ok=True)
            if rank == 0:  # before rank-0/ exists: the replicated part's manifest lists only its own files
                if buffers is not None:
                    buffers.wait_copied()
                with open(os.path.join(directory, RANKS_FILE), "wb") as fh:
                    fh.write(ranks_bytes(world_size, sharded=sharded))
                write_checkpoint(directory, rest, durable=False,
                                 metadata={**metadata, "world_size": world_size, "sharded": sharded})
            if pending is not None:
                pending.result()
            if shards is not None:
                shutil.move(shards, own)  # the shard's files, then this rank's manifest covering them
            write_checkpoint(own, mine, metadata={**metadata, "rank": rank, "world_size": world_size}, durable=False)
        finally:
            if shards is not None and os.path.isdir(shards):
                shutil.rmtree(shards, ignore_errors=True)

    return write


@contextmanager
def _shard_view(directory: str, world: int) -> Iterator[str]:
    """One directory holding every rank's DCP files (symbolic links), as ``FileSystemReader`` reads them."""
    with tempfile.TemporaryDirectory(prefix="tunekit-shards-") as view:
        for rank in range(world):
            own = os.path.join(directory, rank_dir(rank))
            for name in os.listdir(own):
                if name.endswith(".distcp") or name == ".metadata":
                    os.symlink(os.path.join(own, name), os.path.join(view, name))
        yield view


def load_parts(state: TrainingState, directory: str, *, rank: int, world_size: int, written_by: int,
               sharded: bool) -> bool:
    """Load a verified checkpoint into ``state``; True when this rank's own part (RNG, data) was restored
    too (the same number of workers), False when only the resharded state was (sharded, another number)."""
    rest = read_state(directory, verify=False)
    same = written_by == world_size
    own = read_state(os.path.join(directory, rank_dir(rank)), verify=False) if same else None
    if not sharded:
        state.load_state_dict({**rest, **own})
        return True
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    template = _sharded_dict(state)
    with _shard_view(directory, written_by) as view:
        dcp.load(template, storage_reader=dcp.FileSystemReader(view))
    for name, model in state.models.items():
        set_model_state_dict(model, template["models"][name])
    for name, opt in state.optimizers.items():
        set_optimizer_state_dict(_model_of(state, opt), opt, template["optimizers"][name])
    for name, sched in state.schedulers.items():
        sched.load_state_dict(rest["schedulers"][name])
    if state.scaler is not None and rest["scaler"] is not None:
        state.scaler.load_state_dict(rest["scaler"])
    state.counters, state.extras = Counters(**rest["counters"]), dict(rest["extras"])
    if own is not None:
        if state.data is not None and own["data"] is not None:
            state.data.load_state_dict(own["data"])
        restore_rng(own["rng"])
    return own is not None
