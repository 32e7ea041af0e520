"""A Tune trial that runs a Ray Train worker group: Train inside Tune, as Ray 2.51+ documents it.

:func:`train_trial` wraps a ``train_loop_per_worker`` into a Tune trainable. Each trial runs
one ``TorchTrainer`` (Ray Train V2, the default since Ray 2.51) named after the trial and stored in the
trial's own directory (``EXP/<trial>/train/``), so a retried or resumed trial's workers find its
checkpoints again (``ray.train.get_checkpoint()``).

Rank 0's reports reach Tune as Ray's ``TuneReportCallback`` carries them, and a checkpoint is reported to
Tune too: as a *pointer*, a tiny tunekit checkpoint in the trial's directory that names the Train
checkpoint (no rank's part is copied). Tune's view is then whole: ``Result.checkpoint``, a PBT exploit
(the clone's workers restore the donor's Train checkpoint, every rank its part, resharded if need be, and
the mutated hyperparameters are put in effect by :class:`~tunekit.multiworker.WorkerSession`), a paused
or resumed trial. Tune decides checkpoints as for single-worker trials (frequency, at end, callbacks,
schedulers): the workers wait for its decision on each report (:mod:`tunekit.multiworker._lockstep`).
"""

from __future__ import annotations

import functools
import logging
import os
import posixpath
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from ray.train import UserCallback

from tunekit.errors import CheckpointError, ConfigError
from tunekit.checkpoint._layout import POINTER_KEY
from tunekit import _ray
from tunekit.multiworker._lockstep import (DECIDE_KEY, ENDED_KEY, GROUP_KEY, LOCKSTEP_KEYS, SAVED_FOR_KEY, START_KEYS,
                                           TrainRun, decisions_actor, lockstep_trainable, own_run, release_run,
                                           run_of_trial)
from tunekit.multiworker._pointer import checkpoint_names, drop_cut_short, write_pointer
from tunekit.multiworker.session import with_end_handshake
from tunekit.trial.kind import TrainableKind

__all__ = ["GROUP_KEY", "POINTER_KEY", "START_KEYS", "train_checkpoint_of", "train_trial", "write_pointer"]

logger = logging.getLogger(__name__)



def train_trial(train_loop_per_worker: Callable[[dict[str, Any]], None], *, workers: int = 2,
                cpus_per_worker: float = 1.0, use_gpu: bool = False, max_failures: int = 1,
                backend: str | None = None, storage_path: str | None = None, lockstep: bool = True) -> Any:
    """A Tune trainable that trains each trial with ``workers`` Ray Train workers.

    Example:
        .. code-block:: python

            trainable = tune.with_resources(train_trial(train_loop_per_worker, workers=2), {"cpu": 0.1})
            tune.Tuner(trainable, param_space={"lr": tune.grid_search([0.01, 0.1])}).fit()

    Args:
        train_loop_per_worker: Every rank runs it with the trial's config (use
            :class:`tunekit.multiworker.WorkerSession` in it).
        workers: Train workers per trial (the trial's config key ``"workers"`` overrides it).
        cpus_per_worker: CPUs each worker holds (give the Tune trial itself a small share:
            ``tune.with_resources(..., {"cpu": 0.1})``; it only drives its workers).
        use_gpu: One GPU per worker; the backend defaults to NCCL then, else gloo.
        max_failures: Restarts of a trial's worker group after a worker dies, from its newest checkpoint.
        backend: ``torch.distributed`` backend (default: ``nccl`` with GPUs, else ``gloo``).
        storage_path: Where Train writes the trial's checkpoints (default: the trial's directory on the
            experiment's storage, local, S3 or any pyarrow filesystem).
        lockstep: After each report the workers wait for Tune's decision on it, so that a checkpoint Tune
            asks for (``CheckpointConfig(checkpoint_frequency=..., checkpoint_at_end=...)``, a callback's
            ``should_checkpoint``, a scheduler's save) is one of that very iteration, written by every rank as
            the loop's own are; the price is one round trip through Tune's driver per report. False: the
            workers run ahead by up to one report, only the checkpoints the loop asks for are taken, and Tune
            refuses ``checkpoint_frequency``/``checkpoint_at_end`` (a function trainable).
    """
    if not callable(train_loop_per_worker):
        raise ConfigError(f"train_trial({train_loop_per_worker!r}): expected the worker loop, a function")
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"train_trial(workers={workers!r}): must be an integer >= 1")
    if max_failures < -1:
        raise ConfigError(f"train_trial(max_failures={max_failures!r}): must be >= 0, or -1 for no limit")
    if not isinstance(lockstep, bool):
        raise ConfigError(f"train_trial(lockstep={lockstep!r}): expected True or False")
    _check_placeable("train_trial", workers, cpus_per_worker, use_gpu)
    name = getattr(train_loop_per_worker, "__name__", "train_trial")

    def trial(config: dict[str, Any]) -> None:
        from ray import tune
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer
        from ray.util.queue import Queue

        run = run_of_trial(tune.get_context().get_trial_id())  # (its trainable's own)
        group = config.get("workers", workers)
        if group != workers:  # (the config's own: refused before Train waits for what it can never place)
            if isinstance(group, bool) or not isinstance(group, int) or group < 1:
                raise ConfigError(f"train_trial: the trial's config says workers={group!r}; expected an integer >= 1")
            _check_placeable("train_trial (the trial's config)", group, cpus_per_worker, use_gpu)
        filesystem, trial_path = _ray.session_trial_storage()
        run_name, run_storage, run_fs = "train", trial_path, filesystem
        if storage_path:
            run_name, run_storage, run_fs = f"train-{tune.get_context().get_trial_id()}", storage_path, None
        _set_aside_stale_snapshot(run_fs, posixpath.join(run_storage, run_name))
        loop_config = dict(config)
        start = train_checkpoint_of(tune.get_checkpoint())
        if start is not None:  # the state Tune resumes the trial at (or a PBT donor's), not what Train has newest
            loop_config[START_KEYS[0]] = start
            loop_config[START_KEYS[1]] = checkpoint_names(run_fs, posixpath.join(run_storage, run_name))
        queue = Queue(maxsize=1, actor_options={"num_cpus": 0})
        worker_loop = train_loop_per_worker
        if lockstep:
            loop_config[LOCKSTEP_KEYS[0]] = decisions_actor()
            loop_config[LOCKSTEP_KEYS[1]] = queue
            worker_loop = with_end_handshake(train_loop_per_worker)
            # reports reach the trial at Train's controller polls (every 2 s by default): each one waits for
            # Tune's decision, so the controller (which Train hands this variable) polls every 0.1 s
            os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
        trainer = TorchTrainer(
            worker_loop,
            train_loop_config=loop_config,
            scaling_config=ScalingConfig(num_workers=int(config.get("workers", workers)), use_gpu=use_gpu,
                                         resources_per_worker={"CPU": float(cpus_per_worker)}),
            torch_config=TorchConfig(backend=backend or ("nccl" if use_gpu else "gloo")),
            run_config=RunConfig(name=run_name, storage_path=run_storage, storage_filesystem=run_fs,
                                 failure_config=FailureConfig(max_failures=max_failures),
                                 callbacks=[_Reporter(queue)]),
        )
        pointer = functools.partial(write_pointer, name=name, config=dict(config), filesystem=run_fs,
                                    trial_path=trial_path)
        _drive(trainer, run, queue, loop_config.get(LOCKSTEP_KEYS[0]), pointer, name, run_fs)

    trial.__name__ = trial.__qualname__ = name
    trial.__module__ = getattr(train_loop_per_worker, "__module__", __name__)
    trial.tunekit_trainable = TrainableKind(multiworker=True)  # type: ignore[attr-defined]  # (tunekit check says it cannot check it)
    if not lockstep:
        return _ray.with_function_mixin(trial, _OwnsTrainRun)
    return lockstep_trainable(trial, name, _OwnsTrainRun,
                              {"workers": workers, "cpus_per_worker": cpus_per_worker, "use_gpu": use_gpu})


def _check_placeable(call: str, workers: int, cpus_per_worker: float, use_gpu: bool) -> None:
    """Refuse, in one line, a worker group the running Ray cluster can never place (Ray Train would wait for it
    forever, warning about timeouts). Nothing is checked before Ray runs: the trial checks again."""
    import ray

    if not ray.is_initialized():
        return
    total = ray.cluster_resources()
    cpus, gpus = workers * float(cpus_per_worker), workers if use_gpu else 0
    if cpus > total.get("CPU", 0) + 1e-9 or gpus > total.get("GPU", 0):
        have = f"{total.get('CPU', 0):g} CPUs" + (f" and {total.get('GPU', 0):g} GPUs" if use_gpu else "")
        need = f"{cpus:g} CPUs" + (f" and {gpus} GPUs" if use_gpu else "")
        raise ConfigError(f"{call}(workers={workers}): {workers} workers need {need} at once; the Ray cluster has "
                          f"{have} in all, so they could never start (use fewer workers, or a smaller "
                          "cpus_per_worker)")


def train_checkpoint_of(checkpoint: Any) -> str | None:
    """The Train checkpoint a multi-worker trial's Tune checkpoint points at (None: not a pointer).

    ``checkpoint``: a ``ray.tune.Checkpoint`` (``Result.checkpoint``) or a local path.
    """
    from tunekit.checkpoint._manifest import read_metadata
    from tunekit.storage._location import resolve_storage

    if checkpoint is None:
        return None
    from tunekit.checkpoint._layout import pointer_target

    where = resolve_storage(checkpoint, filesystem=None) if isinstance(checkpoint, str) else \
        resolve_storage(checkpoint.path, filesystem=checkpoint.filesystem)
    try:
        value = read_metadata(where).get(POINTER_KEY)
    except CheckpointError:
        return None
    return pointer_target(where.filesystem, where.path, value) if isinstance(value, str) else None


def _set_aside_stale_snapshot(filesystem: Any, run_dir: str) -> None:
    """Train refuses to start its run again when a checkpoint its snapshot names was deleted (KeepCheckpoints,
    ``tunekit gc``): the snapshot is set aside, and the workers restore from the checkpoint Tune hands over."""
    from tunekit.storage._location import resolve_storage

    where = resolve_storage(run_dir, filesystem=filesystem)
    gone = _ray.set_aside_stale_train_snapshot(where.filesystem, where.path)
    if gone:
        logger.info("tunekit: %s: Ray Train's run snapshot names %d deleted checkpoint(s) (%s): set aside, so "
                    "that the run starts again from the checkpoint Tune restores", run_dir, len(gone), gone[0])


class _Reporter(UserCallback):
    """A Ray Train callback (run by the Train controller): rank 0's metrics, and the path of the
    checkpoint reported with them, to the Tune trial through a queue (as Ray's ``TuneReportCallback``
    does, which reports no checkpoint to Tune)."""

    def __init__(self, queue: Any) -> None:
        self.queue, self._told = queue, False

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        import ray

        first = dict(metrics[0])
        group = first.pop(GROUP_KEY, None)
        controller = None if self._told else ray.get_runtime_context().current_actor
        self._told = True
        self.queue.put((first, checkpoint.path if checkpoint else None, group, controller))


class _OwnsTrainRun:
    """Mixed into Tune's class for a :func:`train_trial` trainable: each instance owns its trial's
    :class:`~tunekit.multiworker._lockstep.TrainRun`, which the trial's function finds by its trial id, and
    stops the run when Tune stops the trial while it is live (a PBT pause or exploit, a stop condition, an
    actor reused for another trial): the stopped trial's CPUs would otherwise stay held for good."""

    #: What KeepCheckpoints and ``tunekit check`` tell a multi-worker trial's class by.
    tunekit_trainable = TrainableKind(multiworker=True)

    def setup(self, config: dict[str, Any]) -> None:
        super().setup(config)  # type: ignore[misc]
        own_run(self)

    def cleanup(self) -> None:
        release_run(self)
        super().cleanup()  # type: ignore[misc]

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        release_run(self)
        reset = super().reset_config(new_config)  # type: ignore[misc]
        own_run(self)
        return reset


def _drive(trainer: Any, run: TrainRun, queue: Any, decisions: Any, pointer: Callable[[str, str], Any],
           name: str, filesystem: Any) -> None:
    """Run ``trainer`` on a thread; report what it reports to Tune (with a pointer checkpoint, written by
    ``pointer(directory, train_checkpoint)``); its error. ``decisions``: the actor through which its workers
    wait for Tune's decisions (lockstep), else None. ``filesystem``: the Train run's storage's."""
    from ray import tune

    outcome: dict[str, BaseException] = {}

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as exc:  # noqa: BLE001 - raised again in the trial's thread
            outcome["error"] = exc
        finally:
            queue.put(None)

    thread = threading.Thread(target=fit, name="tunekit-train-run", daemon=True)
    run.begin(thread, queue, decisions, pointer)
    checked: set[str] = set()  # Train checkpoints looked at for a cut-short write (each once a run)
    thread.start()
    while (report := run.take()) is not None:
        metrics, path = report
        if ENDED_KEY in metrics:  # the loop has ended; its ranks wait for an at-end save or the end (lockstep):
            run.pending, run.ended = [metrics[ENDED_KEY], 0], True  # the trial ends, its run ends with it
            return
        if SAVED_FOR_KEY in metrics:  # (a save Tune asked for, whose asker gave up on it: not a result)
            continue
        key = metrics.pop(DECIDE_KEY, None)
        run.pending = [key, 0] if key is not None else None
        if key is None and decisions is not None and not run.warned:
            run.warned = True
            logger.warning("tunekit: %s's workers do not wait for Tune's decisions (a report without a "
                           "WorkerSession, or one made without config=config): checkpoints Tune asks for "
                           "(frequency, at end, callbacks, schedulers) cannot be taken", name)
        if path is None:
            tune.report(metrics)
        else:
            metrics["checkpoint_path"] = path  # as Ray's TuneReportCallback reports it
            with tempfile.TemporaryDirectory(prefix="tunekit-pointer-") as directory:
                pointer(directory, path)
                _ray.report_with_checkpoint(metrics, directory)  # (into an index no earlier worker used)
            drop_cut_short(filesystem, path, checked)
        run.decide("go")  # Tune has moved on (it saved first if it wanted to): so do the workers
    thread.join()
    run.controller, run.groups = None, set()  # the run ended: Train removed its placement groups
    if "error" in outcome and not run.stopped:  # (a run Tune stopped ends with its controller's death)
        raise outcome["error"]
