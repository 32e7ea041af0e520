"""The PBT recipe: consistent setup, the paper's toy problem, robustness, GPU scheduling path."""

from __future__ import annotations

import pytest
import ray
from ray import tune

from tests.support.contract import DyingDigits, DyingTrainDigits
from tests.support.fit import ControllerTrials
from tunekit import ConfigError, verify_checkpoint
from tunekit.schedule.pbt import pbt_setup
from tunekit.trainables import DigitsTrainable
from tunekit.trainables.toy_pbt import TARGET_Q, run_toy_problem


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(perturbation_interval=0), "perturbation_interval=0): must be an integer >= 1"),
        (dict(mutations={"hidden_size": [8, 16]}), "cannot change ['hidden_size'] in place"),
        (dict(mutations={}), "give mutations and/or custom_explore_fn"),
        (dict(quantile_fraction=0.7), "quantile_fraction=0.7): must be in (0, 0.5]"),
        (dict(num_to_keep=0), "num_to_keep=0): must be an integer >= 1 or None"),
        (dict(mode="best"), "mode='best'): expected 'max' or 'min'"),
    ],
)
def test_inconsistent_settings_are_refused(kwargs, message):
    args = dict(metric="accuracy", mode="max", perturbation_interval=2, mutations={"lr": [0.1, 0.2]}) | kwargs
    with pytest.raises(ConfigError) as info:
        pbt_setup(DigitsTrainable, **args)
    assert message in str(info.value) and len(str(info.value).splitlines()) == 1


def test_setup_aligns_checkpoints_with_perturbations():
    setup = pbt_setup(DigitsTrainable, metric="accuracy", mode="max", perturbation_interval=3,
                      mutations={"lr": [0.1, 0.2], "momentum": [0.5, 0.9]}, num_to_keep=1)
    assert setup.checkpoint_config.checkpoint_frequency == 3 and setup.checkpoint_config.checkpoint_at_end
    assert setup.checkpoint_config.num_to_keep == 1
    assert setup.tune_config_kwargs() == {"metric": "accuracy", "mode": "max", "scheduler": setup.scheduler,
                                          "reuse_actors": True}


@pytest.mark.parametrize("synch", [False, True], ids=["async", "synch"])
def test_the_trial_chosen_to_wait_for_a_worker_keeps_every_worker_busy(synch):
    # Tune keeps a pausing trial's worker only while a chosen trial waits for one: with one waiting and
    # two pausing close together, the second worker was shut down and its CPU left idle.
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import PopulationBasedTraining

    setup = pbt_setup(DigitsTrainable, metric="accuracy", mode="max", perturbation_interval=2,
                      mutations={"lr": [0.1, 0.2]}, synch=synch)
    scheduler = setup.scheduler
    scheduler.set_search_properties(setup.metric, setup.mode)  # what Tune does with tune_config_kwargs()
    trials = [Trial("__fake", config={"lr": 0.1}, checkpoint_config=setup.checkpoint_config, stub=True)
              for _ in range(6)]
    controller = ControllerTrials(trials)
    for trial in trials:
        scheduler.on_trial_add(controller, trial)
    running, waiting, paused_ahead, paused, paused_behind = trials[0:2], trials[2], trials[3], trials[4], trials[5]
    progress = {waiting: 2, paused_ahead: 8, paused: 4, paused_behind: 6}
    for trial in trials:
        scheduler._trial_state[trial].last_train_time = progress.get(trial, 10)
    for trial in running:
        trial.set_status(Trial.RUNNING)
    for trial in (paused_ahead, paused, paused_behind):
        trial.set_status(Trial.PAUSED)
    # Ray's choice is the least advanced waiting trial, already waiting for a worker; tunekit's async
    # scheduler chooses the least advanced paused trial as well (a synchronous one keeps Ray's choice).
    rays = PopulationBasedTraining.choose_trial_to_run(scheduler, controller)
    assert rays is (None if synch else waiting)  # synchronous: none until the population reaches the sync point
    assert scheduler.choose_trial_to_run(controller) is (rays if synch else paused)
    if synch:
        return
    paused.set_status(Trial.PENDING)  # now two wait, as many as run: Ray's choice
    assert scheduler.choose_trial_to_run(controller) is waiting
    running[1].set_status(Trial.PAUSED)
    paused.set_status(Trial.PAUSED)  # one runs, one waits
    assert scheduler.choose_trial_to_run(controller) is waiting
    # Trials that have not run yet: Ray's choice is the first; Tune asked for their workers in that order and
    # starts the first ones' as CPUs allow: the last one is chosen, whose worker is not starting.
    fresh = [Trial("__fake", config={"lr": 0.1}, checkpoint_config=setup.checkpoint_config, stub=True)
             for _ in range(3)]
    controller.trials = [running[0], *fresh]
    for trial in fresh:
        scheduler.on_trial_add(controller, trial)
    assert scheduler.choose_trial_to_run(controller) is fresh[0]  # before any pause: Tune's order, Ray's choice
    controller.trials.append(paused)
    assert PopulationBasedTraining.choose_trial_to_run(scheduler, controller) is fresh[0]
    assert scheduler.choose_trial_to_run(controller) is fresh[-1]


def test_trials_whose_workers_are_starting_are_not_waited_for(ray_session):
    # A trial two intervals ahead pauses while another waits; trials that have not run yet and fit the cluster
    # beside it are starting their workers: pausing would hand its worker to one of them and stop that start.
    from ray.tune.execution.placement_groups import PlacementGroupFactory
    from ray.tune.experiment import Trial

    setup = pbt_setup(DigitsTrainable, metric="accuracy", mode="max", perturbation_interval=2,
                      mutations={"lr": [0.1, 0.2]})
    scheduler = setup.scheduler
    scheduler.set_search_properties(setup.metric, setup.mode)
    slots = int(ray.cluster_resources()["CPU"])
    trials = [Trial("__fake", config={"lr": 0.1}, checkpoint_config=setup.checkpoint_config, stub=True)
              for _ in range(slots + 1)]
    controller = ControllerTrials(trials[:slots])
    for trial in trials:
        trial.placement_group_factory = PlacementGroupFactory([{"CPU": 1}])
        scheduler.on_trial_add(controller, trial)
    ahead = trials[0]
    ahead.set_status(Trial.RUNNING)
    assert scheduler._action(controller, ahead, 4) == "continue"  # the others fit: their workers start
    controller.trials = trials  # one more than fits: it waits for a worker, the trial ahead pauses
    assert scheduler._action(controller, ahead, 4) == "pause"
    assert scheduler._action(controller, ahead, 3) == "continue"  # less than two intervals ahead
    controller.trials = trials[:slots]
    trials[1].set_status(Trial.PAUSED)  # a paused trial waits, whatever fits
    scheduler._trial_state[trials[1]].last_train_time = 2
    assert scheduler._action(controller, ahead, 4) == "pause"


def test_toy_problem_of_the_pbt_paper(ray_session, storage):
    # Time-shared on one slot, the population's path follows from iteration counts, not timing.
    with_pbt = run_toy_problem(str(storage), pbt=True, one_slot=True, seed=0)
    without = run_toy_problem(str(storage), pbt=False, one_slot=True)
    assert with_pbt >= TARGET_Q, with_pbt
    assert without < TARGET_Q, without  # each member alone only shrinks one coordinate (Q ~ 0.39)


@pytest.mark.parametrize("trainable", [DyingDigits, DyingTrainDigits], ids=["class", "function"])
def test_frequent_perturbation_with_one_checkpoint_kept_never_errors(ray_session, storage, tmp_path, trainable):
    setup = pbt_setup(trainable, metric="accuracy", mode="max", perturbation_interval=2,
                      mutations={"lr": tune.loguniform(1e-3, 0.5)}, num_to_keep=1, quantile_fraction=0.5)
    # A checkpoint every iteration (perturbations every 2: PBT's save and the frequency save
    # meet at even iterations). One worker dies (SIGKILL) mid-run too: inside the background
    # write of a checkpoint from iteration 4 on, once Tune has registered it (num_to_keep=1
    # deleted the one before) and the trial's next step has started; exploits go on around it.
    checkpoint_config = tune.CheckpointConfig(checkpoint_frequency=1, checkpoint_at_end=True, num_to_keep=1)
    died = tmp_path / "died"
    grid = tune.Tuner(
        trainable,
        param_space={"hidden_size": 16, "steps_per_iteration": 3, "seed": tune.grid_search([1, 2, 3, 4]),
                     "die_at": 4, "die_in_write": "state", "die_marker": str(died)},
        tune_config=tune.TuneConfig(**setup.tune_config_kwargs()),
        run_config=tune.RunConfig(
            name="keep1", storage_path=str(storage), stop={"training_iteration": 6},
            checkpoint_config=checkpoint_config,
            failure_config=tune.FailureConfig(max_failures=5), verbose=0,
        ),
    ).fit()
    assert not grid.errors, grid.errors
    assert died.exists()  # created by the worker just before it killed itself
    # An exploit can move a trial to its donor's (later) iteration, so it may stop at 7.
    assert all(r.metrics["training_iteration"] in (6, 7) for r in grid), [r.metrics for r in grid]
    assert all(len(r.best_checkpoints) == 1 for r in grid)
    # The kept checkpoint is on disk and whole: when PBT's save and the frequency save come at one
    # iteration, each is a directory of its own (one directory registered twice, num_to_keep=1 deleted
    # it as the "older" entry).
    kept = [c for r in grid for c, _ in r.best_checkpoints]
    assert all(verify_checkpoint(c.path).ok for c in kept), [verify_checkpoint(c.path).describe() for c in kept]


class _Placement(tune.Callback):
    """Record the resources each trial ran with."""

    def __init__(self) -> None:
        self.resources = {}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.resources[trial.trial_id] = trial.placement_group_factory.required_resources


def test_fractional_gpus_share_a_logical_gpu(ray_with_logical_gpus, storage):
    setup = pbt_setup(DigitsTrainable, metric="accuracy", mode="max", perturbation_interval=2,
                      mutations={"lr": tune.loguniform(1e-3, 0.5)})
    placement = _Placement()
    grid = tune.Tuner(
        tune.with_resources(DigitsTrainable, {"cpu": 1, "gpu": 0.5}),
        param_space={"hidden_size": 16, "steps_per_iteration": 20, "seed": tune.grid_search([1, 2])},
        tune_config=tune.TuneConfig(**setup.tune_config_kwargs()),
        run_config=tune.RunConfig(name="gpu", storage_path=str(storage), stop={"training_iteration": 10},
                                  checkpoint_config=setup.checkpoint_config, callbacks=[placement], verbose=0),
    ).fit()
    assert not grid.errors
    assert ray.cluster_resources()["GPU"] == 1
    assert all(r.get("GPU") == 0.5 for r in placement.resources.values()) and len(placement.resources) == 2
