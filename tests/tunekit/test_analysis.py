"""Results as pandas, best trial/checkpoint/model, PBT lineage, report and TensorBoard on real runs."""

from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow.fs as pafs
import pytest
import torch
from ray import tune

from tests.runs import PBT_STOP as STOP
from tests.tunekit.events import read_events
from tunekit import ConfigError, ExperimentError, resolve_storage
from tunekit.analysis import best_checkpoint, best_trial, load_best_model, load_results, pbt_lineage
from tunekit.callbacks import ParquetLogger
from tunekit.cli import main
from tunekit.analysis.report import write_report
from tunekit._keys import RESTORED_FROM_KEY
from tunekit.experiment.snapshot import read_experiment
from tunekit.analysis.tensorboard import export_tensorboard
from tunekit.trainables.digits import digits_model, evaluate


def test_parquet_and_result_json_agree(pbt_experiment):
    fast = load_results(str(pbt_experiment), source="parquet")
    slow = load_results(str(pbt_experiment), source="json")
    # Parquet has every row; Ray's result.json may lack rows of a resumed trial
    # (its JSON logger restarts from a stale copy on storage).
    assert len(fast) == 4 * STOP
    assert list(fast.columns[:2]) == ["trial_id", "training_iteration"] and "config/lr" in fast.columns
    assert (fast.groupby("trial_id")["training_iteration"].apply(list) == [list(range(1, STOP + 1))] * 4).all()
    assert "missing_iterations" not in fast.attrs
    keys = ["trial_id", "training_iteration"]
    joined = slow.merge(fast, on=keys, suffixes=("_json", "_parquet"))
    assert len(joined) == len(slow) > 0
    for column in ("accuracy", "loss", "config/lr"):
        assert joined[f"{column}_json"].tolist() == pytest.approx(joined[f"{column}_parquet"].tolist())
    # What result.json lacks is said, per trial, exactly.
    have = slow.groupby("trial_id")["training_iteration"].apply(set).to_dict()
    expected = {t: sorted(set(range(1, max(its) + 1)) - its) for t, its in have.items()}
    assert slow.attrs.get("missing_iterations", {}) == {t: m for t, m in expected.items() if m}


def test_gaps_in_result_json_are_reported(tmp_path, capsys):
    exp = tmp_path / "exp"
    _write_trial(exp, "t_a", _rows("a", [1, 2, 3], [1.0, 2.0, 3.0]))
    _write_trial(exp, "t_b", _rows("b", [3, 4], [1.0, 2.0]))  # a resumed trial's file restarted at 3
    df = load_results(str(exp))
    assert df.attrs["missing_iterations"] == {"b": [1, 2]}
    assert read_experiment(str(exp)).trials[1].missing_iterations == [1, 2]
    assert main(["status", str(exp)]) == 0
    assert "note: b's result.json lacks iterations 1-2" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["local", "s3"])
def test_parquet_logger_handles_trials_with_different_keys(ray_session, storage, where, request):
    def reporter(config):
        for i in range(3):
            tune.report({config["key"]: float(i), "shared": i if config["key"] == "a" else i + 0.5})

    base = str(storage) if where == "local" else request.getfixturevalue("s3_bucket").uri("runs")
    tune.Tuner(
        reporter, param_space={"key": tune.grid_search(["a", "b"])},
        run_config=tune.RunConfig(name="keys", storage_path=base, callbacks=[ParquetLogger(batch_rows=2)], verbose=0),
    ).fit()
    exp = resolve_storage(base).join("keys")
    df = load_results(exp, source="parquet")
    parts = exp.filesystem.get_file_info(pafs.FileSelector(exp.join("tunekit_results").path))
    names = [p.base_name for p in parts if p.base_name.endswith(".parquet")]
    assert len(names) == 1 and names[0].endswith("-all.parquet")  # batches compacted at the end
    a, b = (df[df["config/key"] == k] for k in ("a", "b"))
    assert a["a"].tolist() == [0.0, 1.0, 2.0] and a["b"].isna().all()
    assert b["b"].tolist() == [0.0, 1.0, 2.0] and b["a"].isna().all()
    assert df["shared"].tolist() == [0.0, 1.0, 2.0, 0.5, 1.5, 2.5]


def _write_trial(exp: Path, name: str, rows: list[dict]) -> None:
    trial = exp / name
    trial.mkdir(parents=True)
    (trial / "params.json").write_text(json.dumps(rows[0]["config"]))
    (trial / "result.json").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _rows(trial_id: str, iterations: list[int], scores: list[float]) -> list[dict]:
    return [{"trial_id": trial_id, "training_iteration": i, "score": s, "config": {"x": trial_id}}
            for i, s in zip(iterations, scores)]


def test_restored_iterations_count_once_keeping_the_lineage_that_went_on(tmp_path):
    exp = tmp_path / "exp"
    # Trial a ran to 4, was restored from its checkpoint at 2 and ran 3..5 again.
    _write_trial(exp, "t_a", _rows("a", [1, 2, 3, 4, 3, 4, 5], [1, 2, 30, 40, 3, 4, 5]))
    _write_trial(exp, "t_b", _rows("b", [1, 2, 3], [9, 9, 9]))
    df = load_results(str(exp))
    a = df[df["trial_id"] == "a"]
    assert a["training_iteration"].tolist() == [1, 2, 3, 4, 5]
    assert a["score"].tolist() == [1, 2, 3, 4, 5]  # the re-run values, not the abandoned ones
    assert df.loc[df["trial_id"] == "b", "config/x"].tolist() == ["b"] * 3


def test_load_results_names_a_damaged_copy_and_finds_trials_by_their_files_or_checkpoints(tmp_path):
    exp = tmp_path / "exp"
    _write_trial(exp, "t_a", _rows("a", [1, 2], [1, 2]))
    (exp / "t_a" / ".checkpoint_000001.damaged").mkdir()  # kept by tunekit resume
    (exp / "t_b" / "checkpoint_000000").mkdir(parents=True)  # a trial with a checkpoint and no rows yet
    (exp / "notes").mkdir()  # not a trial
    (exp / "notes" / "todo.txt").write_text("x")
    with pytest.warns(UserWarning, match="damaged"):
        df = load_results(str(exp))
    assert df["trial_id"].tolist() == ["a", "a"]
    assert any("t_a/.checkpoint_000001.damaged" in p for p in df.attrs["problems"])
    assert [t.name for t in read_experiment(str(exp), results=False).trials] == ["t_a", "t_b"]


def _kept_by_definition(trials, iterations):
    """The rows dedupe keeps, by its definition: a row stays unless a later row of its trial has an iteration
    at or below it; sorted by trial, then iteration, ties in logged order."""
    kept = [i for i, (t, it) in enumerate(zip(trials, iterations))
            if not any(trials[j] == t and iterations[j] <= it for j in range(i + 1, len(trials)))]
    return sorted(kept, key=lambda i: (trials[i], iterations[i], i))


@pytest.mark.parametrize("seed", range(40))
def test_dedupe_keeps_each_iteration_once_whether_the_rows_come_grouped_or_not(seed):
    import random

    import pyarrow as pa

    from tunekit.analysis._result_frames import by_trial, dedupe_order

    rng = random.Random(seed)
    logged = {}
    for trial in rng.sample("abcdef", rng.randint(1, 4)):
        its, it = [], 0
        for _ in range(rng.randint(1, 8)):  # runs on, or goes back to a checkpoint (re-runs) now and then
            it = it + 1 if rng.random() < 0.8 or it < 2 else rng.randint(1, it)
            its.append(it)
        logged[trial] = its
    if seed % 3 == 0:  # grouped, in the trials' order (a compacted dataset)
        rows = [(t, i) for t in sorted(logged) for i in logged[t]]
    elif seed % 3 == 1:  # grouped, in another order
        rows = [(t, i) for t in logged for i in logged[t]]
    else:  # interleaved, as trials running side by side log them (each trial's own order kept)
        rows, left = [], {t: list(its) for t, its in logged.items()}
        while left:
            t = rng.choice(sorted(left))
            rows.append((t, left[t].pop(0)))
            if not left[t]:
                del left[t]
    trials, its = [t for t, _ in rows], [i for _, i in rows]
    expected = _kept_by_definition(trials, its)
    assert dedupe_order(trials, its).tolist() == expected
    table = by_trial(pa.table({"trial_id": trials, "training_iteration": its, "row": list(range(len(rows)))}))
    assert table.column("trial_id").to_pylist() == sorted(trials)  # grouped by trial ...
    grouped = table.column("row").to_pylist()
    assert all(a < b for a, b in zip(grouped, grouped[1:]) if trials[a] == trials[b])  # ... in logged order
    kept = dedupe_order(table.column("trial_id"), table.column("training_iteration").to_pandas())
    assert [grouped[i] for i in kept] == expected  # and dedupe of the grouped table keeps the same rows


@pytest.mark.parametrize(
    "scope, mode, expected",
    [("last", "max", "b"), ("max", "max", "a"), ("min", "min", "a"), ("mean", "max", "b"), ("mean", "min", "a")],
)
def test_best_trial_over_each_scope(tmp_path, scope, mode, expected):
    exp = tmp_path / "exp"
    _write_trial(exp, "t_a", _rows("a", [1, 2, 3], [1.0, 5.0, 2.0]))
    _write_trial(exp, "t_b", _rows("b", [1, 2, 3], [3.0, 3.0, 3.0]))
    assert best_trial(str(exp), metric="score", mode=mode, scope=scope).trial_id == expected


@pytest.mark.parametrize("source", ["json", "parquet"])
def test_a_list_valued_hyperparameter_is_read_back_as_a_list(ray_session, storage, tmp_path, source):
    """``layers=[8, 8]`` is a value in every reader (pandas' missing-value test on a list used to raise)."""
    exp = tmp_path / "exp"
    if source == "json":
        for trial_id, layers, score in (("a", [8], 1.0), ("b", [8, 8], 2.0)):
            _write_trial(exp, f"t_{trial_id}", [{**row, "config": {"layers": layers}}
                                                for row in _rows(trial_id, [1, 2], [score, score])])
    else:
        def reporter(config):
            tune.report({"score": float(len(config["layers"]))})

        tune.Tuner(reporter, param_space={"layers": tune.grid_search([[8], [8, 8]])},
                   run_config=tune.RunConfig(name="exp", storage_path=str(tmp_path), callbacks=[ParquetLogger()],
                                             verbose=0)).fit()
    layers = [8, 8] if source == "json" else "[8, 8]"  # ParquetLogger keeps a list as its JSON text
    assert best_trial(str(exp), metric="score", mode="max").config == {"layers": layers}
    assert set(pbt_lineage(str(exp)).ancestry) == set(load_results(str(exp))["trial_id"])
    summary = write_report(str(exp), output=tmp_path / "report")
    assert "[8, 8]" in summary.html.read_text()
    export_tensorboard(str(exp), tmp_path / "tb")


A, B = "Flaky_0a0a0_00000_0_lr=0.1", "Flaky_0a0a0_00001_1_lr=0.2"  # Ray's trial directory names


@pytest.mark.parametrize("origin, lost", [(B, []), (A, [5, 6]), (None, [5, 6])])
def test_a_jump_after_a_restore_is_lost_unless_a_donor_checkpoint_explains_it(tmp_path, capsys, origin, lost):
    """Row 7 went on from a checkpoint of iteration 6 and no PBT log line says whose: the row's own
    ``tunekit/restored_from`` does. The other trial's (a donor's): nothing lost; its own (a retry): it ran
    5 and 6 and Ray lost those rows; not said: lost."""
    exp = tmp_path / "exp"
    rows = _rows("0a0a0_00000", [1, 2, 3, 4, 7, 8], [1.0] * 6)
    rows[4][RESTORED_FROM_KEY] = origin
    _write_trial(exp, A, rows)
    _write_trial(exp, B, _rows("0a0a0_00001", [1, 2, 3, 4, 5, 6, 7, 8], [2.0] * 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = load_results(str(exp))
    assert df.attrs.get("missing_iterations", {}) == ({"0a0a0_00000": lost} if lost else {})
    assert read_experiment(str(exp)).trials[0].missing_iterations == lost
    assert main(["status", str(exp)]) == 0
    assert ("note: 0a0a0_00000's result.json lacks iterations 5-6" in capsys.readouterr().out) == bool(lost)


def test_best_trial_errors_are_clear(tmp_path):
    exp = tmp_path / "exp"
    _write_trial(exp, "t_a", _rows("a", [1], [1.0]))
    with pytest.raises(ConfigError, match="no trial reported metric 'nope'; the trials reported: score"):
        best_trial(str(exp), metric="nope", mode="max")
    with pytest.raises(ConfigError, match="expected 'max' or 'min'"):
        best_trial(str(exp), metric="score", mode="best")
    with pytest.raises(ExperimentError, match="has no checkpoint"):
        best_checkpoint(str(exp), metric="score", mode="max")


def test_best_model_loads_for_inference(pbt_experiment):
    best = best_trial(str(pbt_experiment), metric="accuracy", mode="max", scope="max")
    model = load_best_model(str(pbt_experiment), digits_model(16), metric="accuracy", mode="max", scope="max")
    assert not model.training
    with torch.no_grad():
        accuracy = evaluate(model, torch.device("cpu"))["accuracy"]
    # The best trial's checkpoint with the best recorded accuracy is what got loaded.
    trial = next(t for t in read_experiment(str(pbt_experiment)).trials if t.trial_id == best.trial_id)
    recorded = max(c.metrics["accuracy"] for c in trial.checkpoints if "accuracy" in c.metrics)
    assert best.checkpoint == max(trial.checkpoints, key=lambda c: c.metrics.get("accuracy", -1)).uri
    assert accuracy == pytest.approx(recorded, abs=1e-6)


def test_pbt_lineage_matches_what_happened(pbt_experiment):
    df = load_results(str(pbt_experiment))
    lineage = pbt_lineage(str(pbt_experiment))
    exploits = lineage.exploits
    table = exploits.to_string() + "\n" + df[["trial_id", "training_iteration", "config/lr"]].to_string()
    assert len(exploits) >= 2 and set(exploits["iteration"]) <= {2, 4}, table
    names = {t.trial_id: t.name for t in read_experiment(str(pbt_experiment)).trials}
    for row in exploits.itertuples():
        assert row.target != row.source and row.source_iteration == row.iteration, table
        after = df[(df["trial_id"] == row.target) & (df["training_iteration"] == row.iteration + 1)]
        assert after["config/lr"].tolist() == pytest.approx([row.new_config["lr"]]), table  # mutated config ran on
        # the trial's own row says whose checkpoint it went on from (what explains its jump if Ray's log lacks it)
        assert after[RESTORED_FROM_KEY].tolist() == [names[row.source]], table
        before = df[(df["trial_id"] == row.target) & (df["training_iteration"] == row.iteration)]
        if not before.empty and row.Index == exploits[exploits["target"] == row.target].index[0]:
            assert before["config/lr"].tolist() == pytest.approx([row.old_config["lr"]]), table
    # every other restore was of the trial's own checkpoint (synchronous PBT pauses and resumes trials)
    exploited_rows = {(r.target, r.iteration + 1) for r in exploits.itertuples()}
    others = df[[(t, i) not in exploited_rows for t, i in zip(df["trial_id"], df["training_iteration"])]]
    origins = others[RESTORED_FROM_KEY]
    assert (origins.isna() | (origins == others["trial_id"].map(names))).all(), table
    for trial_id, segments in lineage.ancestry.items():
        covered = [i for _, first, last in segments for i in range(first, last + 1)]
        assert covered == list(range(1, STOP + 1)), (trial_id, segments, table)
    exploited = set(exploits["target"])
    assert all(len(lineage.ancestry[t]) >= 2 for t in exploited)


def test_report_writes_a_page_with_plots(pbt_experiment, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", str(pbt_experiment), "--output", str(out), "--metric", "accuracy", "--mode", "max"]) == 0
    page = (out / "index.html").read_text()
    best = read_experiment(str(pbt_experiment)).best_checkpoint("accuracy", "max")
    assert page.count("data:image/png;base64,") == 4  # curves, scatter, lineage, schedules
    for name in ("learning_curves", "hyperparameters", "lineage", "schedules"):
        data = (out / f"{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24])[0] > 300
    assert best.trial_id in page and "PBT exploits" in page and "tensorboard --logdir" in page
    assert all(t.trial_id in page for t in read_experiment(str(pbt_experiment)).trials)
    printed = capsys.readouterr().out
    # The report names what `tunekit status --metric accuracy --mode max` names.
    assert f"best trial for accuracy (max): {best.trial_id} accuracy={best.value:.4g}" in printed
    assert f"best checkpoint: {best.uri}" in printed and best.uri in page


def test_report_guesses_the_metric_and_refuses_non_experiments(ray_example_runs, tmp_path, capsys):
    summary = write_report(str(ray_example_runs["pbt_function.py"]), output=tmp_path / "r")
    assert (summary.metric, summary.mode) == ("mean_accuracy", "max")
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "no such experiment directory" in capsys.readouterr().err


def test_tensorboard_export_has_scalars_and_hparams(pbt_experiment, tmp_path):
    logdir = export_tensorboard(str(pbt_experiment), tmp_path / "tb")
    runs = sorted(p for p in logdir.iterdir() if p.is_dir())
    assert len(runs) == 4
    for run in runs:
        scalars, plugins = read_events(run)
        assert [step for step, _ in scalars["accuracy"]] == list(range(1, STOP + 1))
        assert "hparams" in plugins
        df = load_results(str(pbt_experiment))
        expected = df[df["trial_id"] == run.name]["accuracy"].tolist()
        assert [v for _, v in scalars["accuracy"]] == pytest.approx(expected, rel=1e-6)


def test_load_results_of_an_empty_experiment_is_empty(tmp_path):
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "experiment_state-2026.json").write_text('{"trial_data": []}')
    assert load_results(str(tmp_path / "exp")).empty
    assert isinstance(load_results(str(tmp_path / "exp")), pd.DataFrame)


def test_lineage_places_exploits_where_the_rows_show_them(tmp_path):
    """Synchronous Ray PBT once logged an exploit at the target's iteration 3 that happened after 4 (seen in CI)."""
    exp = tmp_path / "exp"
    lrs = {"a": [0.002, 0.002, 0.23, 0.23, 0.23], "b": [0.01, 0.01, 0.24, 0.24, 0.24],
           "c": [0.05] * 4 + [0.18], "d": [0.2] * 4 + [0.288]}
    for index, (trial, values) in enumerate(lrs.items()):
        rows = [{"trial_id": trial, "training_iteration": i + 1, "acc": 0.5, "config": {"lr": lr}}
                for i, lr in enumerate(values)]
        _write_trial(exp, f"T_{trial}0000_{index:05d}_{index}_lr={values[0]}", rows)
    logged = [("0", "3", 2, 2, 0.23), ("1", "3", 2, 2, 0.24), ("2", "0", 4, 4, 0.18), ("3", "1", 3, 3, 0.288)]
    (exp / "pbt_global.txt").write_text("".join(
        json.dumps([t, s, ti, si, {}, {"lr": lr}]) + "\n" for t, s, ti, si, lr in logged))
    exploits = pbt_lineage(str(exp)).exploits
    assert exploits[["target", "source", "iteration", "source_iteration"]].values.tolist() == [
        ["a", "d", 2, 2], ["b", "d", 2, 2], ["c", "a", 4, 4], ["d", "b", 4, 4]]


def test_lineage_takes_the_clones_first_row_when_ray_lost_the_rows_before_its_exploit(tmp_path):
    """Synchronous Ray PBT logged b cloning a with a's iteration 1 (a's result of iteration 2 not yet seen); b's
    rows before the exploit are gone (Ray's JSON logger copied an older result.json from storage over its own as b
    restored, seen in CI): b's first row left, iteration 3 at the new rate, shows the clone took iteration 2."""
    exp = tmp_path / "exp"
    _write_trial(exp, "T_a0000_00000_0", [{"trial_id": "a", "training_iteration": i, "acc": 0.5, "config": {"lr": 0.1}}
                                          for i in (1, 2, 3)])
    _write_trial(exp, "T_b0000_00001_1", [{"trial_id": "b", "training_iteration": 3, "acc": 0.5,
                                           "config": {"lr": 0.08}}])
    (exp / "pbt_global.txt").write_text(json.dumps(["1", "0", 2, 1, {"lr": 0.01}, {"lr": 0.08}]) + "\n")
    exploits = pbt_lineage(str(exp)).exploits
    assert exploits[["target", "source", "iteration", "source_iteration", "undone"]].values.tolist() == [
        ["b", "a", 2, 2, False]]
    # With b's rows whole, its first row at the new rate places the exploit as before.
    whole = tmp_path / "whole"
    _write_trial(whole, "T_a0000_00000_0", [{"trial_id": "a", "training_iteration": i, "acc": 0.5,
                                             "config": {"lr": 0.1}} for i in (1, 2, 3)])
    (whole / "pbt_global.txt").write_text((exp / "pbt_global.txt").read_text())
    _write_trial(whole, "T_b0000_00001_1", [{"trial_id": "b", "training_iteration": i, "acc": 0.5,
                                           "config": {"lr": lr}} for i, lr in ((1, 0.01), (2, 0.01), (3, 0.08))])
    assert pbt_lineage(str(whole)).exploits[["iteration", "source_iteration"]].values.tolist() == [[2, 2]]


def test_an_exploit_whose_clone_restored_its_own_checkpoint_is_undone_in_the_lineage(tmp_path, capsys):
    """Ray logged b cloning a at iteration 2, but a's checkpoint was gone when b restored, and b went on from
    its own checkpoint of iteration 2 (its row says so): b's weights are its own throughout, the new rate
    stands, and the report says the exploit was undone; a real clone of c by d in the same run counts."""
    exp = tmp_path / "exp"
    names = {t: f"T_{t}0000_{i:05d}_{i}" for i, t in enumerate("abcd")}
    lrs = {"a": [0.1] * 4, "b": [0.01, 0.01, 0.12, 0.12], "c": [0.2] * 4, "d": [0.02, 0.02, 0.24, 0.24]}
    origin = {("b", 3): names["b"], ("d", 3): names["c"]}
    for t, values in lrs.items():
        _write_trial(exp, names[t], [{"trial_id": t, "training_iteration": i + 1, "acc": 0.5, "config": {"lr": lr},
                                      **({RESTORED_FROM_KEY: origin[t, i + 1]} if (t, i + 1) in origin else {})}
                                     for i, lr in enumerate(values)])
    (exp / "pbt_global.txt").write_text(json.dumps(["1", "0", 2, 2, {}, {"lr": 0.12}]) + "\n" +
                                        json.dumps(["3", "2", 2, 2, {}, {"lr": 0.24}]) + "\n")
    lineage = pbt_lineage(str(exp))
    assert lineage.exploits[["target", "source", "undone"]].values.tolist() == [["b", "a", True], ["d", "c", False]]
    assert lineage.describe("b") == "b[1-4]" and lineage.describe("d") == "c[1-2] -> d[3-4]"
    assert main(["report", str(exp), "--output", str(tmp_path / "report"), "--metric", "acc", "--mode", "max"]) == 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert "a (undone: b restored its own checkpoint)" in page and "c (undone" not in page
    capsys.readouterr()


def test_rows_secured_in_the_journal_outlive_a_killed_driver_and_the_next_run_batches_them(tmp_path):
    exp = tmp_path / "exp"
    (exp / "t1").mkdir(parents=True)
    (exp / "t1" / "params.json").write_text("{}")
    trial = SimpleNamespace(trial_id="t1", path=str(exp / "t1"), checkpoint=None,
                            storage=SimpleNamespace(storage_filesystem=pafs.LocalFileSystem()))

    def report(logger, *iterations):
        for i in iterations:
            logger.on_trial_result(i, [trial], trial, {"training_iteration": i, "loss": 1.0 / i})

    killed = ParquetLogger()
    killed.setup()
    report(killed, 1, 2, 3)
    killed.on_checkpoint(3, [trial], trial, None)  # rows 1-3 secured: the trial will not run them again
    report(killed, 4)  # not secured: after the checkpoint, it runs again
    results = exp / "tunekit_results"
    assert not list(results.glob("*.parquet"))  # (no batch was due: the journal holds them)
    (journal,) = results.glob(".part-*-journal.jsonl")
    with open(journal, "a") as fh:
        fh.write('{"trial_id": "t1", "training_it')  # the driver killed inside a line
    # the driver is gone: what it secured reads back, the torn line skipped
    assert load_results(str(exp), source="parquet")["training_iteration"].tolist() == [1, 2, 3]

    resumed = ParquetLogger()
    resumed.setup()
    report(resumed, 4, 5)
    resumed.on_experiment_end([trial])
    names = sorted(p.name for p in results.iterdir())
    assert names == [f"{journal.name[1:-len('jsonl')]}parquet", names[1]] and names[1].endswith("-000000.parquet")
    assert pd.read_parquet(results)["training_iteration"].tolist() == [1, 2, 3, 4, 5]  # pyarrow's own reader
    assert load_results(str(exp), source="parquet")["training_iteration"].tolist() == [1, 2, 3, 4, 5]


def test_the_readers_hold_off_the_garbage_collector_only_while_they_read_and_leave_it_as_it_was():
    import gc

    from tunekit.storage._files import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # (load_results reads its structure through read_experiment: nested)
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ExperimentError):
        load_results("/nonexistent/experiment")  # an error inside the read
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a caller who turned it off keeps it off
    finally:
        gc.enable()
