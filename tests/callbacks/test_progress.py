"""ProgressPrinter: a trial's tunekit error as its own one line, during the run and again at its end."""

from __future__ import annotations

import io

from ray import tune

from tunekit.callbacks import ProgressPrinter
from tunekit.cli import main
from tunekit.experiment.snapshot import read_experiment
from tunekit.trainables import DigitsTrainable


class _BuildsADict(DigitsTrainable):
    def build(self, config):
        return {"model": None}  # not a TrainingState: tunekit refuses it in the trial


def test_a_tunekit_error_in_a_trial_is_shown_as_its_one_line(ray_session, storage, capsys):
    stream = io.StringIO()
    grid = tune.Tuner(
        _BuildsADict,
        param_space={"hidden_size": 8},
        run_config=tune.RunConfig(name="broken", storage_path=str(storage), stop={"training_iteration": 1},
                                  callbacks=[ProgressPrinter("accuracy", stream=stream)], verbose=0),
    ).fit()
    assert grid.errors
    expected = "ConfigError: _BuildsADict.build() must return a tunekit.TrainingState, got dict"
    lines = stream.getvalue().splitlines()
    (trial_id,) = [t.trial_id for t in read_experiment(str(storage / "broken")).trials]
    assert any(line.endswith(f"trial {trial_id} failed: {expected}") for line in lines), lines
    assert lines[-1].endswith(f"failed: {trial_id}: {expected}"), lines  # again after Ray's own output
    (trial,) = read_experiment(str(storage / "broken")).trials
    assert trial.error == expected
    assert main(["status", str(storage / "broken")]) == 1  # a trial in ERROR: a failure (docs/cli.md)
    assert expected[:40] in capsys.readouterr().out
