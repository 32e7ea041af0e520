"""Reading experiment directories: Ray's own examples, tunekit runs on S3, damage, planted pickles."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
from ray import tune

from tunekit import ExperimentError
from tunekit.cli import main
from tunekit.experiment.snapshot import read_experiment
from tunekit.trainables import DigitsTrainable


@pytest.mark.floor
def test_status_reads_rays_example_experiments(ray_example_runs, capsys):
    pbt = ray_example_runs["pbt_function.py"]
    assert main(["status", str(pbt), "--metric", "mean_accuracy", "--mode", "max"]) == 0
    out = capsys.readouterr().out
    assert "8 trials: 8 TERMINATED" in out and "best trial for mean_accuracy (max):" in out
    snapshot = read_experiment(str(pbt))
    best = snapshot.best_checkpoint("mean_accuracy", "max")
    assert f"best trial for mean_accuracy (max): {best.trial_id}" in out
    assert f"best checkpoint: {best.uri}" in out
    # The best checkpoint is the best one of every trial's checkpoints.
    every = [c.metrics["mean_accuracy"] for t in snapshot.trials for c in t.checkpoints if "mean_accuracy" in c.metrics]
    assert best.value == max(every)
    assert all(t.iterations == 10 and t.checkpoints and t.trainable_name == "pbt_function" for t in snapshot.trials)
    assert all(isinstance(t.config.get("lr"), float) for t in snapshot.trials)

    hyperband = ray_example_runs["custom_func_checkpointing.py"]
    assert main(["status", str(hyperband), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["counts"] == {"TERMINATED": 5} and len(payload["trials"]) == 5
    for trial in payload["trials"]:
        assert set(trial["config"]) >= {"width", "height"}
        assert [c["iteration"] for c in trial["checkpoints"]] == [1]


def test_status_of_a_damaged_state_file_shows_what_it_can(ray_example_runs, tmp_path, capsys):
    exp = tmp_path / "damaged"
    shutil.copytree(ray_example_runs["pbt_function.py"], exp)
    state = sorted(exp.glob("experiment_state-*.json"))[-1]
    state.write_text(state.read_text()[:500])
    result = next(exp.glob("pbt_function_*/result.json"))
    result.write_text(result.read_text() + '{"training_iteration": 11, "trunc')
    assert main(["status", str(exp)]) == 2
    out, err = capsys.readouterr()
    assert "8 trials" in out  # from the trial directories
    assert len(err.strip().splitlines()) == 1
    assert f"{state.name} is damaged" in err and "1 damaged line(s) skipped" in err


@pytest.mark.parametrize("make", ["missing", "empty", "files-only"])
def test_status_refuses_what_is_not_an_experiment(make, tmp_path, capsys):
    target = tmp_path / "x"
    if make != "missing":
        target.mkdir()
    if make == "files-only":
        (target / "notes.txt").write_text("hello")
    assert main(["status", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(target) in err
    with pytest.raises(ExperimentError):
        read_experiment(str(target))


def test_metric_needs_mode(tmp_path, capsys):
    assert main(["status", str(tmp_path), "--metric", "loss"]) == 2
    assert "--metric and --mode go together" in capsys.readouterr().err


def test_status_of_a_tunekit_run_on_s3(ray_session, s3_bucket, capsys):
    """The run (any tunekit callback) keeps the readers' index on S3: the first `status` after it reads the
    index and one listing, not each trial's files."""
    from tunekit.callbacks import ExperimentRecord

    base = s3_bucket.uri("runs")
    tune.Tuner(
        DigitsTrainable,
        param_space={"hidden_size": 16, "steps_per_iteration": 3, "checkpoint_every": 2, "seed": tune.grid_search([1, 2])},
        run_config=tune.RunConfig(name="st", storage_path=base, stop={"training_iteration": 4}, verbose=0,
                                  callbacks=[ExperimentRecord()]),
    ).fit()
    exp = base.replace("/runs?", "/runs/st?")
    with s3_bucket.server.recording() as seen:
        assert main(["status", exp]) == 0
    assert [s for s in seen if "/.tunekit-index.json" in s] and not [s for s in seen if "/DigitsTrainable_" in s], \
        "\n".join(seen)
    assert main(["status", exp, "--metric", "accuracy", "--mode", "max"]) == 0  # (verifies the best checkpoint)
    out = capsys.readouterr().out
    assert "2 trials: 2 TERMINATED" in out and f"best checkpoint: s3://{s3_bucket.name}/runs/st/" in out
    snapshot = read_experiment(exp)
    for trial in snapshot.trials:
        assert [c.iteration for c in trial.checkpoints] == [2, 4]
        assert [r["training_iteration"] for r in trial.results] == [1, 2, 3, 4]
        assert trial.checkpoints[-1].metrics["accuracy"] == trial.last_result["accuracy"]


class _Plant:
    """Unpickling this runs a shell command that creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_inspection_never_unpickles(ray_example_runs, tmp_path, capsys):
    exp = tmp_path / "planted"
    shutil.copytree(ray_example_runs["custom_func_checkpointing.py"], exp)
    marker = tmp_path / "UNPICKLED"
    payload = pickle.dumps(_Plant(marker))
    pickle.loads(pickle.dumps(_Plant(tmp_path / "control")))  # the plant works when unpickled
    assert (tmp_path / "control").exists()
    for target in [exp / "tuner.pkl", *exp.glob("searcher-state-*.pkl"), exp / "searcher-state-planted.pkl",
                   *exp.glob("*/params.pkl"), *exp.glob("*/checkpoint_*/dict_checkpoint.pkl")]:
        target.write_bytes(payload)
    state = sorted(exp.glob("experiment_state-*.json"))[-1]
    data = json.loads(state.read_text())
    trial = json.loads(data["trial_data"][0][0])
    trial["storage"] = {"_type": "CLOUDPICKLE_FALLBACK", "value": payload.hex()}
    data["trial_data"][0][0] = json.dumps(trial)
    state.write_text(json.dumps(data))

    assert main(["status", str(exp)]) == 0
    assert main(["status", str(exp), "--json"]) == 0
    assert main(["verify", str(exp)]) == 0
    assert main(["report", str(exp), "--output", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    assert (tmp_path / "report" / "index.html").exists()
    assert not marker.exists()


def test_status_of_many_trials_shows_those_worth_a_look_and_all_of_them_with_all(tmp_path, capsys):
    import json as _json

    from tunekit.cli import main

    exp = tmp_path / "many"
    for i in range(60):
        trial = exp / f"f_{i:05d}_{i}"
        trial.mkdir(parents=True)
        (trial / "params.json").write_text(_json.dumps({"x": i}))
        row = {"trial_id": f"t{i:05d}", "training_iteration": 1, "loss": float(i), "done": True}
        (trial / "result.json").write_text(_json.dumps(row) + "\n")
    assert main(["status", str(exp), "--metric", "loss", "--mode", "min"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("t000")]
    assert [r.split()[0] for r in rows] == [f"t{i:05d}" for i in range(10)], out  # the 10 lowest losses
    assert "(50 more trials not shown: this table holds the best 10 by loss, best first" in out and "--all" in out
    assert main(["status", str(exp), "--metric", "loss", "--mode", "max"]) == 0  # ranked best first
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("t000")]
    assert rows == [f"t{i:05d}" for i in range(59, 49, -1)], rows
    assert main(["status", str(exp), "--metric", "loss", "--mode", "min", "--all"]) == 0
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if line.startswith("t000")]) == 60 and "not shown" not in out
    # the report's trial table the same way
    assert main(["report", str(exp), "--metric", "loss", "--mode", "min", "--output", str(tmp_path / "r")]) == 0
    page = (tmp_path / "r" / "index.html").read_text()
    table = page.split("<h2>Trials</h2>")[1].split("</table>")[0]
    assert "10 of 60 trials: the 10 best by loss, best first" in table and "--all" in table
    assert sorted(set(re.findall(r"<td>(t\d{5})</td>", table))) == [f"t{i:05d}" for i in range(10)], table
