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
  ``trial.storage``; built by :func:`storage_context` for tests and benchmarks,
  and by :func:`offline_storage`, which overrides ``_get_session_path``, for ``tunekit check``):
  ``_update_checkpoint_index``, ``current_checkpoint_index``, ``_check_validation_file``,
  ``_create_validation_file``, ``checkpoint_fs_path``, ``persist_artifacts``,
  ``sync_config``, ``storage_filesystem``, ``_make_checkpoint_dir_name`` (where a remote upload goes next),
  ``persist_current_checkpoint`` (a function trial's ``tune.report`` calls it on the instance; wrapped there
  for one report so that a remote upload's manifest goes last).
* ``PopulationBasedTraining``: the hooks ``_checkpoint_or_exploit`` and
  ``_exploit`` and ``_trial_state[trial].last_train_time``.
* ``Trial.temporary_state.ray_actor`` (the trial's worker), ``_TrialInfo`` and the
  ``TRIAL_INFO``/``STDOUT_FILE``/``STDERR_FILE`` config keys ``Trainable.reset``
  takes (:func:`clone_in_place`).
* ``Trial.run_metadata.checkpoint_manager.checkpoint_config`` (the
  trial's ``CheckpointConfig``, for tunekit's experiment record).
* ``Trial.run_metadata.metric_analysis`` and ``metric_n_steps``: Ray's
  statistics of every numeric result key, kept per trial for the whole
  run; tunekit's own keys leave them when a trial ends
  (:func:`forget_tunekit_metrics`).
* The checkpoint manager's ``_checkpoint_results`` and
  ``_latest_checkpoint_result``, PBT's ``_trial_state[trial].last_checkpoint``
  and the ``TuneController``'s ``_scheduler_alg``: what the retention policy
  reads and trims, what a resumed driver drops from the index when storage
  no longer has it, and Ray Train V2's run snapshot, set aside when it names a
  deleted checkpoint (:mod:`tunekit._ray.retention`).
* Loggers whose exact messages the quickstart filters (see
  :func:`quiet_ray_notices`).
* Ray's process titles (``ray::<Class>``) and the raylet's ``--gcs-address`` flag: which
  processes of this machine are the workers of the Ray this process is connected to
  (:func:`actor_workers`, for the failure injector's random kills).
* The ``colorama`` Ray vendors (``ray/thirdparty_files``): its ``init()``
  registers an exit hook that writes a colour reset to a terminal, after
  the command's last line (:func:`drop_color_reset_at_exit`).

This package's ``__init__`` holds the trainable, session and storage names;
:mod:`tunekit._ray.pbt` the PBT hooks, :mod:`tunekit._ray.output` the output
filters, :mod:`tunekit._ray.upload` a checkpoint's way to the trial's storage, :mod:`tunekit._ray.processes`
the workers' processes. Everything is re-exported here: tunekit calls ``_ray.<name>``.
"""

from __future__ import annotations

from typing import Any, Callable

from ray import tune
from ray.train._internal.checkpoint_manager import _TrainingResult
from ray.train._internal.session import get_session
from ray.tune.trainable import FunctionTrainable

from tunekit._ray.output import (
    RAY_NOTICES, RAY_SYNC_FAILURE, RAY_WARNINGS, drop_color_reset_at_exit, quiet_ray_notices, quiet_tune_banner
)
from tunekit._ray.pbt import (
    PBTWithDonorChoice, clone_in_place, finish_next_save_in_place, note_saves, pin_donor_checkpoint, supports_clone,
    synchronous_saves
)
from tunekit._ray.processes import actor_workers
from tunekit._ray.upload import report_checkpoint_dir, report_with_checkpoint, session_storage
from tunekit._ray.retention import (
    calling_scheduler, drop_vanished_checkpoints, forget_checkpoints, registered_checkpoints, replace_checkpoint,
    scheduler_checkpoints, set_aside_stale_train_snapshot
)

__all__ = [
    "FUNCTION_RUNNER_METHODS", "PBTWithDonorChoice", "RAY_NOTICES", "RAY_SYNC_FAILURE",
    "RAY_WARNINGS", "TrainingResult", "actor_workers", "adopt_function_runner", "adopt_result", "calling_scheduler",
    "clear_last_reported", "clone_in_place", "drop_color_reset_at_exit", "drop_vanished_checkpoints",
    "finish_next_save_in_place", "forget_checkpoints", "forget_tunekit_metrics",
    "function_runner_cleanup", "function_runner_reset", "give_session_checkpoint", "has_local_storage",
    "last_reported", "last_result", "local_trial_dir", "next_local_checkpoint", "note_saves", "offline_storage",
    "persist_train_checkpoint", "pin_donor_checkpoint", "publish_local_checkpoint", "quiet_ray_notices",
    "quiet_tune_banner", "registered_checkpoints", "remove_placement_group", "replace_checkpoint",
    "report_checkpoint_dir", "report_with_checkpoint", "scheduler_checkpoints", "session_report",
    "session_storage", "session_trial_storage", "set_aside_stale_train_snapshot", "set_iteration",
    "set_restored", "storage_context", "supports_clone", "synchronous_saves", "trainable_storage",
    "trial_filesystem", "with_function_mixin"
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


def offline_storage(storage_path: str, trial: str) -> Any:
    """A trial's ``StorageContext`` on local disk that needs no running Ray (``tunekit check`` runs trainables
    in plain processes): Ray's asks the Ray session for its working directory; this one keeps it under
    ``storage_path``."""
    import os

    from ray.train._internal.storage import StorageContext

    class _Offline(StorageContext):
        def _get_session_path(self) -> str:
            return os.path.join(self.storage_fs_path, ".session")

    context = _Offline(storage_path=storage_path, experiment_dir_name="check", trial_dir_name=trial)
    context._create_validation_file()
    return context


def trainable_storage(trainable: tune.Trainable) -> Any:
    """The trial's ``StorageContext`` inside its actor, or None outside Tune."""
    return getattr(trainable, "_storage", None)


def session_trial_storage() -> tuple[Any, str]:
    """Inside a Tune trial: ``(pyarrow filesystem, trial directory on it)`` of the trial's storage."""
    storage = session_storage()
    return storage.storage_filesystem, storage.trial_fs_path


def has_local_storage(trainable: tune.Trainable) -> bool:
    """Whether the trial's storage is the local filesystem (False outside Tune)."""
    import pyarrow.fs as pafs

    storage = trainable_storage(trainable)
    return storage is not None and type(storage.storage_filesystem) is pafs.LocalFileSystem


def local_trial_dir(trainable: tune.Trainable) -> str | None:
    """The trial's directory when its storage is local (None otherwise, or outside Tune)."""
    return trainable_storage(trainable).trial_fs_path if has_local_storage(trainable) else None


def next_local_checkpoint(
    trainable: tune.Trainable, choose_index: Callable[[str, int], int] | None = None
) -> tuple[str, dict[str, Any]] | None:
    """The next checkpoint's final directory when the trial's storage is local.

    Advances the trial's checkpoint index exactly as ``Trainable.save`` does;
    ``choose_index(trial_dir, index)`` may then raise it (to an index never
    used in the trial's directory), and Ray's counter follows.
    Returns ``(directory, metrics)``, or None when the trial has no storage or
    the storage is not the local filesystem.
    """
    if not has_local_storage(trainable):
        return None
    storage = trainable_storage(trainable)
    metrics = last_result(trainable)
    storage._update_checkpoint_index(metrics)
    if choose_index is not None:
        storage.current_checkpoint_index = choose_index(storage.trial_fs_path, storage.current_checkpoint_index)
    storage._check_validation_file()
    return storage.checkpoint_fs_path, metrics


def publish_local_checkpoint(trainable: tune.Trainable, directory: str, metrics: dict[str, Any]) -> TrainingResult:
    """What ``Trainable.save`` returns for a checkpoint written at ``directory``."""
    storage = trainable_storage(trainable)
    storage.persist_artifacts(force=storage.sync_config.sync_artifacts_on_checkpoint)
    checkpoint = tune.Checkpoint(path=directory, filesystem=storage.storage_filesystem)
    return TrainingResult(checkpoint=checkpoint, metrics=metrics)


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


#: Keys of a result that name the worker and trial that reported it, not the state it was reported for.
_OWN_RESULT_KEYS = ("trial_id", "pid", "hostname", "node_ip", "date", "timestamp")


def adopt_result(trainable: tune.Trainable, metrics: dict[str, Any]) -> None:
    """Make ``metrics`` (a PBT donor's, at the state just restored) the trainable's last result.

    ``Trainable.save`` registers a checkpoint under the worker's last result
    (``_last_result``), which a restore leaves as it was: a save right after an
    in-place clone would hold the donor's state under the clone's old
    iteration and score. The trial's own identity keys stay; the iteration is
    Ray's counter, as the restore set it.
    """
    previous = trainable._last_result or {}
    adopted = {**metrics, **{k: previous[k] for k in _OWN_RESULT_KEYS if k in previous}}
    adopted["training_iteration"] = trainable._iteration
    adopted["config"] = trainable.config
    trainable._last_result = adopted


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


def trial_checkpoint_config(trial: Any) -> Any:
    """The ``tune.CheckpointConfig`` a trial runs under (Ray keeps it in the trial's checkpoint manager)."""
    return trial.run_metadata.checkpoint_manager.checkpoint_config


def forget_tunekit_metrics(trial: Any) -> None:
    """Drop tunekit's bookkeeping keys (``tunekit/...``: save costs, the chosen interval) from Ray's statistics of
    an ended ``trial``'s metrics. Ray keeps, per trial and numeric key, its max, min, mean and last-5/10 means
    (two dicts and two deques, about 2 KB a key) until the run ends: tunekit's two save-cost keys cost a
    2,000-trial sweep's driver about 9 MiB. Nobody ranks trials by them; every row keeps them."""
    meta = trial.run_metadata
    keys = [k for k in meta.metric_analysis if k.startswith("tunekit/")]
    if keys:
        for key in keys:
            meta.metric_analysis.pop(key, None)
            meta.metric_n_steps.pop(key, None)
        meta.invalidate_cache()


def remove_placement_group(group_id: str) -> None:
    """Remove the placement group of hex id ``group_id`` (one already removed: nothing happens).

    Ray Train V2 removes a run's placement group when its controller ends, or, when the controller dies
    ungracefully, through a watcher that asks Ray's State API, which a Ray without its dashboard lacks:
    a Tune trial stopped while its Train run is live (a PBT pause or exploit) would hold the group's
    CPUs for good. ``PlacementGroup`` built from an id is undocumented.
    """
    import ray
    from ray.util.placement_group import PlacementGroup
    from ray.util.placement_group import remove_placement_group as remove

    group = PlacementGroup(ray.PlacementGroupID.from_hex(group_id))
    if ray.util.placement_group_table(group).get("state") not in (None, "REMOVED"):
        remove(group)


def with_function_mixin(function: Any, mixin: type) -> Any:
    """Make Tune's class for function trainable ``function`` inherit ``mixin`` first (its ``cleanup`` runs
    when Tune stops the trial): Ray's ``wrap_function`` reads the undocumented ``__mixins__``."""
    function.__mixins__ = (mixin, *getattr(function, "__mixins__", ()))
    return function


def persist_train_checkpoint(checkpoint: Any, checkpoint_dir_name: str) -> Any:
    """Inside a Ray Train worker: copy ``checkpoint`` to the run's storage as ``checkpoint_dir_name``, as
    ``ray.train.report`` does itself when no ``checkpoint_upload_fn`` is given (Train's ``get_storage`` is a
    DeveloperAPI and its ``persist_current_checkpoint`` undocumented)."""
    import ray.train

    return ray.train.get_context().get_storage().persist_current_checkpoint(checkpoint, checkpoint_dir_name)

