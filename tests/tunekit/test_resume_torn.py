"""Ray's own files torn by a killed driver: `tunekit resume` still finishes every trial, bit-exact, from tunekit's record."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tunekit.kill_driver import OPTUNA_STOP, STOP, make_tuner
from tests.tunekit.test_resume import ROOT, _run_killed_driver
from tunekit import read_state
from tunekit.analysis import load_results
from tunekit.cli import main
from tunekit.experiment.record import RECORD_NAME, read_record, write_record
from tunekit.experiment.snapshot import read_experiment
from tunekit.storage import resolve_storage

KINDS = {"class": ("training", "none"), "function": ("function", "none-function")}


def _truncate(path: str) -> None:
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])


def _damage(exp: Path, how: str) -> None:
    if how == "search state emptied":  # as a kill inside Ray's copy of it to storage leaves it (seen)
        Path(max(glob.glob(str(exp / "basic-variant-state-*.json")))).write_bytes(b"")
        return
    if how == "tuner.pkl deleted":
        (exp / "tuner.pkl").unlink()
        return
    _truncate(str(exp / "tuner.pkl"))
    if how == "tuner.pkl and experiment state truncated":
        _truncate(max(glob.glob(str(exp / "experiment_state-*.json"))))


def _finished_like(after, reference) -> None:
    """Every trial ran to its stop and ended with the uninterrupted run's weights."""
    assert after.counts() == {"TERMINATED": len(reference)}
    for trial in after.trials:
        final = read_state(trial.checkpoints[-1].uri)
        assert final["counters"]["iteration"] == STOP
        for key, tensor in reference[trial.config["seed"]].items():
            assert final["models"]["model"][key].equal(tensor), f"{trial.trial_id}: {key} differs"


@pytest.fixture(scope="module")
def killed(ray_session, built_once):
    """Per trainable kind: the uninterrupted run's final weights by seed, and a driver killed at iteration 5 (run
    once for every test process; each test copies the experiment before damaging it)."""
    def build(where: Path) -> None:
        for kind, (point, reference_point) in KINDS.items():
            base = where / kind
            base.mkdir()
            grid = make_tuner(reference_point, str(base), "reference").fit()
            assert not grid.errors
            (base / "finals.json").write_text(json.dumps({r.config["seed"]: r.checkpoint.path for r in grid}))
            exp = _run_killed_driver(point, base, "exp")
            assert (exp / RECORD_NAME).is_file(), "tunekit's callbacks wrote no record"

    where = built_once("torn", build)
    out = {}
    for kind in KINDS:
        finals = json.loads((where / kind / "finals.json").read_text())
        out[kind] = (where / kind / "exp", {int(seed): read_state(path)["models"]["model"]
                                             for seed, path in finals.items()})
    return out


CASES = [(kind, how) for how in ["tuner.pkl truncated", "tuner.pkl deleted", "tuner.pkl and experiment state truncated"]
         for kind in sorted(KINDS)] + [("class", "search state emptied")]


@pytest.mark.parametrize("kind,how", CASES)
def test_resume_survives_torn_ray_files(killed, kind, how, tmp_path, capsys):
    source, reference = killed[kind]
    exp = tmp_path / "exp"
    shutil.copytree(source, exp)
    _damage(exp, how)
    if how == "search state emptied":
        assert main(["verify", str(exp)]) == 1
        assert "is damaged (empty): Ray would start the experiment over" in capsys.readouterr().out
    if how in ("tuner.pkl truncated", "tuner.pkl and experiment state truncated"):  # named, never unpickled
        assert main(["status", str(exp)]) == 2
        assert "tuner.pkl is damaged (torn after" in capsys.readouterr().out
        assert main(["verify", str(exp)]) == 1
        assert "`tunekit resume` can still continue the trials" in capsys.readouterr().out

    assert main(["resume", str(exp)]) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "not restored:" in line]
    assert len(said) == 1, out
    assert ("tuner.pkl is missing" if how == "tuner.pkl deleted" else "tuner.pkl is damaged") in said[0] or \
        "experiment_state" in said[0] or ("basic-variant-state-" in said[0] and "is damaged (" in said[0]), said[0]
    # (Ray would drop the restore of a torn search state and start the experiment over: never in place)
    into = exp if how.startswith("tuner.pkl") and "experiment state" not in how else tmp_path / "exp-resumed"
    assert f"into {into}" in out if into != exp else f"resumed {exp}:" in out

    _finished_like(read_experiment(str(into)), reference)
    rows = load_results(str(into))
    # Every row, except one the killed driver never wrote to result.json (its checkpoint made it): then
    # the trial goes on after that checkpoint and the readers name the gap instead of hiding it.
    lost = rows.attrs.get("missing_iterations", {})
    source_rows = load_results(str(source))
    for trial_id, iterations in rows.groupby("trial_id")["training_iteration"].apply(list).items():
        assert iterations == [i for i in range(1, STOP + 1) if i not in lost.get(trial_id, [])], (trial_id, lost)
        if lost.get(trial_id):
            mine = rows[rows["trial_id"] == trial_id]
            came_from = mine["inherited_from"].dropna().iloc[0] if "inherited_from" in mine else trial_id
            kept = source_rows[source_rows["trial_id"] == came_from]["training_iteration"].tolist()
            assert not set(lost[trial_id]) & set(kept), (trial_id, lost, kept)


def test_optuna_resume_after_a_torn_tuner_pickle_warns_of_the_lost_history(ray_session, storage, capsys):
    exp = _run_killed_driver("optuna", storage, "optuna")
    before = read_experiment(str(exp))
    started = {t.trial_id for t in before.trials}
    _truncate(str(exp / "tuner.pkl"))

    assert main(["resume", str(exp)]) == 0
    out = capsys.readouterr().out
    assert "the search algorithm's history (OptunaSearch)" in out
    assert "trials it had not suggested yet are not run" in out
    after = read_experiment(str(exp))
    assert {t.trial_id for t in after.trials} == started
    assert after.counts() == {"TERMINATED": len(started)}
    assert all(t.iterations == OPTUNA_STOP for t in after.trials)


def test_the_record_is_whole_json_whenever_its_writer_is_killed(tmp_path):
    """A process rewriting the record as fast as it can, SIGKILLed again and again: every read is a whole record."""
    exp = tmp_path / "exp"
    exp.mkdir()
    writer = (
        "import sys, itertools\n"
        "import pyarrow.fs as pafs\n"
        "from tunekit.experiment.record import FORMAT, write_record\n"
        "fs = pafs.LocalFileSystem()\n"
        "for n in itertools.count():\n"
        "    write_record(fs, sys.argv[1], {'format': FORMAT, 'n': n, 'trials': [{'trial_id': str(i), "
        "'config': {'x': 'y' * 200}} for i in range(200 + n % 50)]})\n"
        "    if n == int(sys.argv[2]): print('written', flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for attempt in range(12):
        # it says when it has written its attempt-th record and goes on rewriting; the kill lands wherever it is then
        proc = subprocess.Popen(
            [sys.executable, "-c", writer, str(exp), str(attempt)], stdout=subprocess.PIPE, text=True, env=env
        )
        assert proc.stdout.readline().strip() == "written"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        record, problem = read_record(resolve_storage(str(exp)).filesystem, str(exp))
        assert problem is None and record is not None, problem
        assert record["n"] >= attempt  # a whole record, never one older than what it said it had written
        assert json.loads((exp / RECORD_NAME).read_text())["trials"]
    # a write after all that replaces it whole, and the temporary files of the killed writers are no record
    write_record(resolve_storage(str(exp)).filesystem, str(exp), {"format": "tunekit-experiment", "trials": []})
    assert read_record(resolve_storage(str(exp)).filesystem, str(exp))[0] == {"format": "tunekit-experiment",
                                                                             "trials": []}


def test_a_torn_newest_experiment_state_is_set_aside_for_the_newest_whole_one(killed, tmp_path, capsys):
    source, reference = killed["class"]
    exp = tmp_path / "exp"
    shutil.copytree(source, exp)
    whole = Path(max(glob.glob(str(exp / "experiment_state-*.json")))).name
    torn = "experiment_state-2999-01-01_00-00-00.json"
    (exp / torn).write_bytes((exp / whole).read_bytes()[:100])

    assert main(["status", str(exp)]) == 2
    assert f"read {whole}, the newest one that is whole" in capsys.readouterr().out
    assert main(["resume", str(exp)]) == 0
    out = capsys.readouterr().out
    assert f"{torn} damaged (kept as {torn}.damaged): Ray resumes from {whole}" in out
    assert (exp / f"{torn}.damaged").read_bytes() == (exp / whole).read_bytes()[:100]  # kept as it was
    _finished_like(read_experiment(str(exp)), reference)


def test_a_torn_tuner_pickle_on_s3_is_rebuilt_and_the_trials_finish(killed, s3_bucket, capsys):
    import pyarrow.fs as pafs

    source, reference = killed["class"]
    exp = resolve_storage(s3_bucket.uri("exp"))
    pafs.copy_files(str(source), exp.path, destination_filesystem=exp.filesystem)
    with exp.filesystem.open_input_stream(exp.join("tuner.pkl").path) as stream:
        data = stream.read()
    with exp.filesystem.open_output_stream(exp.join("tuner.pkl").path) as stream:
        stream.write(data[: len(data) // 2])

    assert main(["resume", exp.uri]) == 0
    out = capsys.readouterr().out
    assert "tuner.pkl is damaged (torn after" in out and "(kept as tuner.pkl.damaged)" in out, out
    kept = exp.filesystem.get_file_info(exp.join("tuner.pkl.damaged").path)
    assert kept.size == len(data) // 2
    _finished_like(read_experiment(exp.uri), reference)


def test_gc_keeps_what_resume_needs(killed, tmp_path, capsys):
    """`tunekit gc --trial-latest 0` on an interrupted experiment keeps each unfinished trial's newest good checkpoint."""
    source, reference = killed["function"]
    exp = tmp_path / "exp"
    shutil.copytree(source, exp)
    assert main(["gc", str(exp), "--trial-latest", "0", "--yes"]) == 0
    capsys.readouterr()
    assert all(len(t.checkpoints) == 1 for t in read_experiment(str(exp)).trials if t.checkpoints)
    assert main(["resume", str(exp)]) == 0
    capsys.readouterr()
    _finished_like(read_experiment(str(exp)), reference)


def test_the_record_follows_each_trial_and_encodes_only_what_changed(tmp_path):
    """The record of a sweep is rewritten every second: each trial's entry is encoded again only when it
    changed, and an ended trial's only when its checkpoint did (KeepCheckpoints forgets deleted ones)."""
    from ray import tune
    from ray.train._internal.checkpoint_manager import _TrainingResult
    from ray.tune.experiment import Trial

    from tunekit import _ray
    from tunekit.experiment.record import ExperimentRecorder

    storage = _ray.storage_context(str(tmp_path), "exp", "trial")
    trials = [Trial("__fake", config={"i": i, "name": 'a "quoted" \0 value'}, stub=True, storage=storage)
              for i in range(3)]
    recorder = ExperimentRecorder(trials)
    recorder.info["stop"] = {"note": "\0trials"}  # (the slot the entries go into, in a value before them)
    first = json.loads(recorder.text())
    assert [t["config"]["i"] for t in first["trials"]] == [0, 1, 2]
    assert first["stop"] == {"note": "\0trials"} and first["version"] == 1

    def entry(k):
        return json.loads(recorder.text())["trials"][k]

    ended = trials[0]
    ended.set_status(Trial.TERMINATED)
    checkpoint = tune.Checkpoint(f"{ended.path}/checkpoint_000001")
    ended.run_metadata.checkpoint_manager.register_checkpoint(
        _TrainingResult(checkpoint=checkpoint, metrics={"training_iteration": 2}))
    assert entry(0)["status"] == "TERMINATED" and entry(0)["checkpoint"] == "trial/checkpoint_000001"
    _ray.forget_checkpoints(ended, {checkpoint.path})  # deleted while the run goes on
    assert entry(0)["checkpoint"] is None
    trials[1].set_status(Trial.RUNNING)
    assert entry(1)["status"] == "RUNNING" and entry(2)["status"] == "PENDING"
    recorder.interrupted = [trials[1].trial_id]  # (the run's end: every entry checked again)
    assert json.loads(recorder.text(recheck=True))["trials"][1]["status"] == "INTERRUPTED"


def test_the_record_is_written_less_often_where_its_text_costs_more(tmp_path, monkeypatch):
    """A sweep of thousands of trials: the record's text is O(trials); it is rebuilt at most once a second and
    less often where building it took more than 0.5% of that (up to every MAX_INTERVAL_S); the run's end writes it anyway."""
    import types

    import pyarrow.fs as pafs
    from ray.tune.experiment import Trial

    from tunekit import _ray

    from tunekit.experiment import record

    clock = [1000.0]
    monkeypatch.setattr(record, "time", types.SimpleNamespace(monotonic=lambda: clock[0], time=record.time.time))
    storage = _ray.storage_context(str(tmp_path), "exp", "trial")
    trials = [Trial("__fake", config={"i": i}, stub=True, storage=storage) for i in range(3)]
    recorder = record.ExperimentRecorder(trials)
    cost = [0.02]  # what building the text takes, on the record's clock
    built = recorder.text

    def text(**kwargs):
        clock[0] += cost[0]
        return built(**kwargs)

    recorder.text = text

    def written(after: float, status: str) -> bool:
        """Whether a flush ``after`` seconds on writes a record in which trial 1 is ``status``."""
        clock[0] += after
        recorder.flush()
        if recorder._writing is not None:
            recorder._writing.result()
        found, _ = read_record(pafs.LocalFileSystem(), os.path.dirname(trials[0].path))
        return found is not None and found["trials"][1]["status"] == status

    assert written(0, "PENDING")
    trials[1].set_status(Trial.RUNNING)
    assert not written(2.0, "RUNNING")  # 0.02 s to build: not again for 4 s
    assert written(2.1, "RUNNING")
    cost[0] = 1.0  # (200 s by the share: capped)
    trials[1].set_status(Trial.PAUSED)
    assert written(5.0, "PAUSED")  # (built as before, taking 1 s this time)
    cost[0] = 0.0
    trials[1].set_status(Trial.RUNNING)
    assert not written(record.MAX_INTERVAL_S - 1.5, "RUNNING")  # (the last build took 1 s: the cap since it began)
    assert written(1.1, "RUNNING")  # cheap again: once a second
    trials[1].set_status(Trial.TERMINATED)
    assert not written(0.5, "TERMINATED")
    recorder.flush(force=True)  # the run's end
    assert written(0, "TERMINATED")
