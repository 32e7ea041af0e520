"""CheckpointAutopilot in real Tune runs. Time is the trial's own: each iteration reports 1 s of training
(``time_this_iter_s``) and a save cost of 0.5 s (the keys tunekit's trainables report), and the trial fails
(raises; Tune retries it from its newest checkpoint) every M executed iterations: so the autopilot's decisions depend on the results alone, never on the machine's
speed, and the runs are the same on a loaded machine."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from ray import tune

from tunekit import TorchTrainable, TrainingState
from tunekit.callbacks import CheckpointAutopilot, ProgressPrinter
from tunekit.cli import main
from tunekit.errors import ConfigError
from tunekit._keys import INTERVAL_KEY, SAVE_BLOCKED_KEY, SAVE_WRITE_KEY
from tunekit.schedule.interval import daly_interval

COST, MTBF = 0.5, 10.0


class Flaky(TorchTrainable):
    """1 s of training per iteration, a 0.5 s save; fails at the executed-iteration counts in ``failures``."""

    def build(self, config):
        return TrainingState(models={"model": torch.nn.Linear(2, 1)})

    def train_iteration(self):
        counter = Path(self.config["dir"]) / "executed"
        executed = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(executed))
        if executed in self.config["failures"]:
            raise RuntimeError(f"injected failure at executed iteration {executed}")
        return {"time_this_iter_s": 1.0, SAVE_BLOCKED_KEY: COST, SAVE_WRITE_KEY: COST, "loss": 1.0 / executed}


def _run(storage: Path, tmp_path: Path, iterations: int, failures: list[int], autopilot: CheckpointAutopilot,
         *more: tune.Callback):
    grid = tune.Tuner(
        Flaky,
        param_space={"dir": str(tmp_path), "failures": failures},
        run_config=tune.RunConfig(name="autopilot", storage_path=str(storage), stop={"training_iteration": iterations},
                                  callbacks=[*more, autopilot], failure_config=tune.FailureConfig(max_failures=-1),
                                  verbose=0),
    ).fit()
    assert not grid.errors, grid.errors
    return grid[0]


def test_the_interval_converges_to_dalys_optimum_for_the_true_failure_rate(ray_session, storage, tmp_path):
    failures = list(range(int(MTBF), 2000, int(MTBF)))  # one every 10 s of training: the rate is known exactly
    autopilot = CheckpointAutopilot(max_overhead=None, max_interval_s=60)  # no prior: M learnt from failures
    result = _run(storage, tmp_path, 35, failures, autopilot)
    seen = autopilot.mtbf.failures
    assert seen >= 4, f"only {seen} failures were injected"
    optimum = daly_interval(COST, MTBF)
    assert result.metrics[INTERVAL_KEY] == pytest.approx(optimum, rel=0.25), (autopilot.mtbf, optimum)


def test_with_no_failures_and_no_prior_it_holds_the_overhead_bound(ray_session, storage, tmp_path, capsys):
    stream = io.StringIO()  # the progress printer comes first: it sees the choice from the second result on
    result = _run(storage, tmp_path, 100, [], CheckpointAutopilot(max_overhead=0.05),
                  ProgressPrinter("loss", interval_s=0, stream=stream))
    assert result.metrics[INTERVAL_KEY] == pytest.approx(COST / 0.05)
    # Ray's per-trial statistics of every numeric key forget tunekit's own once the trial ends (the driver's
    # memory over thousands of trials); the rows keep them
    state = json.loads(sorted((storage / "autopilot").glob("experiment_state-*.json"))[-1].read_text())
    analysis = json.loads(state["trial_data"][0][1])["metric_analysis"]
    assert "loss" in analysis and not [k for k in analysis if k.startswith("tunekit/")], sorted(analysis)
    saved = sorted(int(p.name.split("_")[1]) for p in Path(result.path).glob("checkpoint_*"))
    # the first save measures the cost; after it, one every 10 s of training: 5% of it
    assert len(saved) - 1 <= 100 * 0.05 / COST
    lines = stream.getvalue().splitlines()
    assert "checkpoints" not in lines[0] and lines[-2].endswith("; checkpoints every 10s"), lines[:2] + lines[-2:]
    # the readers show the choice too: status's column and line, the report's table
    capsys.readouterr()
    assert main(["status", str(storage / "autopilot")]) == 0
    out = capsys.readouterr().out
    assert "ckpt every" in out and "(chosen by CheckpointAutopilot from save cost and failures): every 10s" in out, out
    assert main(["report", str(storage / "autopilot"), "--output", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert "<th>checkpoint every</th>" in page and "failures seen: every 10s." in page


def test_bad_arguments_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^CheckpointAutopilot\(mtbf='soon'\): expected a positive duration"):
        CheckpointAutopilot(mtbf="soon")
    with pytest.raises(ConfigError, match=r"^CheckpointAutopilot\(max_overhead=2\): must be a fraction"):
        CheckpointAutopilot(max_overhead=2)
    with pytest.raises(ConfigError, match=r"the minimum exceeds the maximum"):
        CheckpointAutopilot(min_interval_s=60, max_interval_s=10)


class Plain(TorchTrainable):
    def build(self, config):
        return TrainingState(models={"model": torch.nn.Linear(2, 1)})

    def train_iteration(self):
        return {"loss": 1.0}


class TwoPhase(Plain):
    background_saves_min_bytes = 0  # a save returns before its write is done, however small the state


@pytest.mark.parametrize("trainable", [Plain, TwoPhase], ids=["written-at-once", "two-phase"])
def test_the_trainables_report_each_saves_cost_once_in_the_next_result(ray_session, storage, trainable):
    """Each save's cost, in the result after it; the time of its write on after it returned only for a two-phase
    save (a small state's save is its write)."""
    grid = tune.Tuner(trainable, run_config=tune.RunConfig(
        name="costs", storage_path=str(storage), stop={"training_iteration": 7}, verbose=0,
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=3))).fit()
    rows = grid[0].metrics_dataframe
    measured = rows.loc[rows[SAVE_BLOCKED_KEY].notna(), "training_iteration"].tolist()
    assert measured == [4, 7], rows[["training_iteration", SAVE_BLOCKED_KEY]]  # saved after iterations 3 and 6
    assert (rows[SAVE_BLOCKED_KEY].dropna() > 0).all()
    if trainable is TwoPhase:
        assert rows[SAVE_WRITE_KEY].notna().tolist() == rows[SAVE_BLOCKED_KEY].notna().tolist()
    else:
        assert SAVE_WRITE_KEY not in rows


def test_the_save_cost_is_the_mean_of_the_trials_last_saves():
    # a save through the page cache blocks for a fraction to several times its mean: one fast save must not
    # halve the interval (a moving average would give 0.55 s here, the last save's weight)
    autopilot, trial = CheckpointAutopilot(max_overhead=0.05), SimpleNamespace(trial_id="t")
    saves = iter([0.1, 0.1, 1.0])
    for i in range(1, 30):
        result = {"time_this_iter_s": 1.0, "iterations_since_restore": i}
        if i in (2, 12, 22):  # each save's cost comes once, in the result after it
            result[SAVE_BLOCKED_KEY] = result[SAVE_WRITE_KEY] = next(saves)
        autopilot.on_trial_result(i, [trial], trial, result)
    assert result[INTERVAL_KEY] == pytest.approx(0.4 / 0.05)
    for i in range(30, 40):  # eight more saves: the first three leave the window
        result = {"time_this_iter_s": 1.0, "iterations_since_restore": i, SAVE_BLOCKED_KEY: 0.2, SAVE_WRITE_KEY: 0.2}
        autopilot.on_trial_result(i, [trial], trial, result)
    assert result[INTERVAL_KEY] == pytest.approx(0.2 / 0.05)
