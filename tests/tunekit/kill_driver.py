"""A real Tune driver that SIGKILLs itself at a chosen point: `POINT STORAGE NAME`.

POINT is where the driver dies (kill -9, no cleanup of any kind):
``training`` when a trial reports iteration 5 (``function``: the same with the
function-API reference trainable); ``checkpoint`` right after it
asked a worker to save iteration 4, before the save is registered;
``snapshot`` halfway through writing the experiment state once a trial is past
iteration 4; ``stale`` (``num_to_keep=2``) at iteration 7 with the experiment state on storage frozen
since a trial's second checkpoint, so that it names checkpoints deleted since; ``optuna`` (an OptunaSearch run) after two trials completed;
``quickstart`` runs ``tunekit quickstart``'s sweep (2 trials x 8 iterations)
and dies when a trial reports iteration 5; ``none`` (``none-function``) runs to the end.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import ray
from ray import tune
from ray.tune.execution.tune_controller import TuneController

from tunekit.callbacks import ParquetLogger
from tunekit.trainables import DigitsTrainable, TrainDigits

STOP = 8
CONFIG = {"hidden_size": 16, "batch_size": 32, "steps_per_iteration": 5}
OPTUNA_TRIALS = 5
OPTUNA_STOP = 3


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _KillerCallback(tune.Callback):
    """Tune saves callbacks with the experiment; a resumed driver must not die again."""

    def __init__(self) -> None:
        self.pid = os.getpid()

    def die(self) -> None:
        if os.getpid() == self.pid:
            _die()


class _KillAtResult(_KillerCallback):
    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result["training_iteration"] == 5:
            self.die()


class _KillAfterCompleted(_KillerCallback):
    def __init__(self) -> None:
        super().__init__()
        self.completed = 0

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.completed += 1
        if self.completed == 2:
            self.die()


def _kill_during_checkpoint() -> None:
    original = TuneController._schedule_trial_save

    def save_then_die(self, trial, result=None):
        future = original(self, trial, result)
        if (result or trial.last_result).get("training_iteration") == 4:
            _die()  # the worker got the request; the driver never hears back
        return future

    TuneController._schedule_trial_save = save_then_die


def _kill_during_snapshot() -> None:
    original = TuneController.save_to_dir

    def half_written_then_die(self):
        if any(t.last_result.get("training_iteration", 0) > 4 for t in self.get_trials()):
            path = os.path.join(self._storage.experiment_driver_staging_path, self.experiment_state_file_name)
            text = json.dumps({"trial_data": [], "runner_data": {}, "stats": {}} | {"pad": "x" * 4096})
            with open(path, "w") as fh:
                fh.write(text[: len(text) // 2])
                fh.flush()
            _die()
        return original(self)

    TuneController.save_to_dir = half_written_then_die


class _StaleIndex(_KillerCallback):
    """``stale``: Ray's experiment state stops being copied to storage once a trial has two checkpoints
    registered (one last copy is forced then); the driver dies when a trial reports iteration 7, by when
    ``num_to_keep=2`` deleted checkpoints that the copy on storage still names (Ray's snapshot lags its
    deletions by up to its checkpoint period; here, deterministically)."""

    def __init__(self) -> None:
        super().__init__()
        self.registered: dict[str, int] = {}
        self.freeze = False
        if os.getpid() == self.pid:
            self._patch()

    def _patch(self) -> None:
        from ray.tune.execution.experiment_state import _ExperimentCheckpointManager

        original = _ExperimentCheckpointManager.sync_up_experiment_state
        killer = self

        def sync_until_frozen(manager, save_fn, force=False, wait=False):
            if killer.freeze == "done":
                return None
            if killer.freeze:
                original(manager, save_fn, force=True, wait=True)
                killer.freeze = "done"
                return None
            return original(manager, save_fn, force=force, wait=wait)

        _ExperimentCheckpointManager.sync_up_experiment_state = sync_until_frozen

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        self.registered[trial.trial_id] = self.registered.get(trial.trial_id, 0) + 1
        if self.registered[trial.trial_id] == 2 and not self.freeze:
            self.freeze = True

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result["training_iteration"] == 7 and self.freeze == "done":
            self.die()


def make_tuner(point: str, storage: str, name: str) -> tune.Tuner:
    """The experiment of this driver; ``point="none"`` is the uninterrupted reference."""
    callbacks: list[tune.Callback] = [ParquetLogger(batch_rows=4)]
    tune_config = tune.TuneConfig()
    param_space = {**CONFIG, "seed": tune.grid_search([1, 2])}
    trainable: type = DigitsTrainable
    if point in ("training", "function"):
        callbacks.append(_KillAtResult())
        trainable = TrainDigits if point == "function" else DigitsTrainable
    elif point == "stale":
        callbacks.append(_StaleIndex())
    elif point == "checkpoint":
        _kill_during_checkpoint()
    elif point == "snapshot":
        _kill_during_snapshot()
    elif point == "optuna":
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        callbacks.append(_KillAfterCompleted())
        search = ConcurrencyLimiter(OptunaSearch(seed=5), max_concurrent=2)
        tune_config = tune.TuneConfig(metric="accuracy", mode="max", search_alg=search, num_samples=OPTUNA_TRIALS)
        param_space = {**CONFIG, "seed": 1, "lr": tune.loguniform(1e-3, 0.3), "momentum": tune.uniform(0.0, 0.95)}
    elif point == "none-function":
        trainable = TrainDigits
    elif point != "none":
        raise SystemExit(f"unknown point {point!r}")
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune_config,
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage,
            stop={"training_iteration": OPTUNA_STOP if point == "optuna" else STOP},
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2, checkpoint_at_end=True,
                                                    num_to_keep=2 if point == "stale" else None),
            callbacks=callbacks,
            verbose=0,
        ),
    )


def _quickstart(storage: str, name: str) -> int:
    """``tunekit quickstart`` as a user runs it, killed when a trial reports iteration 5."""
    from tunekit.callbacks import ProgressPrinter
    from tunekit.trainables.quickstart import run_quickstart

    pid = os.getpid()
    original = ProgressPrinter.on_trial_result

    def report_then_die(self, iteration, trials, trial, result, **info):
        original(self, iteration, trials, trial, result, **info)
        if result["training_iteration"] == 5 and os.getpid() == pid:
            _die()

    ProgressPrinter.on_trial_result = report_then_die
    run_quickstart(num_samples=2, max_iterations=STOP, storage_path=storage, name=name, cpus=2)
    return 0


def main(point: str, storage: str, name: str) -> int:
    if point == "quickstart":
        return _quickstart(storage, name)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    make_tuner(point, storage, name).fit()
    print("finished without being killed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
