"""One way the suite runs a real ``tune.Tuner(...).fit()``."""

from __future__ import annotations

from typing import Any, Iterable

from ray import tune


def fit(trainable: Any, storage: Any, name: str, *, stop: int, config: dict[str, Any], callbacks: Iterable = (),
        max_failures: int = 0, errors_ok: bool = False, tune_config: tune.TuneConfig | None = None,
        **checkpoint: Any) -> tune.ResultGrid:
    """Fit ``trainable`` on ``config`` for ``stop`` iterations into ``storage/name``; ``checkpoint``: ``CheckpointConfig``'s.

    Asserts that no trial errored unless ``errors_ok``.
    """
    grid = tune.Tuner(
        trainable,
        param_space=dict(config),
        tune_config=tune_config,
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(storage),
            stop={"training_iteration": stop},
            checkpoint_config=tune.CheckpointConfig(**checkpoint),
            failure_config=tune.FailureConfig(max_failures=max_failures),
            callbacks=list(callbacks),
            verbose=0,
        ),
    ).fit()
    assert errors_ok or not grid.errors, grid.errors
    return grid


def only_result(experiment: Any) -> tune.Result:
    """The one trial's result of the finished experiment at ``experiment``, read back from its files (a run built
    by another test process: ``built_once``)."""
    grid = tune.ResultGrid(tune.ExperimentAnalysis(str(experiment)))
    assert len(grid) == 1 and not grid.errors, (experiment, grid.errors)
    return grid[0]


def tunekit_rows(result: Any) -> Any:
    """Every row tunekit's ``ParquetLogger`` kept for ``result``'s trial, in the order reported (re-run
    iterations included): tunekit's own record of what ran. Ray's ``metrics_dataframe`` is not that: Ray
    restarts a restored trial's ``result.json`` from a copy and can lose the rows of a killed worker."""
    import posixpath

    from tunekit.analysis._result_frames import from_parquet, parquet_parts
    from tunekit.storage import Storage

    experiment = posixpath.dirname(result.path.rstrip("/"))
    where = Storage(result.filesystem, experiment, experiment)
    rows = from_parquet(where, parquet_parts(where), dedupe=False)
    return rows[rows["trial_id"] == result.metrics["trial_id"]]


class ControllerTrials:
    """What a scheduler sees of Tune's controller when it adds trials and chooses one to run."""

    search_alg = None

    def __init__(self, trials):
        self.trials = trials

    def get_trials(self):
        return self.trials
