"""The flagship scenario under a real kill, suite-sized (``benchmarks/chaos.py`` runs the long matrix):
``pbt_setup`` with actor reuse, ``num_to_keep=1`` and ``KeepCheckpoints``, a worker SIGKILLed inside a
checkpoint write at each phase (deterministic hooks in the worker, no sleeps), then one invariant check
of tunekit's own record: no trial in ERROR, every newest checkpoint there and good, nothing interrupted
left, every iteration once, ``verify`` and ``status`` say all is well."""

from __future__ import annotations

import pytest
from ray import tune

from tests.support.contract import DyingDigits, DyingTrainDigits
from tunekit.testing import invariant_violations
from tunekit.callbacks import KeepCheckpoints, ParquetLogger
from tunekit.schedule.pbt import pbt_setup


CONFIG = {"lr": 0.05, "momentum": 0.9, "hidden_size": 16, "batch_size": 32, "steps_per_iteration": 7}


@pytest.mark.parametrize("kind, phase", [("class", "state"), ("function", "manifest"), ("class", "committed")])
def test_pbt_with_actor_reuse_survives_a_kill_inside_a_write(ray_session, storage, tmp_path, kind, phase):
    dying = {"class": DyingDigits, "function": DyingTrainDigits}[kind]
    died = tmp_path / "died"
    setup = pbt_setup(dying, metric="accuracy", mode="max", perturbation_interval=2,
                      mutations={"lr": [0.02, 0.05, 0.1]}, num_to_keep=1)
    config = {**CONFIG, "seed": tune.grid_search([1, 2]), "die_at": 3, "die_in_write": phase,
              "die_after_step": False, "die_marker": str(died)}
    grid = tune.Tuner(
        dying,
        param_space=config,
        tune_config=tune.TuneConfig(**setup.tune_config_kwargs()),
        run_config=tune.RunConfig(name="chaos", storage_path=str(storage), stop={"training_iteration": 6},
                                  checkpoint_config=setup.checkpoint_config,
                                  callbacks=[KeepCheckpoints(trial_latest=1), ParquetLogger()],
                                  failure_config=tune.FailureConfig(max_failures=3), verbose=0),
    ).fit()
    assert died.exists(), "no worker died inside a write"
    assert invariant_violations(str(storage / "chaos"), grid) == []
