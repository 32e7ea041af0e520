"""Every private Ray name tunekit uses, in one place.

tunekit builds on Ray Tune's public API wherever it does the job. A few things
have no public API: writing a class trainable's checkpoint straight into its
final directory, a function trainable that Tune asks to save, and PBT's choice
of donor. The private names those need live here and nowhere else; the rest of
tunekit calls the functions below. ``tests/tunekit/test_ray_contract.py``
checks each name and the signature relied on, against the installed Ray, and
fails naming the one that changed. ``setup.cfg`` bounds Ray to the versions
that contract (and the suite) passed on.

Private names, by owner:

* ``ray.train._internal.checkpoint_manager._TrainingResult``: what
  ``Trainable.save`` returns and ``restore`` takes.
* ``ray.train._internal.session.get_session``: the function runner's session
  (``report``, ``loaded_checkpoint``).
* ``ray.tune.trainable.FunctionTrainable``: its ``setup``, ``step``,
  ``execute``, ``cleanup``, ``reset_config`` and ``_report_thread_runner_error``
  run a training function on a thread; tunekit's adapter reuses them.
* ``Trainable`` attributes: ``_last_result``, ``_storage``, ``_iteration``,
  ``_time_total``, ``_time_since_restore``, ``_iterations_since_restore``,
  ``_restored``, ``_last_training_result`` (function runner), and
  ``_report_class_trainable_checkpoint``.
* ``ray.train._internal.storage.StorageContext`` (``trainable._storage``,
  ``trial.storage``; built by :func:`storage_context` for tests and benchmarks):
  ``_update_checkpoint_index``, ``_check_validation_file``,
  ``_create_validation_file``, ``checkpoint_fs_path``, ``persist_artifacts``,
  ``sync_config``, ``storage_filesystem``.
* ``PopulationBasedTraining``: the hooks ``_checkpoint_or_exploit`` and
  ``_exploit`` and ``_trial_state[trial].last_train_time``.
* ``Trial.temporary_state.ray_actor`` (the trial's worker), ``_TrialInfo`` and the
  ``TRIAL_INFO``/``STDOUT_FILE``/``STDERR_FILE`` config keys ``Trainable.reset``
  takes (:func:`clone_in_place`).
* Loggers whose exact messages the quickstart filters (see
  :func:`quiet_ray_notices`).
* The ``colorama`` Ray vendors (``ray/thirdparty_files``): its ``init()``
  registers an exit hook that writes a colour reset to a terminal, after
  the command's last line (:func:`drop_color_reset_at_exit`).
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from typing import Any, Callable

from ray import tune
from ray.train._internal.checkpoint_manager import _TrainingResult
from ray.train._internal.session import get_session
from ray.tune.schedulers import PopulationBasedTraining
from ray.tune.trainable import FunctionTrainable
from typing_extensions import override

__all__ = [
    "FUNCTION_RUNNER_METHODS",
    "PBTWithDonorChoice",
    "RAY_NOTICES",
    "RAY_SYNC_FAILURE",
    "RAY_WARNINGS",
    "TrainingResult",
    "adopt_function_runner",
    "clear_last_reported",
    "clone_in_place",
    "drop_color_reset_at_exit",
    "function_runner_cleanup",
    "function_runner_reset",
    "give_session_checkpoint",
    "has_local_storage",
    "last_reported",
    "last_result",
    "local_trial_dir",
    "next_local_checkpoint",
    "pin_donor_checkpoint",
    "publish_local_checkpoint",
    "quiet_ray_notices",
    "quiet_tune_banner",
    "report_checkpoint_dir",
    "session_report",
    "set_iteration",
    "set_restored",
    "storage_context",
    "supports_clone",
    "trainable_storage",
    "trial_filesystem",
]

#: What ``Trainable.save`` returns and ``Trainable.restore`` accepts.
TrainingResult = _TrainingResult


# -- class and function trainables ---------------------------------------------
def last_result(trainable: tune.Trainable) -> dict[str, Any]:
    """A copy of the trainable's last reported result (empty before the first)."""
    return dict(trainable._last_result or {})


def storage_context(storage_path: str, experiment: str, trial: str, *, validate: bool = False) -> Any:
    """A trial's ``StorageContext``, to run a trainable outside Tune (tests, benchmarks).

    ``validate=True`` writes the marker Tune's driver writes before a trial saves.
    """
    from ray.train._internal.storage import StorageContext

    context = StorageContext(storage_path=storage_path, experiment_dir_name=experiment, trial_dir_name=trial)
    if validate:
        context._create_validation_file()
    return context


def trainable_storage(trainable: tune.Trainable) -> Any:
    """The trial's ``StorageContext`` inside its actor, or None outside Tune."""
    return getattr(trainable, "_storage", None)


def has_local_storage(trainable: tune.Trainable) -> bool:
    """Whether the trial's storage is the local filesystem (False outside Tune)."""
    import pyarrow.fs as pafs

    storage = trainable_storage(trainable)
    return storage is not None and type(storage.storage_filesystem) is pafs.LocalFileSystem


def local_trial_dir(trainable: tune.Trainable) -> str | None:
    """The trial's directory when its storage is local (None otherwise, or outside Tune)."""
    return trainable_storage(trainable).trial_fs_path if has_local_storage(trainable) else None


def next_local_checkpoint(trainable: tune.Trainable) -> tuple[str, dict[str, Any]] | None:
    """The next checkpoint's final directory when the trial's storage is local.

    Advances the trial's checkpoint index exactly as ``Trainable.save`` does.
    Returns ``(directory, metrics)``, or None when the trial has no storage or
    the storage is not the local filesystem.
    """
    if not has_local_storage(trainable):
        return None
    storage = trainable_storage(trainable)
    metrics = last_result(trainable)
    storage._update_checkpoint_index(metrics)
    storage._check_validation_file()
    return storage.checkpoint_fs_path, metrics


def publish_local_checkpoint(trainable: tune.Trainable, directory: str, metrics: dict[str, Any]) -> TrainingResult:
    """What ``Trainable.save`` returns for a checkpoint written at ``directory``."""
    storage = trainable_storage(trainable)
    storage.persist_artifacts(force=storage.sync_config.sync_artifacts_on_checkpoint)
    checkpoint = tune.Checkpoint(path=directory, filesystem=storage.storage_filesystem)
    return TrainingResult(checkpoint=checkpoint, metrics=metrics)


def report_checkpoint_dir(trainable: tune.Trainable, directory: str) -> TrainingResult:
    """Upload a checkpoint directory the way a class trainable's ``save`` does."""
    return trainable._report_class_trainable_checkpoint(directory, directory)


def last_reported(trainable: tune.Trainable) -> TrainingResult | None:
    """The function runner's last ``tune.report`` (metrics and checkpoint), if any."""
    return trainable._last_training_result


def clear_last_reported(trainable: tune.Trainable) -> None:
    """Forget the function runner's last report (a reset worker starts a new run)."""
    trainable._last_training_result = None


def set_restored(trainable: tune.Trainable, metrics: dict[str, Any]) -> None:
    """Set the trainable's counters as ``Trainable.restore`` does for ``metrics``."""
    trainable._iteration = metrics.get("training_iteration", 0)
    trainable._time_total = metrics.get("time_total_s", 0)
    trainable._time_since_restore = 0.0
    trainable._iterations_since_restore = 0
    trainable._restored = True


def set_iteration(trainable: tune.Trainable, iteration: int) -> None:
    """Set Ray's iteration counter (its next result reports ``iteration + 1``); Ray has no public setter."""
    trainable._iteration = iteration


def give_session_checkpoint(checkpoint: Any) -> None:
    """Hand ``checkpoint`` to the function runner's session (``tune.get_checkpoint``)."""
    get_session().loaded_checkpoint = checkpoint


def session_report(metrics: dict[str, Any]) -> None:
    """Report from the function runner's thread without a checkpoint."""
    get_session().report(metrics)


#: FunctionTrainable methods that run a training function on a thread.
FUNCTION_RUNNER_METHODS = ("setup", "step", "execute", "_report_thread_runner_error")


def adopt_function_runner(cls: type) -> type:
    """Give ``cls`` Ray's function-runner machinery without subclassing FunctionTrainable.

    Tune refuses ``checkpoint_frequency``/``checkpoint_at_end`` for subclasses
    of FunctionTrainable; a plain Trainable that runs the function the same
    way is asked to save like any class trainable.
    """
    for name in FUNCTION_RUNNER_METHODS:
        setattr(cls, name, getattr(FunctionTrainable, name))
    return cls


def function_runner_cleanup(trainable: tune.Trainable) -> None:
    FunctionTrainable.cleanup(trainable)


def function_runner_reset(trainable: tune.Trainable, new_config: dict[str, Any]) -> bool:
    return FunctionTrainable.reset_config(trainable, new_config)


# -- callbacks -------------------------------------------------------------------
def trial_filesystem(trial: Any) -> Any:
    """The ``pyarrow.fs.FileSystem`` a trial's :attr:`Trial.path` is on."""
    return trial.storage.storage_filesystem


# -- PBT -------------------------------------------------------------------------
class _NoPause:
    """The controller as Ray's ``_exploit`` sees it, with ``pause_trial`` doing nothing."""

    def __init__(self, controller: Any) -> None:
        self._controller = controller

    def pause_trial(self, trial: Any, should_checkpoint: bool = True) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._controller, name)


def supports_clone(trial: Any) -> bool:
    """Whether the trial's trainable can clone a donor in its own worker (tunekit trainables: ``tunekit_clone``)."""
    try:
        cls = trial.get_trainable_cls()
    except Exception:  # noqa: BLE001 - unknown or unregistered trainable: Ray's path
        return False
    return isinstance(cls, type) and callable(getattr(cls, "tunekit_clone", None))


def clone_in_place(trial: Any) -> None:
    """Have a RUNNING trial's own worker take the trial's (new) config and restore ``trial.latest_checkpoint_result``.

    What Tune does to resume a paused trial in a reused worker (``reset``
    with the trial's config, then ``restore``), as one call on the worker
    (``tunekit_clone``), sent before Tune's next task for the trial: a worker
    runs one caller's calls in order. Tune does not track the call, so only
    its own task in flight can fail if the worker dies (one failure, retried
    from the trial's checkpoint - the donor's - with the new config; two
    tracked tasks failing at once would end the trial in ERROR). A clone
    that fails makes the trial's next step raise its error.
    """
    import copy

    from ray.tune.experiment.trial import _TrialInfo
    from ray.tune.result import STDERR_FILE, STDOUT_FILE, TRIAL_INFO

    extra = copy.deepcopy(trial.config)
    extra[TRIAL_INFO] = _TrialInfo(trial)
    extra[STDOUT_FILE], extra[STDERR_FILE] = trial.log_to_file
    trial.temporary_state.ray_actor.tunekit_clone.remote(extra, trial.latest_checkpoint_result, trial.storage)


class PBTWithDonorChoice(PopulationBasedTraining):
    """Ray's PBT with public hooks for whom a trial may clone and how it is cloned.

    Ray decides "exploit or checkpoint" in the private ``_checkpoint_or_exploit``
    and clones in the private ``_exploit``; subclasses override
    :meth:`choose_quantiles` and :meth:`exploit_in_place` instead.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Trials exploited in place at the current result (the subclass answers NOOP for them).
        self.exploited_in_place: set = set()

    def choose_quantiles(self, trial: Any, upper: list, lower: list) -> tuple[list, list]:
        """The (upper, lower) quantiles Ray's exploit decision sees for ``trial``."""
        return upper, lower

    def exploit_in_place(self, trial: Any) -> bool:
        """Whether to clone the donor into ``trial`` in its running worker (default: Ray's pause)."""
        return False

    def last_scored_time(self, trial: Any) -> float:
        """The ``time_attr`` of the trial's last score PBT recorded."""
        return self._trial_state[trial].last_train_time

    @override
    def _checkpoint_or_exploit(self, trial: Any, tune_controller: Any, upper_quantile: list,
                               lower_quantile: list) -> None:
        upper, lower = self.choose_quantiles(trial, upper_quantile, lower_quantile)
        super()._checkpoint_or_exploit(trial, tune_controller, upper, lower)

    @override
    def _exploit(self, tune_controller: Any, trial: Any, trial_to_clone: Any) -> None:
        from ray.tune.experiment import Trial

        if trial.status != Trial.RUNNING or not supports_clone(trial) or not self.exploit_in_place(trial):
            super()._exploit(tune_controller, trial, trial_to_clone)
            if supports_clone(trial):
                pin_donor_checkpoint(trial)  # read when the paused trial resumes
            return
        # Ray's exploit (new config, tag, the donor's checkpoint as the trial's
        # latest), but the trial keeps its worker: reset + restore run there.
        super()._exploit(_NoPause(tune_controller), trial, trial_to_clone)
        pin_donor_checkpoint(trial)
        clone_in_place(trial)
        self.exploited_in_place.add(trial)


def pin_donor_checkpoint(trial: Any) -> None:
    """Make the donor checkpoint Ray's exploit gave ``trial`` a pinned copy, which ``num_to_keep`` never deletes.

    Between the scheduler's decision and the clone reading the checkpoint, the
    donor goes on training: its next checkpoint makes Ray delete the one
    chosen (``num_to_keep=1``). The trial is given the pin instead
    (:func:`tunekit._trial_dir.pin_checkpoint`); the restore that reads it
    removes it.
    """
    from tunekit._trial_dir import pin_checkpoint

    manager = trial.run_metadata.checkpoint_manager
    result = manager._latest_checkpoint_result
    checkpoint = getattr(result, "checkpoint", None)
    if checkpoint is None:
        return
    iteration = (result.metrics or {}).get("training_iteration")
    pinned = pin_checkpoint(checkpoint.filesystem, checkpoint.path, iteration if isinstance(iteration, int) else None)
    if pinned is not None:
        manager._latest_checkpoint_result = TrainingResult(
            checkpoint=tune.Checkpoint(pinned, filesystem=checkpoint.filesystem), metrics=result.metrics
        )


# -- output ----------------------------------------------------------------------
class _DropMessages(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


#: logger -> the exact message starts that :func:`quiet_ray_notices` drops, and why.
RAY_NOTICES: dict[str, tuple[str, ...]] = {
    # ray.init of a new local cluster turns token authentication on (the safe
    # default we keep) and says how to turn it off; nothing for the user to do.
    "ray._private.authentication.authentication_token_setup": (
        "Token authentication is enabled for this Ray cluster",
    ),
    # A forced experiment snapshot after num_to_keep checkpoints: the
    # quickstart's state is a few trials on the experiment's own storage, a
    # snapshot costs milliseconds, and it is what keeps the state consistent
    # with the checkpoints Ray deletes.
    "ray.tune.execution.experiment_state": (
        "Experiment state snapshotting has been triggered multiple times",
    ),
    # A trial resumed before the driver ever synced its result.json: Ray then
    # keeps appending to the driver's local copy, which holds every row.
    "ray.tune.logger.logger": ("Remote file not found:",),
}


#: (logger, message start) of Ray's report that an experiment sync failed. Tune
#: copies the driver's staging folder to storage in the background while the
#: next snapshot is written: a searcher state goes to a temporary file
#: (``.tmp_generator`` in Ray 2.51, ``.<uuid>-tmp-basic-variant-state-...``
#: later) that is renamed into place, and a copy that listed the temporary
#: file fails when it is gone. The next sync copies the renamed file, and the
#: sync at the end of ``fit()`` is waited for, so nothing is lost: only that
#: failure (a vanished temporary file) is dropped, never another one.
RAY_SYNC_FAILURE = ("ray.tune.execution.experiment_state", "Saving experiment state to storage at")
_VANISHED_TEMPORARY = re.compile(r"[/\\]\.[^/\\']*tmp[^/\\']*'")


class _DropVanishedTemporarySync(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(RAY_SYNC_FAILURE[1]):
            return True
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, FileNotFoundError) and _VANISHED_TEMPORARY.search(str(error)))


#: Python warnings Ray issues that :func:`quiet_ray_notices` drops: (category, message start).
RAY_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    # Ray (2.51-2.5x) announces that it will stop hiding GPUs from workers with
    # num_gpus=0. tunekit places a trial by ray.get_gpu_ids(), never by what
    # CUDA shows, so either behaviour gives the same device.
    (FutureWarning, "Tip: In future versions of Ray, Ray will no longer override accelerator"),
)


def quiet_ray_notices() -> Callable[[], None]:
    """Drop exactly the Ray log lines in :data:`RAY_NOTICES`, warnings in :data:`RAY_WARNINGS` and
    the transient sync failure of :data:`RAY_SYNC_FAILURE`.

    Returns the undo.
    """
    undo = []
    filters = [(name, _DropMessages(prefixes)) for name, prefixes in RAY_NOTICES.items()]
    filters.append((RAY_SYNC_FAILURE[0], _DropVanishedTemporarySync()))
    for name, flt in filters:
        log = logging.getLogger(name)
        log.addFilter(flt)
        undo.append((log, flt))
    saved_filters = list(warnings.filters)
    for category, message in RAY_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), category=category)

    def restore() -> None:
        for log, flt in undo:
            log.removeFilter(flt)
        warnings.filters[:] = saved_filters

    return restore


def quiet_tune_banner() -> Callable[[], None]:
    """Use Tune's classic reporter, which prints nothing at ``verbose=0``.

    Tune's default output prints an experiment banner and a TensorBoard path
    into Ray's temporary session directory even at ``verbose=0``.
    """
    previous = os.environ.get("RAY_AIR_NEW_OUTPUT")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"

    def restore() -> None:
        if previous is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = previous

    return restore


def drop_color_reset_at_exit() -> None:
    """Unregister the exit hook of Ray's vendored colorama, which prints ``ESC[0m`` after our last line."""
    import atexit
    import sys

    initialise = sys.modules.get("colorama.initialise")
    reset_all = getattr(initialise, "reset_all", None)
    if initialise is not None and "thirdparty_files" in str(getattr(initialise, "__file__", "")) and reset_all:
        atexit.unregister(reset_all)
