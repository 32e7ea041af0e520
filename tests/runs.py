"""Real runs that several test modules read (built once per session by fixtures in conftest)."""

from __future__ import annotations

from pathlib import Path

from ray import tune
from ray.tune.schedulers import PopulationBasedTraining

from tunekit.callbacks import ParquetLogger
from tunekit.trainables import DigitsTrainable

PBT_STOP = 5  # not a multiple of the perturbation interval: no exploit at the last iteration


def run_pbt_experiment(storage: Path) -> Path:
    """A real synchronous PBT run of 4 digits trials: exploits are certain every 2 iterations."""
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        quantile_fraction=0.5,
        synch=True,
        hyperparam_mutations={"lr": tune.loguniform(1e-3, 0.5)},
    )
    grid = tune.Tuner(
        DigitsTrainable,
        param_space={"hidden_size": 16, "steps_per_iteration": 4, "seed": 3,
                     "lr": tune.grid_search([0.002, 0.01, 0.05, 0.2])},
        tune_config=tune.TuneConfig(metric="accuracy", mode="max", scheduler=pbt, reuse_actors=True),
        run_config=tune.RunConfig(
            name="pbt", storage_path=str(storage), stop={"training_iteration": PBT_STOP},
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True),
            callbacks=[ParquetLogger(batch_rows=5)], verbose=0,
        ),
    ).fit()
    assert not grid.errors
    return storage / "pbt"
