"""tunekit.schedule.schedulers: a free worker goes to the newest waiting trial (not to one whose own worker is starting)."""

from __future__ import annotations

import pytest
from ray import tune
from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from tests.support.fit import ControllerTrials
from tunekit.schedule.schedulers import ASHAKeepWorkersBusy, FIFOKeepWorkersBusy, KeepWorkersBusy


@pytest.mark.parametrize("busy, ray_scheduler", [(FIFOKeepWorkersBusy, FIFOScheduler),
                                                 (ASHAKeepWorkersBusy, ASHAScheduler)])
def test_the_newest_waiting_trial_is_chosen(busy, ray_scheduler):
    trials = [Trial("__fake", config={"i": i}, stub=True) for i in range(7)]
    done, running, starting, waiting = trials[0:2], trials[2], trials[3], trials[4:]
    controller = ControllerTrials(trials)
    for trial in done:
        trial.set_status(Trial.TERMINATED)
    running.set_status(Trial.RUNNING)
    for trial in (starting, *waiting):
        trial.set_status(Trial.PENDING)
    # Ray's choice: the first waiting trial, the one whose own worker starts on the free CPU
    assert ray_scheduler().choose_trial_to_run(controller) is starting
    assert busy().choose_trial_to_run(controller) is waiting[-1]
    waiting[-1].set_status(Trial.RUNNING)
    assert busy().choose_trial_to_run(controller) is waiting[-2]
    for trial in (starting, *waiting):
        trial.set_status(Trial.TERMINATED)
    assert busy().choose_trial_to_run(controller) is None
    waiting[0].set_status(Trial.PAUSED)  # none waits: Ray's choice stands
    assert busy().choose_trial_to_run(controller) is ray_scheduler().choose_trial_to_run(controller) is waiting[0]


class _PausedFirst(FIFOScheduler):
    """A scheduler whose own choice is not FIFO's: a paused trial before any waiting one."""

    def choose_trial_to_run(self, tune_controller):
        paused = [t for t in tune_controller.get_trials() if t.status == Trial.PAUSED]
        return paused[0] if paused else super().choose_trial_to_run(tune_controller)


def test_a_base_with_its_own_choice_keeps_it():
    trials = [Trial("__fake", config={"i": i}, stub=True) for i in range(4)]
    for trial in trials:
        trial.set_status(Trial.PENDING)
    trials[1].set_status(Trial.PAUSED)
    controller = ControllerTrials(trials)
    busy = type("Busy", (KeepWorkersBusy, _PausedFirst), {})()
    assert busy.choose_trial_to_run(controller) is trials[1]  # the base's choice: not a waiting trial
    trials[1].set_status(Trial.TERMINATED)
    assert busy.choose_trial_to_run(controller) is trials[3]  # the base runs a waiting trial: the newest


def _short(config):
    for step in range(2):
        tune.report({"loss": config["x"] / (step + 1)})


def test_a_sweep_runs_every_trial_with_early_stopping_as_ray_has_it(ray_session, tmp_path):
    grid = tune.Tuner(
        _short,
        param_space={"x": tune.grid_search([4.0, 3.0, 2.0, 1.0])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", reuse_actors=True,
                                    scheduler=ASHAKeepWorkersBusy(max_t=2, grace_period=1, reduction_factor=2)),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="busy", verbose=0),
    ).fit()
    assert not grid.errors
    assert sorted(r.config["x"] for r in grid) == [1.0, 2.0, 3.0, 4.0]
    assert {r.metrics["training_iteration"] for r in grid} <= {1, 2}
    assert min(r.metrics["loss"] for r in grid) == 0.5  # the best trial ran both iterations
