"""The contract with Ray's private names (the tunekit._ray package): each exists and behaves as relied on.

A failure names the Ray name that changed. CI runs this module on the floor
and on the newest Ray that setup.cfg admits.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import pkgutil
import re
import shutil
import types
import warnings
from pathlib import Path

import pytest
import ray
from packaging.requirements import Requirement
from ray import tune
from ray.tune.experiment import Trial
from ray.tune.schedulers import PopulationBasedTraining

import tunekit
import tunekit.callbacks
import tunekit.trainables
from tunekit import _ray

pytestmark = pytest.mark.floor


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _named(fn) -> list[str]:
    """Parameter names, without *args/**kwargs."""
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    # Ray's actor tracing adds _ray_trace_ctx to methods of classes it made actors of.
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind not in kinds and p.name != "_ray_trace_ctx"]


def test_installed_ray_is_in_the_declared_range():
    declared = next(
        Requirement(r) for r in importlib.metadata.requires("tunekit") if Requirement(r).name == "ray"
    )
    assert declared.specifier.contains(ray.__version__), f"Ray {ray.__version__} is outside {declared}"


@pytest.mark.parametrize(
    "name, params",
    [
        ("ray.train._internal.checkpoint_manager._TrainingResult", ["checkpoint", "metrics"]),
        ("ray.train._internal.session.get_session", []),
        ("ray.train._internal.storage.StorageContext", ["storage_path", "experiment_dir_name", "trial_dir_name"]),
        ("ray.train._internal.storage.StorageContext._get_session_path", ["self"]),
        ("ray.tune.trainable.FunctionTrainable.setup", ["self", "config"]),
        ("ray.tune.trainable.FunctionTrainable.step", ["self"]),
        ("ray.tune.trainable.FunctionTrainable.execute", ["self", "fn"]),
        ("ray.tune.trainable.FunctionTrainable._report_thread_runner_error", ["self", "block"]),
        ("ray.tune.trainable.FunctionTrainable.cleanup", ["self"]),
        ("ray.tune.trainable.FunctionTrainable.reset_config", ["self", "new_config"]),
        ("ray.tune.Trainable._report_class_trainable_checkpoint", ["self", "checkpoint_dir", "checkpoint_dict_or_path"]),
        ("ray.tune.schedulers.PopulationBasedTraining._checkpoint_or_exploit",
         ["self", "trial", "tune_controller", "upper_quantile", "lower_quantile"]),
        ("ray.tune.schedulers.PopulationBasedTraining._exploit", ["self", "tune_controller", "trial", "trial_to_clone"]),
        ("ray.tune.execution.tune_controller.TuneController._schedule_trial_task",
         ["self", "trial", "method_name", "args", "kwargs", "on_result", "on_error"]),
        ("ray.tune.execution.tune_controller.TuneController._schedule_trial_restore", ["self", "trial"]),
        ("ray.tune.execution.tune_controller.TuneController._trial_task_failure", ["self", "trial", "exception"]),
        ("ray.tune.experiment.trial._TrialInfo", ["trial"]),
        ("ray.tune.Trainable.reset", ["self", "new_config", "storage"]),
        ("ray.tune.schedulers.PopulationBasedTraining.__init__", ["self", "time_attr", "metric", "mode",
                                                                  "perturbation_interval", "burn_in_period",
                                                                  "hyperparam_mutations", "quantile_fraction",
                                                                  "resample_probability", "perturbation_factors",
                                                                  "custom_explore_fn", "log_config",
                                                                  "require_attrs", "synch"]),
    ],
)
def test_private_callable_exists_with_the_signature_relied_on(name, params):
    module_name, _, attr = name.rpartition(".")
    owner = None
    while module_name:
        try:
            owner = importlib.import_module(module_name)
            break
        except ImportError:  # a class path: import its module, walk the attributes
            module_name, _, head = module_name.rpartition(".")
            attr = f"{head}.{attr}"
    assert owner is not None, f"{name}: module not found"
    target = owner
    for part in attr.split("."):
        assert hasattr(target, part), f"Ray changed: {name} is gone"
        target = getattr(target, part)
    got = _params(target)
    in_order = [p for p in got if p in params]
    assert in_order == params, f"Ray changed: {name} takes {got}, tunekit relies on {params}"


def test_train_run_snapshot_is_what_a_stale_one_is_told_by(tmp_path):
    """Ray Train V2's run snapshot file and the key its entries name checkpoints by; a snapshot naming a
    checkpoint gone from storage is set aside (Train would refuse to start the run again), else left."""
    import json

    import pyarrow.fs as pafs
    from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME as name
    from ray.train.v2._internal.execution.checkpoint import checkpoint_manager

    from tunekit._ray import set_aside_stale_train_snapshot

    assert name == "checkpoint_manager_snapshot.json", f"Ray changed: the Train run snapshot is {name}"
    assert "checkpoint_dir_name" in checkpoint_manager._TrainingResultState.__annotations__, "Ray changed"
    assert hasattr(checkpoint_manager.CheckpointManager, "_assert_checkpoints_exist"), "Ray changed"
    entry = {"version": 0, "checkpoint_dir_name": "checkpoint_a", "metrics": {}}
    (tmp_path / name).write_text(json.dumps({"checkpoint_results": [entry, {**entry, "checkpoint_dir_name": "checkpoint_b"}],
                                             "latest_checkpoint_result": entry}))
    (tmp_path / "checkpoint_a").mkdir()
    (tmp_path / "checkpoint_b").mkdir()
    fs = pafs.LocalFileSystem()
    assert set_aside_stale_train_snapshot(fs, str(tmp_path)) == [] and (tmp_path / name).exists()
    (tmp_path / "checkpoint_a").rmdir()
    assert set_aside_stale_train_snapshot(fs, str(tmp_path)) == ["checkpoint_a"]
    assert not (tmp_path / name).exists() and len(list(tmp_path.glob(f"{name}.stale-*"))) == 1
    assert set_aside_stale_train_snapshot(fs, str(tmp_path / "nothing-here")) == []


def test_an_actor_handle_knows_its_methods(ray_session):
    """supports_clone asks a trial's worker handle whether its class has ``tunekit_clone``."""
    import ray

    from tunekit.trainables import DigitsTrainable

    handle = ray.remote(num_cpus=0)(DigitsTrainable).remote(config={"hidden_size": 8, "steps_per_iteration": 2})
    try:
        assert hasattr(handle, "tunekit_clone") and not hasattr(handle, "no_such_method"), "Ray changed: ActorHandle"
    finally:
        ray.kill(handle)


_OTHER_RAY = """
import os, sys, ray
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
Bystander = ray.remote(num_cpus=0)(type("TunekitBystander", (), {"pid": lambda self: os.getpid()}))
bystander = Bystander.remote()  # (held: an actor whose handle is dropped exits)
print(ray.get(bystander.pid.remote()), flush=True)
sys.stdin.read()
"""


def test_actor_workers_are_the_connected_rays_only(ray_session):
    """A worker's process title is ``ray::<Class>`` and its raylet names the cluster's GCS address: of two Rays
    on one machine with same-titled workers, actor_workers names only the connected one's."""
    import os
    import subprocess
    import sys

    import ray

    Bystander = ray.remote(num_cpus=0)(type("TunekitBystander", (), {"pid": lambda self: os.getpid()}))
    own = Bystander.remote()
    other = subprocess.Popen([sys.executable, "-c", _OTHER_RAY], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        own_pid, other_pid = ray.get(own.pid.remote()), int(other.stdout.readline())
        with open(f"/proc/{other_pid}/cmdline", "rb") as fh:
            assert fh.read().startswith(b"ray::TunekitBystander"), "Ray changed: a worker's process title"
        assert _ray.actor_workers("TunekitBystander") == [own_pid], "Ray changed: the raylet's --gcs-address"
    finally:
        ray.kill(own)
        other.communicate("", timeout=120)


def test_storage_and_trainable_internals_behave_as_relied_on(ray_session, tmp_path):
    """A tunekit class trainable in this process saves in place and restores through every private name."""
    from tunekit.trainables import DigitsTrainable

    storage = _ray.storage_context(str(tmp_path), "exp", "trial", validate=True)
    for name in ("_update_checkpoint_index", "_check_validation_file", "persist_artifacts", "storage_filesystem",
                 "persist_current_checkpoint",  # (a function trial's report calls it on the instance: wrapped there)
                 "checkpoint_fs_path", "sync_config", "trial_fs_path", "current_checkpoint_index"):
        assert hasattr(storage, name), f"Ray changed: StorageContext.{name} is gone"
    storage.current_checkpoint_index = 6  # tunekit raises it past an index used before; the path follows
    assert storage.checkpoint_fs_path.endswith("checkpoint_000006")
    from ray.train._internal.storage import StorageContext

    # (the name of the index a remote upload goes to next: its stale manifest is deleted before the upload)
    assert StorageContext._make_checkpoint_dir_name(7) == "checkpoint_000007", "Ray changed: _make_checkpoint_dir_name"
    storage.current_checkpoint_index = -1
    trainable = DigitsTrainable(config={"hidden_size": 8, "steps_per_iteration": 2}, storage=storage)
    try:
        for name in ("_last_result", "_storage", "_iteration", "_time_total", "_time_since_restore",
                     "_iterations_since_restore", "_restored"):
            assert hasattr(trainable, name), f"Ray changed: Trainable.{name} is gone"
        trainable.train()
        saved = trainable.save()
        assert isinstance(saved, _ray.TrainingResult)
        assert saved.checkpoint.path == storage.checkpoint_fs_path  # written in place, index advanced
        assert saved.metrics["training_iteration"] == 1
        trainable.train()
        trainable.restore(saved)
        assert trainable.iteration == 1
    finally:
        trainable.stop()


def test_function_runner_internals_behave_as_relied_on(ray_session, tmp_path):
    from tunekit import function_trainable
    from tunekit.trainables import train_digits

    cls = function_trainable(train_digits)
    storage = _ray.storage_context(str(tmp_path), "exp", "fn", validate=True)
    trainable = cls(config={"hidden_size": 8, "steps_per_iteration": 2}, storage=storage)
    try:
        assert hasattr(trainable, "_last_training_result"), "Ray changed: FunctionTrainable._last_training_result"
        trainable.train()
        saved = trainable.save()
        assert saved.checkpoint is not None and saved.metrics["training_iteration"] == 1
        trainable.train()
        trainable.restore(saved)
        assert trainable.iteration == 1
        assert trainable.train()["training_iteration"] == 2
    finally:
        trainable.stop()


def test_trial_worker_and_reset_keys_are_as_relied_on():
    """clone_in_place reaches the trial's worker and passes reset's magic keys."""
    from ray.tune import result
    from ray.tune.experiment import Trial
    from ray.tune.experiment.trial import _TemporaryTrialState, _TrialInfo

    assert _TemporaryTrialState().ray_actor is None, "Ray changed: Trial.temporary_state.ray_actor"
    state = _TemporaryTrialState()  # supports_clone keeps its answer there: never saved, never shared
    state.tunekit_clones = True
    assert state.__getstate__() == {}, "Ray changed: Trial.temporary_state is saved with the trial"
    from ray.tune.experiment.trial import _TrainingRunMetadata

    meta = _TrainingRunMetadata()  # forget_tunekit_metrics trims Ray's per-trial statistics of numeric keys
    meta.update_metric("tunekit/save_blocked_s", 0.1)
    meta.update_metric("loss", 1.0)
    meta.get_json_state()
    _ray.forget_tunekit_metrics(types.SimpleNamespace(run_metadata=meta))
    assert list(meta.metric_analysis) == list(meta.metric_n_steps) == ["loss"], "Ray changed: metric_analysis"
    assert "tunekit/" not in meta.get_json_state(), "Ray changed: _TrainingRunMetadata caches its JSON elsewhere"
    for key in ("TRIAL_INFO", "STDOUT_FILE", "STDERR_FILE"):
        assert isinstance(getattr(result, key, None), str), f"Ray changed: ray.tune.result.{key}"
    for attr in ("latest_checkpoint_result", "get_trainable_cls"):
        assert hasattr(Trial, attr), f"Ray changed: Trial.{attr}"
    assert "self.log_to_file" in inspect.getsource(Trial.__init__), "Ray changed: Trial.log_to_file"
    assert list(inspect.signature(_TrialInfo).parameters) == ["trial"], "Ray changed: _TrialInfo(trial)"
    # pin_donor_checkpoint replaces the checkpoint Ray's exploit handed the trial
    source = inspect.getsource(PopulationBasedTraining._exploit)
    assert "run_metadata.checkpoint_manager._latest_checkpoint_result" in source, \
        "Ray changed: PBT._exploit sets trial.run_metadata.checkpoint_manager._latest_checkpoint_result"
    # the experiment record reads a trial's CheckpointConfig
    config = tune.CheckpointConfig(num_to_keep=3)
    trial = Trial("__fake", config={}, checkpoint_config=config, stub=True)
    assert _ray.trial_checkpoint_config(trial) is config, "Ray changed: Trial.run_metadata.checkpoint_manager.checkpoint_config"
    reset = list(inspect.signature(tune.Trainable.reset).parameters)  # 2.51: (new_config, logger_creator, storage)
    assert reset[:2] == ["self", "new_config"] and "storage" in reset, "Ray changed: Trainable.reset(new_config, storage=)"


def test_pbt_trial_state_records_the_last_scored_time():
    from ray.tune.experiment import Trial

    from tunekit.schedule.pbt import PopulationBasedTrainingNoIdlePause

    pbt = PopulationBasedTrainingNoIdlePause(
        time_attr="training_iteration", metric="m", mode="max", perturbation_interval=2,
        hyperparam_mutations={"lr": [0.1, 0.2]},
    )
    assert (pbt.synch, pbt.time_attr, pbt.perturbation_interval) == (False, "training_iteration", 2)
    trial = Trial("__fake", config={"lr": 0.1}, stub=True)
    pbt.on_trial_add(types.SimpleNamespace(search_alg=None), trial)  # the controller's one attribute read
    assert pbt.last_scored_time(trial) == 0, "Ray changed: PBT _trial_state[trial].last_train_time"
    assert pbt._trial_state[trial].last_checkpoint is None, "Ray changed: PBT _trial_state[trial].last_checkpoint"
    assert trial.temporary_state.saving_to is None, "Ray changed: Trial.temporary_state.saving_to"
    from ray.train._internal.session import _FutureTrainingResult  # what Ray's PBT keeps for a save in flight

    assert callable(getattr(_FutureTrainingResult, "resolve", None)), "Ray changed: _FutureTrainingResult.resolve"


def _tunekit_modules():
    for package in (tunekit, tunekit.callbacks, tunekit.trainables):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith(("cli", "ddp")):  # no Ray classes; ddp needs Train workers
                continue
            yield importlib.import_module(info.name)


def test_every_override_overrides_a_ray_hook():
    """Each @override in tunekit names a method its Ray base class still has, with the same parameters."""
    checked = []
    for module in _tunekit_modules():
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            for name, member in vars(cls).items():
                if not getattr(member, "__override__", False):
                    continue
                base = next((b for b in cls.__mro__[1:] if name in vars(b)), None)
                where = f"{cls.__module__}.{cls.__qualname__}.{name}"
                assert base is not None, f"{where} overrides nothing: Ray renamed or removed {name}"
                if base.__module__.startswith("ray."):
                    ours, theirs = _named(member), _named(getattr(base, name))
                    assert set(ours) <= set(theirs), (
                        f"{where}: Ray's {base.__qualname__}.{name} takes {theirs}, tunekit's {ours}"
                    )
                checked.append(where)
    assert "tunekit._ray.pbt.PBTWithDonorChoice._checkpoint_or_exploit" in checked
    assert "tunekit.trial.torch_trainable.TorchTrainable.save_checkpoint" in checked
    assert "tunekit.callbacks.steps.CheckpointByStepsTaken.on_trial_result" in checked


def _joined(source: str) -> str:
    """Python source with implicitly concatenated string literals joined (roughly)."""
    return re.sub(r'"\s*\n\s*f?"', "", source)


def _ray_sources_containing(text: str) -> list[str]:
    root = Path(ray.__file__).parent
    return [str(p) for p in root.rglob("*.py") if text in _joined(p.read_text(errors="replace"))]


@pytest.mark.parametrize("category, message", _ray.RAY_WARNINGS)
def test_filtered_ray_warnings_are_exactly_those(category, message):
    hits = _ray_sources_containing(message[:40])
    assert len(hits) <= 1, hits  # absent in some versions; never from two places
    undo = _ray.quiet_ray_notices()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            _ray.quiet_ray_notices()()  # nested quieting restores what it found
            warnings.warn(message + " x", category)
        assert [str(w.message) for w in caught] == [message + " x"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.warn(message + " x", category)
            warnings.warn("another FutureWarning", category)
        assert [str(w.message) for w in caught] == ["another FutureWarning"]
    finally:
        undo()


@pytest.mark.parametrize("logger_name", sorted(_ray.RAY_NOTICES))
def test_filtered_ray_notices_still_come_from_where_they_are_filtered(logger_name):
    try:
        spec = importlib.util.find_spec(logger_name)
    except ModuleNotFoundError:
        spec = None
    if spec is None:  # e.g. no token authentication before Ray 2.5x: nothing logs it anywhere
        for prefix in _ray.RAY_NOTICES[logger_name]:
            assert not _ray_sources_containing(prefix[:30]), f"{prefix!r} is logged elsewhere now"
        return
    source = _joined(spec.loader.get_source(logger_name))
    for prefix in _ray.RAY_NOTICES[logger_name]:
        assert prefix[:30] in source, f"Ray changed: {logger_name} no longer logs {prefix!r}"
    record = logging.LogRecord(logger_name, logging.WARNING, __file__, 1, _ray.RAY_NOTICES[logger_name][0] + " x", None, None)
    undo = _ray.quiet_ray_notices()
    try:
        assert not logging.getLogger(logger_name).filter(record)
        other = logging.LogRecord(logger_name, logging.WARNING, __file__, 1, "something else", None, None)
        assert logging.getLogger(logger_name).filter(other)
    finally:
        undo()
    assert logging.getLogger(logger_name).filter(record)


def test_only_a_sync_failure_on_a_vanished_temporary_file_is_dropped():
    name, prefix = _ray.RAY_SYNC_FAILURE
    spec = importlib.util.find_spec(name)
    assert spec is not None and prefix in _joined(spec.loader.get_source(name)), f"Ray changed: {name} no longer says {prefix!r}"
    # Ray's own temporary names for a searcher state (2.51 and later), then a real loss and other errors.
    vanished = ["/tmp/ray/s/driver_artifacts/.tmp_generator",
                "/tmp/ray/s/driver_artifacts/.8dce793a-36e5-tmp-basic-variant-state-2026-11-22.json"]
    kept = [FileNotFoundError(f"[Errno 2] Failed to open local file '{p}'. Detail: [errno 2]")
            for p in ("/tmp/ray/s/driver_artifacts/experiment_state-2026.json", "/tmp/tmpdir/result.json")]
    kept.append(PermissionError("[Errno 13] Failed to open local file '/x/.tmp_generator'"))

    def record(error):
        return logging.LogRecord(name, logging.ERROR, __file__, 1, prefix + " '/x' failed with exception: ", None,
                                 (type(error), error, None) if error else None)

    log = logging.getLogger(name)
    undo = _ray.quiet_ray_notices()
    try:
        for path in vanished:
            error = FileNotFoundError(f"[Errno 2] Failed to open local file '{path}'. Detail: [errno 2]")
            assert not log.filter(record(error)), path
        assert all(log.filter(record(error)) for error in kept)
        assert log.filter(record(None))
    finally:
        undo()
    assert log.filter(record(FileNotFoundError(f"Failed to open local file '{vanished[0]}'.")))


def test_tune_banner_switch_still_exists():
    from ray.tune.experimental import output

    assert "RAY_AIR_NEW_OUTPUT" in inspect.getsource(output.get_air_verbosity)
    undo = _ray.quiet_tune_banner()
    try:
        assert output.get_air_verbosity(0) is None  # the classic reporter, silent at verbose=0
    finally:
        undo()


def test_tune_checkpoint_is_recognised_without_importing_it_eagerly(tmp_path):
    from tunekit.checkpoint._manifest import locate

    where = locate(tune.Checkpoint.from_directory(str(tmp_path)))
    assert where.path == str(tmp_path)


def test_retention_internals_behave_as_relied_on(ray_session, tmp_path):
    """A callback finds the run's scheduler; a trial's checkpoint manager lists, forgets and repoints checkpoints."""
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import FIFOScheduler

    scheduler, seen = FIFOScheduler(), {}

    class Finds(tune.Callback):
        def setup(self, **info):
            seen["scheduler"] = _ray.calling_scheduler()

        def on_experiment_end(self, trials, **info):
            seen["trial"] = trials[0]

    def train(config):
        for i in range(2):
            d = tmp_path / f"c{i}"
            d.mkdir()
            tune.report({"i": i}, checkpoint=tune.Checkpoint.from_directory(str(d)))

    tune.Tuner(train, tune_config=tune.TuneConfig(scheduler=scheduler),
               run_config=tune.RunConfig(storage_path=str(tmp_path / "s"), name="e", verbose=0,
                                         callbacks=[Finds()])).fit()
    assert seen["scheduler"] is scheduler, "Ray changed: TuneController._scheduler_alg, or who calls Callback.setup"
    trial: Trial = seen["trial"]
    listed = _ray.registered_checkpoints(trial)
    assert [m["i"] for _, m in listed] == [0, 1], "Ray changed: the checkpoint manager's _checkpoint_results"
    _ray.forget_checkpoints(trial, {listed[1][0].path})
    assert [m["i"] for _, m in _ray.registered_checkpoints(trial)] == [0]
    assert trial.checkpoint.path == listed[0][0].path, "Ray changed: _latest_checkpoint_result"

    pbt = PopulationBasedTraining(time_attr="training_iteration", metric="m", mode="max", perturbation_interval=1,
                                  hyperparam_mutations={"lr": [0.1]})
    fake = Trial("__fake", config={"lr": 0.1}, stub=True)
    pbt.on_trial_add(types.SimpleNamespace(search_alg=None), fake)
    assert hasattr(pbt._trial_state[fake], "last_checkpoint"), "Ray changed: PBT _trial_state[].last_checkpoint"
    pbt._trial_state[fake].last_checkpoint = listed[0][0]
    assert _ray.scheduler_checkpoints(pbt) == {listed[0][0].path}, "Ray changed: PBT _trial_state[].last_checkpoint"


def test_a_trainable_runs_offline_without_a_ray_session(tmp_path):
    """``offline_storage``: a tunekit trainable trains, saves and restores in a plain process (tunekit check)."""
    from tunekit.trainables import TrainDigits

    config = {"hidden_size": 8, "steps_per_iteration": 2, "seed": 1}
    first = TrainDigits(config=config, storage=_ray.offline_storage(str(tmp_path), "a"))
    try:
        first.train()
        saved = first.save()
    finally:
        first.stop()
    second = TrainDigits(config=config, storage=_ray.offline_storage(str(tmp_path), "b"))
    try:
        second.restore(saved)
        assert second.train()["training_iteration"] == 2
    finally:
        second.stop()


def test_function_mixins_and_placement_group_removal_behave_as_relied_on(ray_session):
    """``train_trial``'s trainable stops its Train run when Tune stops the trial: Ray's class for a function
    trainable inherits the function's ``__mixins__`` first, and a placement group is removed by its id."""
    from ray.tune.trainable.function_trainable import wrap_function
    from ray.util.placement_group import placement_group

    class Mixin:
        pass

    def trial(config):
        pass

    made = tune.with_resources(_ray.with_function_mixin(trial, Mixin), {"cpu": 0.1})
    cls = made if isinstance(made, type) else wrap_function(made)
    assert cls.__mro__[1] is Mixin, f"Ray changed: wrap_function ignores __mixins__ ({cls.__mro__})"
    group = placement_group([{"CPU": 0.01}])
    ray.get(group.ready())
    _ray.remove_placement_group(group.id.hex())
    assert ray.util.placement_group_table(group)["state"] == "REMOVED"
    _ray.remove_placement_group(group.id.hex())  # one already removed: nothing happens


def test_a_trial_asks_its_worker_to_finish_its_last_save_once_per_result_in_a_worker_it_had_before(ray_session):
    """``finish_next_save_in_place``: one ask per result Tune handles however many callbacks ask; and again
    at a later result in the same worker (a trial paused, then resumed in the worker it had: actor reuse),
    whose last save would otherwise return before it is written. None while the trial's results say its saves
    are written before they return (``note_saves``)."""
    from tunekit._keys import SAVE_BLOCKED_KEY, SAVE_WRITE_KEY


    @ray.remote(num_cpus=0)
    class Worker:
        def __init__(self) -> None:
            self.asked = 0

        def tunekit_clone(self) -> None:
            pass

        def tunekit_sync_next_save(self) -> None:
            self.asked += 1

        def times_asked(self) -> int:
            return self.asked

    worker = Worker.remote()
    trial = Trial("__fake", config={}, stub=True)
    trial.temporary_state.ray_actor = worker
    trial.run_metadata.last_result = {"training_iteration": 3}
    for _ in range(3):  # the scheduler before a pause, then each tunekit callback: the same result
        _ray.finish_next_save_in_place(trial)
    assert ray.get(worker.times_asked.remote()) == 1
    trial.run_metadata.last_result = {"training_iteration": 8}  # resumed in the same worker, ending now
    _ray.finish_next_save_in_place(trial)
    _ray.finish_next_save_in_place(trial)
    assert ray.get(worker.times_asked.remote()) == 2
    # A result after a save without a write of its own to report: the worker writes each save before it returns.
    _ray.note_saves(trial, {SAVE_BLOCKED_KEY: 0.01, "loss": 1.0})
    _ray.note_saves(trial, {"loss": 0.5})  # (a result with no save before it says nothing)
    trial.run_metadata.last_result = {"training_iteration": 12}
    _ray.finish_next_save_in_place(trial)
    assert ray.get(worker.times_asked.remote()) == 2
    _ray.note_saves(trial, {SAVE_BLOCKED_KEY: 0.01, SAVE_WRITE_KEY: 0.2})  # its state grew: two-phase saves
    _ray.finish_next_save_in_place(trial)
    assert ray.get(worker.times_asked.remote()) == 3
    ray.kill(worker)


def test_a_checkpoint_index_naming_deleted_checkpoints_is_trimmed_so_that_ray_never_deletes_them_again(tmp_path):
    """What a resumed driver's Ray index is after a kill (its experiment state older than ``num_to_keep``'s last
    deletions): registering the next checkpoint deletes one that is gone and errors the trial; trimmed first,
    it does not, and the latest checkpoint stays the one the trial is restored from."""
    from ray.tune.experiment import Trial

    def result(i):
        (tmp_path / f"checkpoint_{i:06d}").mkdir(exist_ok=True)
        return _ray.TrainingResult(checkpoint=tune.Checkpoint(str(tmp_path / f"checkpoint_{i:06d}")),
                                   metrics={"training_iteration": i})

    def stale_trial():
        trial = Trial("__fake", config={}, stub=True, checkpoint_config=tune.CheckpointConfig(num_to_keep=2))
        for i in (0, 1):
            trial.run_metadata.checkpoint_manager.register_checkpoint(result(i))
        shutil.rmtree(tmp_path / "checkpoint_000000")  # deleted after the experiment state was written
        return trial

    untouched = stale_trial()
    with pytest.raises(FileNotFoundError):  # Ray as it is: the reason for the trim (else it is not needed)
        untouched.run_metadata.checkpoint_manager.register_checkpoint(result(2))

    trial = stale_trial()
    latest = trial.checkpoint.path
    assert _ray.drop_vanished_checkpoints(trial) == [str(tmp_path / "checkpoint_000000")]
    assert [m["training_iteration"] for _, m in _ray.registered_checkpoints(trial)] == [1]
    assert trial.checkpoint.path == latest, "Ray changed: _latest_checkpoint_result"
    trial.run_metadata.checkpoint_manager.register_checkpoint(result(3))
    assert _ray.drop_vanished_checkpoints(trial) == []
