"""The readers tell the truth about failures, retention never deletes the newest checkpoint that verifies, and
bad settings are refused before anything starts: each as a user meets it, on a real experiment."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from ray import tune

from tests.support.faults import flip_byte
from tunekit import CheckpointError, ConfigError, verify_checkpoint
from tunekit.cli import main
from tunekit.experiment._index import INDEX_NAME
from tunekit.experiment.record import RECORD_NAME
from tunekit.experiment.snapshot import read_experiment


@pytest.fixture
def exp(quickstart_experiment, tmp_path) -> Path:
    """A copy of the quickstart's experiment, to damage."""
    copy = tmp_path / "qs"
    shutil.copytree(quickstart_experiment, copy)
    return copy


def _with_checkpoints(exp: Path, at_least: int):
    snap = read_experiment(str(exp))
    trial = next(t for t in snap.trials if len(t.checkpoints) >= at_least)
    return trial, [exp / trial.name / c.name for c in trial.checkpoints]


def test_gc_on_a_copy_whose_newest_checkpoint_is_corrupt_keeps_the_newest_good_one(exp, capsys):
    from tunekit.storage import resolve_storage

    trial, paths = _with_checkpoints(exp, 2)
    newest, good = paths[-1], paths[-2]
    flip_byte(resolve_storage(str(newest)).filesystem, str(newest))
    assert main(["gc", str(exp), "--trial-latest", "1"]) == 0
    out = capsys.readouterr().out
    assert f"damaged, left in place and not counted: {trial.name}/{newest.name}: corrupt" in out
    line = next(line for line in out.splitlines() if line.startswith(f"{trial.name}: "))
    assert f"keep 1: {good.name}" in line and newest.name not in line.split("; keep")[0]
    assert main(["gc", str(exp), "--trial-latest", "1", "--yes"]) == 0
    assert verify_checkpoint(str(good)).ok  # the only good one of the newest two: kept
    assert newest.is_dir()  # the damaged one: shown, not deleted


def test_status_finds_a_cut_checkpoint_file_without_a_metric_and_leaves_a_write_in_flight_to_verify(exp, capsys):
    trial, paths = _with_checkpoints(exp, 2)
    in_flight = exp / trial.name / "checkpoint_000099"  # files written, manifest not yet
    shutil.copytree(paths[-1], in_flight)
    (in_flight / "manifest.json").unlink()
    state, manifest = paths[0] / "state.pt", paths[1] / "manifest.json"
    size = state.stat().st_size
    for path, keep in ((state, size // 2), (manifest, 40)):
        with open(path, "r+b") as fh:
            fh.truncate(keep)
    assert main(["status", str(exp)]) == 2
    out, err = capsys.readouterr()
    cut = f"{paths[0].name} is corrupt: state.pt: {size // 2} bytes, manifest says {size}"
    torn = f"{paths[1].name} is corrupt: manifest.json is damaged"
    assert cut in out and cut in err and torn in err and "checkpoint_000099" not in err
    assert main(["status", str(exp), "--json"]) == 2
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert len(problems) == 2 and cut in problems[0] + problems[1] and torn in problems[0] + problems[1]


def test_status_names_a_checkpoint_that_lost_its_metadata_file(exp, capsys):
    trial, paths = _with_checkpoints(exp, 1)
    (paths[-1] / "tunekit.json").unlink()  # (its manifest still lists it)
    assert main(["status", str(exp), "--json"]) == 2
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert problems == [f"checkpoint {paths[-1]} is corrupt: tunekit.json: missing"]


def test_status_names_a_torn_search_state_that_would_make_ray_start_over(exp, capsys):
    state = max(exp.glob("basic-variant-state-*.json"))  # (a pickle, whatever its name says)
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    assert main(["status", str(exp), "--json"]) == 2
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert len(problems) == 1 and problems[0].startswith(f"{state.name} is damaged (torn after ")
    assert "Ray would start the experiment over; `tunekit resume` continues the trials" in problems[0]


def test_report_through_a_filesystem_object_names_a_cut_checkpoint(exp, tmp_path):
    import fsspec

    from tunekit.analysis.report import write_report
    from tunekit.storage import resolve_storage

    cut = sorted(exp.glob("*/checkpoint_*/state.pt"))[0]
    cut.write_bytes(b"cut")
    storage = resolve_storage(str(exp), filesystem=fsspec.filesystem("file"))  # (its URI does not resolve again)
    summary = write_report(storage, output=tmp_path / "report")
    assert summary.html.exists()
    assert [p for p in summary.problems if "is corrupt: state.pt: 3 bytes, manifest says" in p]


def test_status_exits_1_when_a_trial_is_in_error(ray_session, tmp_path, capsys):
    def fails(config):
        raise ValueError("boom")

    tune.Tuner(fails, run_config=tune.RunConfig(name="err", storage_path=str(tmp_path), verbose=0)).fit()
    assert main(["status", str(tmp_path / "err")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1 trial(s) in ERROR" in err[0] and "--resume-errored" in err[0]


def test_verify_names_a_registered_checkpoint_missing_on_storage(exp, capsys):
    record = json.loads((exp / RECORD_NAME).read_text())
    entry = next(t for t in record["trials"] if t.get("checkpoint"))
    shutil.rmtree(exp / entry["checkpoint"])  # what Ray's index can point at after a killed write
    assert main(["verify", str(exp)]) == 1
    out = capsys.readouterr().out
    assert f"{entry['checkpoint']}  iter     -  incomplete: registered by Ray as the trial's newest" in out


def test_verify_names_a_damaged_result_file(exp, capsys):
    result = next(exp.glob("*/result.json"))
    text = result.read_text()
    result.write_text(text[: len(text) - 40])  # the last line torn, as a killed driver leaves it
    assert main(["verify", str(exp)]) == 1
    assert f"damaged: {result.parent.name}/result.json: 1 damaged line(s)" in capsys.readouterr().out
    assert main(["status", str(exp)]) == 2  # status calls it damage too


def test_a_bad_tunekit_variable_is_refused_before_anything_starts(exp, monkeypatch, capsys):
    from tunekit.schedule.pbt import pbt_setup
    from tunekit.callbacks import ParquetLogger
    from tunekit.trainables import DigitsTrainable

    monkeypatch.setenv("TUNEKIT_CHECKPOINT_WAIT_S", "soon")  # docs/environment.md's own refused value
    assert main(["status", str(exp)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tunekit status: TUNEKIT_CHECKPOINT_WAIT_S='soon': expected a number of seconds"]
    with pytest.raises(ConfigError, match="TUNEKIT_CHECKPOINT_WAIT_S='soon'"):
        pbt_setup(DigitsTrainable, metric="accuracy", mode="max", perturbation_interval=2,
                  mutations={"lr": [0.1, 0.2]})
    with pytest.raises(ConfigError, match="TUNEKIT_CHECKPOINT_WAIT_S='soon'"):
        ParquetLogger().setup()  # any tunekit callback: Tuner.fit stops before the first trial
    monkeypatch.setenv("TUNEKIT_CHECKPOINT_WAIT_S", "30")
    monkeypatch.setenv("TUNEKIT_BACKGROUND_SAVES", "maybe")
    assert main(["verify", str(exp)]) == 2
    assert "TUNEKIT_BACKGROUND_SAVES='maybe': expected 1/true/yes/on or 0/false/no/off" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="refused only where no GPU is visible")
def test_check_on_cuda_without_a_gpu_is_refused(capsys):
    assert main(["check", "tunekit.trainables:DigitsTrainable", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda: no CUDA GPU is visible here" in err[0]


def test_load_best_model_into_a_module_that_does_not_fit_names_the_checkpoint(exp):
    from tunekit.analysis import best_checkpoint, load_best_model

    with pytest.raises(CheckpointError) as info:
        load_best_model(str(exp), torch.nn.Linear(3, 2), metric="accuracy", mode="max")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"checkpoint {best_checkpoint(str(exp), metric='accuracy', mode='max')}: model")
    assert "does not fit the Linear given" in message and "the checkpoint holds" in message


def test_without_rays_loggers_the_readers_read_the_parquet_rows(exp, capsys):
    """TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1 with ParquetLogger alone (docs/schedulers.md): no result.json,
    progress.csv or event file in any trial; nothing is called damaged or lost, and no row is missing."""
    from tunekit.analysis import load_results, pbt_lineage

    before = load_results(str(exp))
    exploits = pbt_lineage(str(exp)).exploits
    logs = [*exp.glob("*/result.json"), *exp.glob("*/progress.csv"), *exp.glob("*/events.out.tfevents.*")]
    assert {p.name.split(".")[0] for p in logs} == {"result", "progress", "events"}
    for path in logs:
        path.unlink()
    after = load_results(str(exp))
    assert not after.attrs and len(after) == len(before) > 0
    assert after[["trial_id", "training_iteration"]].values.tolist() == \
        before[["trial_id", "training_iteration"]].values.tolist()
    assert pbt_lineage(str(exp)).exploits.equals(exploits)
    capsys.readouterr()
    assert main(["verify", str(exp)]) == 0
    assert main(["status", str(exp)]) == 0
    out = capsys.readouterr().out
    assert "lacks" not in out and "damaged" not in out


def _tree(root: Path) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != INDEX_NAME}  # (the readers' index: any reader brings it up to date)


def test_gc_that_would_keep_nothing_of_a_trial_is_refused_unless_all(exp, capsys):
    before = _tree(exp)
    assert main(["gc", str(exp), "--trial-latest", "0", "--yes"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "keeps no checkpoint of 4 trial(s) that have one that verifies" in err, err
    assert "--all" in err and _tree(exp) == before  # nothing changed
    assert main(["gc", str(exp), "--trial-latest", "0", "--all"]) == 0
    assert "--all: every checkpoint of 4 trial(s) goes" in capsys.readouterr().out and _tree(exp) == before


def test_a_trial_directory_deleted_by_hand_is_damage_in_every_reader(exp, capsys):
    trial = read_experiment(str(exp)).trials[1]
    shutil.rmtree(exp / trial.name)
    assert main(["status", str(exp)]) == 2
    assert f"its directory {trial.name} is missing on storage" in capsys.readouterr().out
    assert main(["verify", str(exp)]) == 1
    assert f"its directory {trial.name} is missing on storage" in capsys.readouterr().out


def test_a_damaged_record_is_named_and_gc_refuses_without_its_guard(exp, capsys):
    before = _tree(exp)
    (exp / RECORD_NAME).write_text("{garbage")
    before[RECORD_NAME] = _tree(exp)[RECORD_NAME]
    assert main(["status", str(exp)]) == 2
    assert f"{RECORD_NAME} is damaged" in capsys.readouterr().out
    assert main(["verify", str(exp)]) == 1
    assert f"{RECORD_NAME} is damaged" in capsys.readouterr().out
    assert main(["gc", str(exp), "--trial-latest", "1", "--yes"]) == 2
    err = capsys.readouterr().err
    assert "cannot tell whether the run's driver is still running" in err and len(err.strip().splitlines()) == 1
    assert _tree(exp) == before


def _reports_nan(config):
    for _ in range(2):
        tune.report({"loss": float("nan")})


def test_a_metric_reported_only_as_nan_is_said_so(ray_session, tmp_path, capsys):
    tune.Tuner(_reports_nan, run_config=tune.RunConfig(name="nan", storage_path=str(tmp_path), verbose=0)).fit()
    main(["status", str(tmp_path / "nan"), "--metric", "loss", "--mode", "min"])
    out = capsys.readouterr()
    said = out.out + out.err
    assert "every value of 'loss' the trials reported is NaN or infinite (1 trial(s))" in said, said


@pytest.mark.parametrize("source, said", [
    ("def broken(:\n", "does not parse: invalid syntax"),
    ("raise RuntimeError('no GPU here')\n", "importing mod_raises raised RuntimeError: no GPU here"),
], ids=["syntax error", "raises at import"])
def test_check_of_a_module_that_cannot_be_imported_is_one_line_exit_2(tmp_path, monkeypatch, capsys, source, said):
    name = "mod_raises" if "raise" in source else "mod_broken"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    assert main(["check", f"{name}:Thing"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err, err


def test_report_never_writes_over_a_page_of_the_users(quickstart_experiment, tmp_path, capsys):
    mine = tmp_path / "site"
    mine.mkdir()
    (mine / "index.html").write_text("<p>my own page</p>")
    assert main(["report", str(quickstart_experiment), "--output", str(mine)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "holds files tunekit did not write (index.html)" in err[1], err  # (after "reading")
    assert (mine / "index.html").read_text() == "<p>my own page</p>" and sorted(p.name for p in mine.iterdir()) == [
        "index.html"]
    ours = tmp_path / "report"
    for _ in range(2):  # a directory holding tunekit's own earlier report: written again
        assert main(["report", str(quickstart_experiment), "--output", str(ours)]) == 0
    assert "Written by tunekit report." in (ours / "index.html").read_text()


def _never_reports(config):
    from tunekit import FunctionSession, TrainingState

    FunctionSession(TrainingState(models={"m": torch.nn.Linear(1, 1)}), config=config)


def test_a_function_trainable_that_never_reports_is_an_error_naming_it(ray_session, tmp_path):
    from tunekit import function_trainable

    grid = tune.Tuner(function_trainable(_never_reports),
                      run_config=tune.RunConfig(name="silent", storage_path=str(tmp_path), verbose=0)).fit()
    assert len(grid.errors) == 1
    assert "_never_reports: the training function returned without reporting anything" in str(grid.errors[0])


def test_a_warm_start_into_another_architecture_is_one_line_before_training(ray_session, exp, tmp_path):
    from tunekit import warm_start
    from tunekit.trainables import DigitsTrainable

    snap = read_experiment(str(exp))
    source = snap.trials[0].checkpoints[-1].uri
    grid = tune.Tuner(DigitsTrainable, param_space={"hidden_size": 8, **warm_start(source, mode="weights")},
                      run_config=tune.RunConfig(name="misfit", storage_path=str(tmp_path), verbose=0,
                                                stop={"training_iteration": 1})).fit()
    said = str(grid.errors[0])
    line = next(l for l in said.splitlines() if "does not fit" in l)
    assert f"warm start from {source} (weights): model" in line and "size mismatch" not in said, said[-1500:]


def test_an_endpoint_that_is_not_an_s3_server_is_named_so(tmp_path, monkeypatch, capsys):
    """A plain web server given as the S3 endpoint: the readers say it does not speak S3, not 'no such
    experiment directory' (which is what an S3 server without that prefix gets)."""
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # (the server's own request log is not the command's output)
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for command in ("status", "verify"):
            assert main([command, f"s3://bucket/exp?endpoint_override={endpoint}&region=us-east-1"]) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and f"the endpoint {endpoint} does not speak S3" in err, err
    finally:
        server.shutdown()
