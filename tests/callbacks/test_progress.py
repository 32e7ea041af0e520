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


def _trials(n: int, status: str) -> list:
    from ray.tune.experiment import Trial

    trials = [Trial("f", stub=True, trial_id=f"{i:05d}") for i in range(n)]
    for trial in trials:
        trial.set_status(status)
        trial.update_last_result({"training_iteration": 4, "loss": 0.5})
    return trials


def test_each_trials_end_is_a_line_in_a_small_sweep_and_counted_in_the_status_line_of_a_large_one():
    from tunekit.callbacks.progress import TRIAL_LINES_UP_TO

    for n, lines_each in ((TRIAL_LINES_UP_TO, True), (TRIAL_LINES_UP_TO + 1, False)):
        stream = io.StringIO()
        printer = ProgressPrinter("loss", stream=stream, interval_s=3600)
        trials = _trials(n, "TERMINATED")
        for trial in trials:
            printer.on_trial_result(0, trials, trial, trial.last_result)
            printer.on_trial_complete(0, trials, trial)
        lines = stream.getvalue().splitlines()
        done = [line for line in lines if " done after 4 iterations, loss=0.5000" in line]
        assert len(done) == (n if lines_each else 0), lines[:5]
        # one status line in the period (interval_s): its counts say how many ended
        assert len(lines) == len(done) + 1 and f"{n} trials ({n} terminated)" in lines[0], lines[:3]


def test_the_status_line_counts_ended_trials_folded_and_names_the_best_by_mode():
    """An ended trial's result still counts in the status line (its iterations, its metric) after it is folded;
    the best is by ``mode``, and without one the line says it shows the highest. A result after a trial's end
    counts it as going on again, not twice."""
    import pickle

    import pytest

    from tunekit.errors import ConfigError

    def last_line(printer, trials, trial, result):
        printer._last_print = float("-inf")  # (a line now, whatever the interval)
        printer.on_trial_result(0, trials, trial, result)
        return printer.stream.getvalue().splitlines()[-1]

    losses = [0.9, 0.2, 0.5]
    for mode, word, expected in (("min", "best", 0.2), ("max", "best", 0.9), (None, "highest", 0.9)):
        printer = ProgressPrinter("loss", mode=mode, stream=io.StringIO(), interval_s=3600)
        trials = _trials(3, "RUNNING")
        for trial, loss in zip(trials, losses):
            printer.on_trial_result(0, trials, trial, {"training_iteration": 4, "loss": loss})
        for trial in trials[:2]:
            trial.set_status("TERMINATED")
            printer.on_trial_complete(0, trials, trial)
        assert set(printer._latest) == {trials[2].trial_id}  # (the ended ones folded)
        line = last_line(printer, trials, trials[2], {"training_iteration": 5, "loss": losses[2]})
        assert f"3 trials (1 running, 2 terminated); 13 iterations; {word} loss={expected:.4f}" in line, line
        again = pickle.loads(pickle.dumps(printer))  # (Tune keeps the callbacks with the experiment)
        again.stream = io.StringIO()
        line = last_line(again, trials, trials[0], {"training_iteration": 5, "loss": 0.7})
        best = {"min": 0.2, "max": 0.7, None: 0.7}[mode]
        assert f"14 iterations; {word} loss={best:.4f}" in line, line
        fresh = ProgressPrinter("loss", mode=mode, stream=io.StringIO(), interval_s=3600)
        fresh.on_trial_result(0, trials, trials[0], {"training_iteration": 1, "loss": float("nan")})
        line = last_line(fresh, trials, trials[1], {"training_iteration": 1, "loss": 0.3})
        assert f"{word} loss=0.3000" in line, line  # (a NaN is never the best)
    with pytest.raises(ConfigError, match="mode='best'"):
        ProgressPrinter("loss", mode="best")
