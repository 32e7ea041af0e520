"""Checkpoint policies through real Tuner.fit() runs: exact checkpoint iterations on disk."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from ray import tune

from tests.callbacks.scripted import ScriptedTrainable, TickClock
from tests.support.contract import KillActorOnce, checkpoint_iterations
from tests.support.fit import fit
from tunekit.callbacks import CheckpointByStepsTaken, CheckpointByTime, CheckpointOnImprovement, CheckpointOnPreemption
from tunekit.trainables import DigitsTrainable, TrainDigits


def _fit(storage, name, callbacks, *, stop, trainable=ScriptedTrainable, config=None, max_failures=0, **ckpt):
    grid = fit(trainable, storage, name, stop=stop, config=config or {"scores": [0.0]}, callbacks=callbacks,
               max_failures=max_failures, **ckpt)
    return [checkpoint_iterations(Path(r.path)) for r in grid]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: CheckpointByStepsTaken(0), r"CheckpointByStepsTaken\(iterations_per_checkpoint=0\): must be an integer >= 1"),
        (lambda: CheckpointByStepsTaken(2.5), r"iterations_per_checkpoint=2.5"),
        (lambda: CheckpointByTime(0), r"CheckpointByTime\(seconds=0\): must be a finite number > 0"),
        (lambda: CheckpointByTime(float("nan")), r"seconds=nan"),
        (lambda: CheckpointOnImprovement(""), r"CheckpointOnImprovement\(metric=''\)"),
        (lambda: CheckpointOnImprovement("acc", mode="up"), r"mode='up'\): must be 'min' or 'max'"),
        (lambda: CheckpointOnImprovement("acc", min_delta=-1), r"min_delta=-1"),
        (lambda: CheckpointOnPreemption(signals=(signal.SIGKILL,)), r"cannot be caught"),
        (lambda: CheckpointOnPreemption(poll_interval_s=0), r"poll_interval_s=0"),
    ],
)
def test_bad_arguments_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.floor
def test_steps_taken_exact_iterations(ray_session, storage):
    assert _fit(storage, "steps", [CheckpointByStepsTaken(3)], stop=10, checkpoint_at_end=False) == [[3, 6, 9]]


def test_seeds_example_works_with_the_callback(ray_session, storage):
    """The seeds' MyTrainableClass, unchanged, with the callback imported from `callbacks`."""
    import os

    import torch
    from torch import nn

    class MyTrainableClass(tune.Trainable):
        def setup(self, config):
            self.model = nn.Sequential(nn.Linear(config.get("input_size", 32), 32), nn.ReLU(), nn.Linear(32, 10))

        def step(self):
            return {}

        def save_checkpoint(self, tmp_checkpoint_dir):
            checkpoint_path = os.path.join(tmp_checkpoint_dir, "model.pth")
            torch.save(self.model.state_dict(), checkpoint_path)
            return tmp_checkpoint_dir

        def load_checkpoint(self, tmp_checkpoint_dir):
            checkpoint_path = os.path.join(tmp_checkpoint_dir, "model.pth")
            self.model.load_state_dict(torch.load(checkpoint_path))

    grid = tune.Tuner(
        MyTrainableClass,
        param_space={"input_size": 64},
        run_config=tune.RunConfig(
            storage_path=str(storage),
            name="seeds",
            stop={"training_iteration": 6},
            callbacks=[CheckpointByStepsTaken(2)],
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False),
            verbose=0,
        ),
    ).fit()
    result = grid[0]
    assert result.error is None
    assert sorted(m["training_iteration"] for _, m in result.best_checkpoints) == [2, 4, 6]


@pytest.mark.parametrize("trainable", [DigitsTrainable, TrainDigits], ids=["class", "function"])
def test_steps_taken_counts_from_the_restored_iteration(ray_session, storage, trainable):
    # Checkpoints at 3; killed at 5; restored at 3; counting again from 3: 6, then 9.
    config = {"hidden_size": 8, "steps_per_iteration": 2, "seed": 1}
    got = _fit(
        storage, "restore", [KillActorOnce(5), CheckpointByStepsTaken(3)], stop=10, trainable=trainable,
        config=config, max_failures=1, checkpoint_at_end=False,
    )
    assert got == [[3, 6, 9]]


def test_steps_taken_state_round_trips():
    cb = CheckpointByStepsTaken(4)
    cb._last = {"abc": 8}
    other = CheckpointByStepsTaken(4)
    other.set_state(cb.get_state())
    assert other._last == {"abc": 8}


def test_time_policy_exact_iterations(ray_session, storage):
    # The tick clock advances 1 s per result: a trial's clock starts at its first result.
    assert _fit(storage, "time", [CheckpointByTime(3, clock=TickClock())], stop=10, checkpoint_at_end=False) == [[4, 7, 10]]


def test_improvement_policy_exact_iterations(ray_session, storage):
    scores = [1, 3, 2, 5, 5.05, 4, 7, 6]
    got = _fit(
        storage, "improve", [CheckpointOnImprovement("score", "max", min_delta=0.1)],
        stop=8, config={"scores": scores}, checkpoint_at_end=False,
    )
    assert got == [[1, 2, 4, 7]]
    got = _fit(storage, "improve-min", [CheckpointOnImprovement("score", "min")], stop=8,
               config={"scores": scores}, checkpoint_at_end=False)
    assert got == [[1]]


def test_policies_compose_with_checkpoint_config(ray_session, storage):
    scores = [1, 3, 2, 5, 5, 4, 7, 6, 6, 6, 6]
    got = _fit(
        storage, "compose",
        [CheckpointByStepsTaken(3), CheckpointOnImprovement("score", "max"), CheckpointByTime(5, clock=TickClock())],
        stop=11, config={"scores": scores}, checkpoint_frequency=4, checkpoint_at_end=True, num_to_keep=None,
    )
    # steps: 3,6,9   improvement: 1,2,4,7   time: 6,11   frequency: 4,8   at end: 11
    assert got == [[1, 2, 3, 4, 6, 7, 8, 9, 11]]
