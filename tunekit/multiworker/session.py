"""A Ray Train worker loop's checkpoint-complete session: restore bit-exactly, report with checkpoints.

Every rank of ``train_loop_per_worker`` builds its state, then creates a :class:`WorkerSession`: it
restores from the checkpoint Ray Train hands back (``ray.train.get_checkpoint()``), the newest one
whose every rank's part verifies (all ranks agree on it), and :meth:`WorkerSession.report` reports
metrics with or without a checkpoint in one call. Layout and parts: :mod:`tunekit.checkpoint._ranks`,
:mod:`tunekit.multiworker._parts`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import posixpath
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import pyarrow.fs as pafs

from tunekit.checkpoint._manifest import read_metadata, verify_directory
from tunekit.checkpoint._ranks import RANKS_FILE, read_ranks
from tunekit.errors import CheckpointError, ConfigError
from tunekit.trial.hparams import DEFAULT_MUTABLE, apply_hyperparameters, changed_hyperparameters
from tunekit._keys import SAVE_BLOCKED_KEY
from tunekit.multiworker._lockstep import (DECIDE_KEY, ENDED_KEY, GROUP_KEY, LOCKSTEP_KEYS, SAVED_FOR_KEY,
                                           START_KEYS)
from tunekit.multiworker._parts import is_sharded, load_parts, shard_stager, stage_parts, write_parts
from tunekit.trial.state import StateBuffers, TrainingState
from tunekit.storage._location import resolve_storage

__all__ = ["WorkerSession", "current_session", "with_end_handshake"]

logger = logging.getLogger(__name__)


class WorkerSession:
    """Owns one rank's training state in a Ray Train worker loop: restore, report, checkpoint.

    Example:
        .. code-block:: python

            def train_loop_per_worker(config):
                model = fully_shard(build_model())          # or ray.train.torch.prepare_model(...)
                opt = torch.optim.AdamW(model.parameters(), lr=config["lr"])
                state = TrainingState(models={"model": model}, optimizers={"opt": opt}, data=stream)
                session = WorkerSession(state, config=config)   # restored here when Train resumes
                while session.iteration < config["epochs"]:
                    loss = train_one_epoch(model, opt, stream)
                    session.report({"loss": loss}, checkpoint=session.iteration % 2 == 1)

    Args:
        state: This rank's training state (a DDP-wrapped model is unwrapped: its module is saved).
        config: The trial's config, recorded in the checkpoint.
        sharded: ``"auto"`` (default): sharded when a model holds DTensor parameters (FSDP2
            ``fully_shard``) or is an FSDP1 module; True/False to say so.
        name: Recorded in the checkpoint metadata (``module:qualname`` of the worker loop).
        resume_from: A multi-worker checkpoint (path, URI or ``ray.train.Checkpoint``) to start from when
            Train hands none back: Ray Train V2's replacement for ``resume_from_checkpoint`` (pass it in
            ``train_loop_config``); also how a run on another number of workers continues (resharded).
        background: A save blocks this rank only while it copies its part (the sharded state through
            ``torch.distributed.checkpoint.async_save`` on a gloo process group of its own); the write and
            Ray Train's upload go on on another thread, and the checkpoint is registered once every rank's
            part is on storage (``checkpoint_upload_mode=ASYNC``). At most one write is in flight: the next
            save waits for it. False: written and uploaded before ``report`` returns.
        mutable: Hyperparameters put in effect when the restored checkpoint was taken under another value
            (a PBT clone's mutated rate, or a resume with a changed config): ``lr`` (under the LR
            schedulers), ``momentum``, ``weight_decay``, ``batch_size`` (``state.data.batch_size``);
            others the loop reads from ``config`` itself.

    Raises:
        CheckpointError: no checkpoint Train handed back verifies on every rank, or a replicated
            (DDP) checkpoint was written by another number of workers.
    """

    def __init__(self, state: TrainingState, *, config: Mapping[str, Any] | None = None,
                 sharded: bool | Literal["auto"] = "auto", name: str | None = None,
                 resume_from: Any = None, background: bool = True,
                 mutable: tuple[str, ...] = DEFAULT_MUTABLE) -> None:
        import ray.train

        if not isinstance(state, TrainingState):
            raise ConfigError(f"WorkerSession(state={type(state).__name__}): expected a tunekit.TrainingState")
        if sharded not in (True, False, "auto"):
            raise ConfigError(f"WorkerSession(sharded={sharded!r}): expected True, False or 'auto'")
        if not isinstance(background, bool):
            raise ConfigError(f"WorkerSession(background={background!r}): expected True or False")
        state.models = {k: _unwrapped(m) for k, m in state.models.items()}
        config = dict(config or {})
        start, written_before = config.pop(START_KEYS[0], None), set(config.pop(START_KEYS[1], ()))
        #: Lockstep (train_trial's default): the trial's decisions actor and report queue, else None.
        self._decisions, self._queue = config.pop(LOCKSTEP_KEYS[0], None), config.pop(LOCKSTEP_KEYS[1], None)
        self._decide: str | None = None  # the key of the decision on the last report
        self.state, self.config, self.name, self.mutable = state, config, name or "worker_loop", tuple(mutable)
        try:
            context = ray.train.get_context()
            self.rank, self.world_size = context.get_world_rank(), context.get_world_size()
        except (DeprecationWarning, RuntimeError, AttributeError) as exc:
            raise ConfigError("WorkerSession(): not inside a Ray Train worker; create it in the "
                              "train_loop_per_worker of a TorchTrainer (tunekit.multiworker.train_trial runs one "
                              f"per Tune trial) ({type(exc).__name__}: {exc})") from None
        self.sharded = is_sharded(state) if sharded == "auto" else bool(sharded)
        #: The checkpoint this rank restored from (None: started fresh), and whether its own part came too.
        self.restored_from: str | None = None
        self.restored_own_part = False
        #: The iteration the restored checkpoint was taken at (None: started fresh).
        self.restored_iteration: int | None = None
        self.background, self._buffers, self._writing = background, StateBuffers(), None
        self._save_group = _save_group() if self.background and self.sharded else None
        self._stager = shard_stager() if self._save_group is not None else None
        from ray.util import get_current_placement_group

        group = get_current_placement_group()
        self._group = group.id.hex() if group is not None else None
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is not None and start and posixpath.basename(checkpoint.path) in written_before:
            checkpoint = None  # Train's newest from before Tune (re)started the trial: Tune's pointer says where
        checkpoint = checkpoint or _as_checkpoint(start or resume_from)
        if checkpoint is not None:
            self._restore(checkpoint)
        _CURRENT[0] = self

    @property
    def iteration(self) -> int:
        """Iterations reported so far, restored ones included."""
        return self.state.counters.iteration

    def report(self, metrics: dict[str, Any], *, checkpoint: bool = False) -> None:
        """Count one iteration and report ``metrics`` (every rank calls it, as ``ray.train.report``).

        Args:
            metrics: The iteration's metrics (rank 0's reach Tune).
            checkpoint: Write this rank's parts of a checkpoint of this iteration and report it. With
                ``train_trial(lockstep=True)`` (the default) every rank then waits for Tune's decision on the
                report, and writes a checkpoint of this iteration first if Tune asks for one.
        """
        self.state.counters.iteration += 1
        if self.rank == 0 and self._group is not None:
            metrics = {**metrics, GROUP_KEY: self._group}
        if self._decisions is not None:
            self._decide = f"{self._group or 'group'}:{self.iteration}"
            if self.rank == 0:
                metrics = {**metrics, DECIDE_KEY: self._decide}
        self._send(metrics, checkpoint)
        if self._decisions is not None:
            self._follow_decisions(self._decide)

    def _send(self, metrics: dict[str, Any], checkpoint: bool) -> None:
        import ray.train

        if not checkpoint:
            ray.train.report(metrics)
            return
        if self.background:
            self._report_in_background(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="tunekit-rank-") as directory:
            self.save(directory)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))

    def _follow_decisions(self, key: str) -> None:
        """Lockstep: wait for Tune's decisions on the report ``key`` names: each "save" a checkpoint of this
        iteration (rank 0's report of it names the decision it answers), until "go"."""
        import ray

        n = 0
        while ray.get(self._decisions.wait.remote(f"{key}:{n}")) == "save":
            self._send({SAVED_FOR_KEY: f"{key}:{n}"} if self.rank == 0 else {}, True)
            n += 1

    def end_of_loop(self) -> None:
        """Lockstep: the worker loop has returned; rank 0 tells the trial, and every rank waits for Tune's end of
        the trial: an at-end checkpoint of the last iteration if Tune asks for one, then the end."""
        if self._decisions is None or self._decide is None:
            return
        key = f"{self._decide}:end"
        if self.rank == 0:
            self._queue.put(({ENDED_KEY: key}, None, None, None))
        self._follow_decisions(key)
        self.wait_for_write()

    def _next_stager(self) -> Any:
        if self._stager is not None:
            self._stager = shard_stager(self._stager)  # the same one, unless this torch closed it
        return self._stager

    def _report_in_background(self, metrics: dict[str, Any]) -> None:
        import ray.train
        from ray.train import CheckpointUploadMode

        from tunekit import _ray

        began = time.perf_counter()
        self.wait_for_write()  # one write in flight, one copy of the state held
        directory = tempfile.mkdtemp(prefix="tunekit-rank-")
        write = stage_parts(self.state, directory, rank=self.rank, world_size=self.world_size, sharded=self.sharded,
                            metadata=self._metadata(), buffers=self._buffers, process_group=self._save_group,
                            stager=self._next_stager())
        blocked = time.perf_counter() - began
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def upload(checkpoint: Any, name: str) -> Any:  # on Ray Train's upload thread
            try:
                write()
                persisted = _ray.persist_train_checkpoint(checkpoint, name)
            except BaseException as exc:
                done.set_exception(exc)
                raise
            done.set_result(None)
            return persisted

        self._writing = done
        if self.rank == 0:
            metrics = {**metrics, SAVE_BLOCKED_KEY: blocked}
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory),
                         checkpoint_upload_mode=CheckpointUploadMode.ASYNC, checkpoint_upload_fn=upload,
                         delete_local_checkpoint_after_upload=True)

    def wait_for_write(self) -> None:
        """Wait until this rank's part of the last checkpoint is written and uploaded (raises its error)."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def _metadata(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "trainable": self.name, "config": self.config}

    def save(self, directory: str) -> None:
        """Write this rank's parts of a checkpoint of the current state into ``directory`` (collective)."""
        write_parts(self.state, directory, rank=self.rank, world_size=self.world_size, sharded=self.sharded,
                    metadata=self._metadata())

    def _restore(self, checkpoint: Any) -> None:
        """Restore from the newest checkpoint, from Train's own back to older ones, that verifies on every
        rank: each rank verifies the replicated part and its share of the ranks' parts, and all agree."""
        for path in _candidates(checkpoint.filesystem, checkpoint.path):
            with type(checkpoint)(path, filesystem=checkpoint.filesystem).as_directory() as directory:
                written_by, why = self._verified(directory)
                if not _all_agree(not why):
                    logger.warning("tunekit: rank %d: not restoring from %s: %s", self.rank, path,
                                   why or "another rank's part does not verify")
                    continue
                self._check_world(path, written_by)
                self.restored_own_part = load_parts(self.state, directory, rank=self.rank,
                                                    world_size=self.world_size, written_by=written_by,
                                                    sharded=self.sharded)
                saved = read_metadata(directory).get("config") or {}
            self.restored_from, self.restored_iteration = path, self.state.counters.iteration
            self._put_in_effect(saved)
            if not self.restored_own_part and self.rank == 0:
                logger.warning("tunekit: %s was written by %d workers, this run has %d: the sharded state was "
                               "resharded; each rank's RNG streams and data position start fresh (they cannot "
                               "be split or merged)", path, written_by, self.world_size)
            return
        raise CheckpointError(f"cannot restore: no checkpoint of {posixpath.dirname(checkpoint.path)} from "
                              f"{posixpath.basename(checkpoint.path)} back verifies on every rank")

    def _put_in_effect(self, saved: Mapping[str, Any]) -> None:
        """Apply the mutable hyperparameters whose value differs from the checkpoint's (``saved``)."""
        changed = changed_hyperparameters(saved, self.config, self.mutable)
        if not changed:
            return
        self.state.hparams = {**self.state.hparams, **{k: saved[k] for k in self.mutable if k in saved}}
        apply_hyperparameters(self.state, changed)  # keys it cannot apply: the loop reads them from config
        self.state.hparams.update(changed)
        if self.rank == 0:
            logger.info("tunekit: restored %s with %s in effect (the checkpoint had %s)", self.restored_from,
                        changed, {k: saved.get(k) for k in changed})

    def _verified(self, directory: str) -> tuple[int, str]:
        """``(the number of workers that wrote it, why this rank's share does not verify: "" if it does)``."""
        try:
            world = read_ranks(pafs.LocalFileSystem(), directory)["world_size"]
        except (ValueError, OSError) as exc:
            return 0, f"not a multi-worker tunekit checkpoint ({exc})"
        mine = [r for r in range(world) if r % self.world_size == self.rank]
        report = verify_directory(pafs.LocalFileSystem(), directory, directory, ranks=mine)
        return world, "" if report.ok else report.describe()

    def _check_world(self, path: str, written_by: int) -> None:
        if written_by != self.world_size and not self.sharded:
            raise CheckpointError(
                f"cannot restore {path}: written by {written_by} workers, this run has {self.world_size}; its "
                f"state is replicated with one data stream and RNG per rank, which cannot be split or merged: "
                f"resume with {written_by} workers (sharded state, FSDP, reshards)")


#: The session of this worker process (one per Train worker), for the end of its loop (lockstep).
_CURRENT: list[WorkerSession | None] = [None]


def current_session() -> WorkerSession | None:
    """This worker's :class:`WorkerSession`, taken (None when the loop made none)."""
    session, _CURRENT[0] = _CURRENT[0], None
    return session


def _save_group() -> Any:
    """A gloo process group of every rank for ``async_save``'s collectives (None without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.new_group(backend="gloo")


def _as_checkpoint(location: Any) -> Any:
    """``resume_from`` as a ``ray.train.Checkpoint`` (None stays None)."""
    import ray.train

    if location is None or isinstance(location, ray.train.Checkpoint):
        return location
    if not isinstance(location, (str, os.PathLike)):
        raise ConfigError(f"WorkerSession(resume_from={location!r}): expected a path, URI or ray.train.Checkpoint")
    where = resolve_storage(str(location))
    return ray.train.Checkpoint(where.path, filesystem=where.filesystem)


def _unwrapped(model: Any) -> Any:
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def _candidates(fs: pafs.FileSystem, path: str) -> list[str]:
    """``path``, then the older multi-worker checkpoints beside it, newest first (by iteration)."""
    parent, older = posixpath.dirname(path), []
    try:
        mine = int(read_metadata(resolve_storage(path, filesystem=fs)).get("iteration", 0))
        for info in fs.get_file_info(pafs.FileSelector(parent)):
            if info.path == path or info.type != pafs.FileType.Directory:
                continue
            if fs.get_file_info(posixpath.join(info.path, RANKS_FILE)).type == pafs.FileType.File:
                iteration = int(read_metadata(resolve_storage(info.path, filesystem=fs)).get("iteration", 0))
                if iteration <= mine:
                    older.append((iteration, info.path))
    except (CheckpointError, OSError, ValueError):
        pass  # the registered checkpoint alone; verification says what is wrong with it
    return [path] + [p for _, p in sorted(older, reverse=True)]


def _all_agree(ok: bool) -> bool:
    """True on every rank only if ``ok`` is True on every rank (an all-reduce when a process group runs)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return ok
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def with_end_handshake(loop: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """``loop`` for Train's workers; when it returns, this rank's session waits for Tune's end of the trial
    (an at-end save, then the end)."""

    def worker_loop(config: dict[str, Any]) -> None:
        loop(config)
        session = current_session()
        if session is not None:
            session.end_of_loop()

    worker_loop.__name__ = worker_loop.__qualname__ = getattr(loop, "__name__", "worker_loop")
    worker_loop.__module__ = getattr(loop, "__module__", __name__)
    return worker_loop
