"""The readers' index of a local experiment (`EXP/.tunekit-index.json`): unchanged trials are taken from it, and
whatever one listing shows changed since (or an index that is damaged, stale or another path's) is read from the
files, so every reader says what a read from scratch says."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tunekit.cli import main
from tunekit.experiment._index import INDEX_NAME, ExperimentIndex
from tunekit.experiment.snapshot import read_experiment
from tunekit.storage._location import resolve_storage


def _not_read(name: str):
    def build():
        raise AssertionError(f"{name} was read from its files, not from the index")
    return build


def _trial_dirs(exp: Path) -> list[Path]:
    return sorted(p for p in exp.iterdir() if p.is_dir() and (p / "result.json").exists())


def _read(exp: Path) -> tuple[dict, dict, list[str], list[list], list[list[dict]]]:
    """What every reader answers from: the experiment's structure (as `load_results` reads it: Ray's experiment
    state from the index where it holds it), the snapshot as data, its damage, each checkpoint's manifest sizes,
    each trial's rows."""
    structure = read_experiment(str(exp), results=False).as_dict()
    snap = read_experiment(str(exp))
    return (structure, snap.as_dict(), snap.problems, [[c.manifest for c in t.checkpoints] for t in snap.trials],
            [t.results for t in snap.trials])


def _from_scratch(exp: Path) -> tuple[dict, dict, list[str], list[list], list[list[dict]]]:
    (exp / INDEX_NAME).unlink(missing_ok=True)
    return _read(exp)


@pytest.fixture
def experiment(quickstart_experiment, tmp_path) -> Path:
    exp = tmp_path / "qs"
    shutil.copytree(quickstart_experiment, exp)
    return exp


def test_a_read_takes_unchanged_trials_from_the_index_and_reads_a_changed_one_again(experiment):
    before = _read(experiment)
    assert (experiment / INDEX_NAME).is_file()
    trials = _trial_dirs(experiment)
    index = ExperimentIndex(resolve_storage(str(experiment)))
    for trial in trials:
        index.trial(trial.name, _not_read(trial.name))
    assert index.cached("\0state", index.root_stamp(
        [f for f in index.top()[1] if f.startswith("experiment_state")]), _not_read("the experiment state"))

    changed = trials[0]
    rows = [json.loads(line) for line in (changed / "result.json").read_text().splitlines()]
    extra = {**rows[-1], "training_iteration": rows[-1]["training_iteration"] + 1, "loss": 0.125}
    with open(changed / "result.json", "a") as out:
        out.write(json.dumps(extra) + "\n")
    index = ExperimentIndex(resolve_storage(str(experiment)))
    for trial in trials[1:]:
        index.trial(trial.name, _not_read(trial.name))
    with pytest.raises(AssertionError, match="read from its files"):
        index.trial(changed.name, _not_read(changed.name))

    after = _read(experiment)
    trial = next(t for t in after[1]["trials"] if t["name"] == changed.name)
    assert trial["last_result"]["loss"] == 0.125 and after != before
    assert after == _from_scratch(experiment)


def test_the_rows_of_unchanged_trials_come_from_the_index_when_asked_for(experiment):
    expected = {t.name: t.results for t in read_experiment(str(experiment)).trials}
    index = ExperimentIndex(resolve_storage(str(experiment)))
    for name, rows in expected.items():
        summary = index.trial(name, _not_read(name))
        assert "rows" not in summary  # (status parses no rows)
        assert json.loads(index.trial_rows(name, summary, _not_read(f"{name}'s rows"))) == rows


def _truncate_index(exp: Path) -> None:
    data = (exp / INDEX_NAME).read_bytes()
    (exp / INDEX_NAME).write_bytes(data[: len(data) // 2])


def _cut_the_index_in_its_rows(exp: Path) -> None:
    """The index cut inside its last line (the trials' rows): the summaries before it read whole."""
    data = (exp / INDEX_NAME).read_bytes()
    start = data.index(b"\n", data.index(b"\n") + 1)
    (exp / INDEX_NAME).write_bytes(data[: start + (len(data) - start) // 2])


def _drop_a_trials_rows_from_the_index(exp: Path) -> None:
    """The index's rows line, valid JSON, lacking a trial's rows: that trial's rows are read from its files."""
    head, middle, rows = (exp / INDEX_NAME).read_bytes().split(b"\n")
    kept = json.loads(rows)
    kept.pop(sorted(kept)[0])
    (exp / INDEX_NAME).write_bytes(b"\n".join([head, middle, json.dumps(kept).encode()]))


def _resume_after_the_index(exp: Path) -> None:
    """What a resume does to a trial after the index was written (rows appended, its newest checkpoint gone, a
    new one written), with the index from before put back."""
    kept = (exp / INDEX_NAME).read_bytes()
    trial = _trial_dirs(exp)[-1]
    rows = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
    with open(trial / "result.json", "a") as out:
        out.write(json.dumps({**rows[-1], "training_iteration": rows[-1]["training_iteration"] + 1}) + "\n")
    checkpoints = sorted(trial.glob("checkpoint_*"))
    shutil.copytree(checkpoints[-1], trial / "checkpoint_000099")
    shutil.rmtree(checkpoints[-1])
    (exp / INDEX_NAME).write_bytes(kept)


def _rewrite_rays_state(exp: Path) -> None:
    """Ray's experiment state rewritten after the index was (every trial now PAUSED)."""
    state = sorted(exp.glob("experiment_state-*.json"))[-1]
    state.write_text(state.read_text().replace("TERMINATED", "PAUSED"))


def _delete_a_checkpoint(exp: Path) -> None:
    shutil.rmtree(sorted(_trial_dirs(exp)[0].glob("checkpoint_*"))[0])


def _cut_a_checkpoint_file(exp: Path) -> None:
    """A checkpoint's payload cut short in place, its time kept: only its size tells."""
    payload = next(p for p in sorted(_trial_dirs(exp)[0].glob("checkpoint_*/*"))
                   if p.name not in ("tunekit.json", "manifest.json"))
    stat = payload.stat()
    payload.write_bytes(payload.read_bytes()[: stat.st_size // 2])
    os.utime(payload, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.mark.parametrize("change", [_truncate_index, _cut_the_index_in_its_rows, _drop_a_trials_rows_from_the_index,
                                    _resume_after_the_index, _rewrite_rays_state,
                                    _delete_a_checkpoint, _cut_a_checkpoint_file], ids=lambda f: f.__name__.strip("_"))
def test_a_damaged_or_stale_index_is_never_trusted(experiment, change, capsys):
    assert main(["status", str(experiment)]) == 0
    capsys.readouterr()
    change(experiment)
    through_index = _read(experiment)
    code = main(["status", str(experiment)])
    shown = capsys.readouterr()
    assert through_index == _from_scratch(experiment)
    (experiment / INDEX_NAME).unlink()
    assert main(["status", str(experiment)]) == code
    assert capsys.readouterr() == shown
    if change is _cut_a_checkpoint_file:
        assert code == 2 and "corrupt" in shown.err
    if change is _rewrite_rays_state:
        assert {t["status"] for t in through_index[0]["trials"]} == {"PAUSED"} == {
            t["status"] for t in through_index[1]["trials"]}


def test_an_index_moved_with_its_experiment_is_not_trusted(experiment, tmp_path, capsys):
    """A copy that keeps every file's time (`cp -a`, `rsync -a`) carries an index naming the old path: the new
    path's damage is named with the new path."""
    _cut_a_checkpoint_file(experiment)
    assert main(["status", str(experiment)]) == 2
    moved = tmp_path / "moved"
    shutil.copytree(experiment, moved)  # (copy2: times kept)
    assert main(["status", str(moved)]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert str(moved) in err and str(experiment) + "/" not in err


def test_a_ray_only_experiment_is_indexed_and_read_again_where_it_changed(ray_example_runs, tmp_path, capsys):
    exp = tmp_path / "pbt"
    shutil.copytree(ray_example_runs["pbt_function.py"], exp)
    assert main(["status", str(exp), "--metric", "mean_accuracy", "--mode", "max"]) == 0
    first = capsys.readouterr().out
    assert (exp / INDEX_NAME).is_file()
    assert main(["status", str(exp), "--metric", "mean_accuracy", "--mode", "max"]) == 0
    assert capsys.readouterr().out == first
    _delete_a_checkpoint(exp)
    assert _read(exp) == _from_scratch(exp)
