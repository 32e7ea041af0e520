"""Keep tunekit's JSON record of the experiment (``tunekit-experiment.json``) up to date.
"""

from __future__ import annotations

import logging
import posixpath
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow.fs as pafs
from ray import tune
from ray.tune.experiment import Trial
from typing_extensions import override

from tunekit import _env, _ray

from tunekit.experiment import record
from tunekit.experiment.snapshot import read_experiment
from tunekit.storage import resolve_storage

__all__ = ["ExperimentRecord", "TunekitCallback", "check_restored_index", "repair_final_checkpoints"]


class TunekitCallback(tune.Callback):
    """Base of tunekit's callbacks: each keeps the run's record (one of them writes it, see :mod:`tunekit.experiment.record`).

    A subclass that overrides ``setup``, ``on_step_end`` or ``on_experiment_end`` calls ``super()``.
    """

    def _recorded_kwargs(self) -> dict[str, Any] | None:
        """The keyword arguments that rebuild this callback (None: it cannot be rebuilt from the record)."""
        return None

    #: The run's trial scheduler (found at setup; None outside a run).
    _scheduler: Any = None

    @override
    def setup(self, **info: Any) -> None:
        _env.check_all()  # a bad TUNEKIT_* value stops the run before it starts, in one line
        self._record_info = {k: info.get(k) for k in ("stop", "num_samples", "total_num_samples")}
        self._scheduler = _ray.calling_scheduler()

    @override
    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        _keep_index(record.observe(self, trials, info=getattr(self, "_record_info", None)).target)

    @override
    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        _ray.synchronous_saves(trial, self._scheduler)  # under Ray's own PBT only
        check_restored_index(trial)

    @override
    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any],
                        **info: Any) -> None:
        # Tune ends the trial: its last save completes before its worker is let go (stopped, or cached and
        # handed to another trial; a death then is reported twice and errors that other trial). A pause:
        # tunekit's PBT scheduler says so itself; under Ray's own PBT every save does (``on_trial_start``).
        _ray.note_saves(trial, result)
        if result.get("done"):
            _ray.finish_next_save_in_place(trial)

    @override
    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        record.trial_finished(trials, trial)
        _ray.forget_tunekit_metrics(trial)  # (the driver's memory stays flat over thousands of trials)

    @override
    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        record.trial_finished(trials, trial)
        _ray.forget_tunekit_metrics(trial)

    @override
    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        repair_final_checkpoints(trials)
        _keep_index(record.finish(self, trials), final=True)


#: How often a run on remote storage brings the readers' index (:mod:`tunekit.experiment._index`) up to date.
INDEX_INTERVAL_S = 120.0
_INDEXER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunekit-index")
#: experiment path -> (its refresh in flight or done, when it started)
_INDEXING: dict[str, tuple[Future, float]] = {}


def _keep_index(target: tuple[pafs.FileSystem, str] | None, *, final: bool = False) -> None:
    """On remote storage, the readers' index of the run's experiment brought up to date on a helper thread, at
    most every :data:`INDEX_INTERVAL_S` while the run goes on and once at its end (waited for: Ray's last
    upload is done by then), so the first reader after a run reads the index and what changed since, not
    every file. Each refresh reads only the trials the listing shows changed. Not on a local disk, where the
    first reader after the run writes it: building it holds every trial's summary at once (a peak of 380 MiB
    at 10,000 trials), which the driver of a large sweep must not pay."""
    if target is None or isinstance(target[0], pafs.LocalFileSystem):
        return
    fs, path = target
    now = time.monotonic()
    last = _INDEXING.get(path)
    if not final and last is not None and (not last[0].done() or now - last[1] < INDEX_INTERVAL_S):
        return
    if last is not None:
        last[0].result()  # (one at a time; the end's after any in flight)
    _INDEXING[path] = (_INDEXER.submit(_refresh_index, fs, path), now)
    if final:
        _INDEXING.pop(path)[0].result()


def _refresh_index(fs: pafs.FileSystem, path: str) -> None:
    try:
        read_experiment(resolve_storage(path, filesystem=fs))
    except Exception as exc:  # (the index only saves readers requests: a failed refresh must not fail the run)
        logging.getLogger(__name__).debug("tunekit: the readers' index of %s was not refreshed: %s", path, exc)


#: Trials whose checkpoint index this driver compared with storage (once each: it only ever lags after a restart).
_INDEX_CHECKED: set[str] = set()


def check_restored_index(trial: Trial) -> None:
    """A trial started with checkpoints in Ray's index (a resumed driver's, or one PBT paused): the first time
    in this driver, those gone from storage leave the index (:func:`tunekit._ray.drop_vanished_checkpoints`),
    before Ray restores the trial or deletes one of them for ``num_to_keep``. A trial started afresh has none."""
    if trial.trial_id in _INDEX_CHECKED or not _ray.registered_checkpoints(trial):
        return
    _INDEX_CHECKED.add(trial.trial_id)
    gone = _ray.drop_vanished_checkpoints(trial)
    if gone:
        logging.getLogger(__name__).info(
            "tunekit: trial %s: Ray's experiment state named %d checkpoint(s) deleted after it was written (%s); "
            "left out of Ray's index", trial.trial_id, len(gone), ", ".join(posixpath.basename(p) for p in gone))


def repair_final_checkpoints(trials: list[Trial]) -> None:
    """A trial whose worker died in its last checkpoint's write after Tune had ended it (nothing retries it):
    Ray's ``Result.checkpoint`` names that checkpoint, announced and never written. It names the trial's
    newest complete checkpoint instead (:func:`tunekit.checkpoint._announced.newest_complete_instead`). Local storage."""
    from tunekit.checkpoint import read_metadata
    from tunekit.checkpoint._announced import is_announced_only, newest_complete_instead
    from tunekit.checkpoint._trial_dir import await_write

    for trial in trials:
        checkpoint = trial.checkpoint
        if checkpoint is None or type(checkpoint.filesystem) is not pafs.LocalFileSystem:
            continue
        if not is_announced_only(checkpoint.path):
            continue
        await_write(checkpoint.path)  # Tune stopped the workers; a live writer is not expected, but waited for
        if not is_announced_only(checkpoint.path):
            continue
        instead = newest_complete_instead(checkpoint.path)
        if instead is None:
            continue
        meta = read_metadata(instead)
        metrics = {**(meta.get("metrics") or {}), "training_iteration": meta.get("iteration")}
        _ray.replace_checkpoint(trial, checkpoint.path, tune.Checkpoint(instead, filesystem=checkpoint.filesystem),
                                metrics)
        logging.getLogger(__name__).warning(
            "tunekit: trial %s's last checkpoint %s was never written (its worker died after the trial ended); "
            "its newest complete checkpoint %s stands in", trial.trial_id, checkpoint.path, instead)


class ExperimentRecord(TunekitCallback):
    """Write ``tunekit-experiment.json``, tunekit's plain-JSON record of the run, beside Ray's files.

    ``tunekit resume`` continues the experiment from it and the trials'
    checkpoints when Ray's ``tuner.pkl`` or experiment state is torn. Every
    tunekit callback and :func:`tunekit.pbt_setup` keep the record already;
    add this one to a ``Tuner`` that uses neither::

        tune.RunConfig(callbacks=[ExperimentRecord()])
    """

    def _recorded_kwargs(self) -> dict[str, Any] | None:
        return {}
