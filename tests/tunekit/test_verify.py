"""`tunekit verify` on real experiments, local and on S3, and S3 runs end to end."""

from __future__ import annotations

import json
import posixpath

import pytest
from ray import tune

from tests.conftest import S3_SECRET
from tests.support.faults import delete_manifest, flip_byte
from tests.support.fit import fit
from tests.tunekit.outage import S3Outage
from tunekit import read_state, resolve_storage, verify_checkpoint, verify_experiment
from tunekit.cli import main
from tunekit.checkpoint._layout import find_trials
from tunekit.trainables import DigitsTrainable

CONFIG = {"hidden_size": 16, "batch_size": 32, "steps_per_iteration": 3, "checkpoint_every": 1}


def _fit(base: str, name: str, *, stop: int = 3, callbacks=(), max_failures: int = 0):
    return fit(DigitsTrainable, base, name, stop=stop, config={**CONFIG, "seed": tune.grid_search([1, 2])},
               callbacks=callbacks, max_failures=max_failures, errors_ok=True)


@pytest.fixture(params=["local", "s3"])
def base(request, storage) -> str:
    """What a user passes as ``storage_path``: a local path or an s3:// URI with options."""
    if request.param == "local":
        return str(storage)
    return request.getfixturevalue("s3_bucket").uri("runs")


def _experiment(base: str, name: str) -> str:
    head, sep, query = base.partition("?")
    return f"{head}/{name}" + (sep + query if sep else "")


def test_verify_reports_every_checkpoint_and_exit_codes(ray_session, base, capsys):
    grid = _fit(base, "exp")
    assert not grid.errors
    exp = _experiment(base, "exp")
    assert main(["verify", exp]) == 0
    out = capsys.readouterr().out
    assert sum(line.endswith("  good") for line in out.splitlines()) == 6
    assert "6 checkpoints in 2 trials: 6 good, 0 incomplete, 0 corrupt" in out

    storage = resolve_storage(exp)
    first, second = find_trials(storage)
    flip_byte(storage.filesystem, first.checkpoints[1].location.path)
    delete_manifest(storage.filesystem, second.checkpoints[0].location.path)
    full = [] if storage.is_local else ["--full"]  # (remote storage: sizes alone unless --full)
    if not storage.is_local:
        assert main(["verify", exp, "--json"]) == 1  # the missing manifest, found by sizes alone
        payload = json.loads(capsys.readouterr().out)
        assert payload["hashed"] is False
        assert payload["counts"] == {"good": 5, "incomplete": 1, "corrupt": 0, "unsupported": 0, "unverified": 0}
    assert main(["verify", exp, *full]) == 1
    lines = capsys.readouterr().out.splitlines()
    bad = [line for line in lines if "good" not in line.split()[-1:] and "checkpoint_" in line]
    assert any(first.name in l and "checkpoint_000001" in l and "corrupt: state.pt: XXH3-128 differs" in l for l in bad)
    assert any(second.name in l and "checkpoint_000000" in l and "incomplete: no manifest.json" in l for l in bad)
    # one checkpoint directory (a path or a URI) is checked alone: one line, the same exit codes
    for name, verdict, code in [("checkpoint_000001", "corrupt: state.pt: XXH3-128 differs", 1),
                                ("checkpoint_000002", "good", 0)]:
        one = _experiment(base, f"exp/{first.name}/{name}")
        assert main(["verify", one]) == code
        out = capsys.readouterr().out.splitlines()
        assert len(out) == 1 and out[0].startswith(f"{one}: {verdict}"), out

    assert main(["verify", exp, "--json", *full]) == 1
    payload = json.loads(capsys.readouterr().out)
    assert payload["counts"] == {"good": 4, "incomplete": 1, "corrupt": 1, "unsupported": 0, "unverified": 0}
    assert not payload["ok"] and {c["iteration"] for c in payload["checkpoints"]} == {1, 2, 3}

    # Results and checkpoints read back from the storage, through Ray and tunekit.
    restored = tune.Tuner.restore(exp, DigitsTrainable).get_results()
    for result in restored:
        assert result.metrics_dataframe["training_iteration"].tolist() == [1, 2, 3]
        assert read_state(result.checkpoint)["counters"]["iteration"] == 3


@pytest.mark.parametrize("make", ["missing", "empty", "files-only"])
def test_verify_refuses_what_is_not_an_experiment(make, storage, capsys):
    target = storage / "x"
    if make != "missing":
        target.mkdir()
    if make == "files-only":
        (target / "notes.txt").write_text("hello")
    assert main(["verify", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(target) in err
    assert ("no such experiment directory" if make == "missing" else "not a Ray Tune experiment") in err


def test_verify_of_one_checkpoint_directory_tunekit_did_not_write(storage, capsys):
    one = storage / "trial" / "checkpoint_000004"
    one.mkdir(parents=True)
    from tunekit.checkpoint._manifest import NOT_WRITTEN
    from tunekit.experiment.verify import FOREIGN

    assert main(["verify", str(one)]) == 1  # announced, never written: as an experiment's verify says
    assert capsys.readouterr().out.strip() == f"{one}: incomplete: {NOT_WRITTEN}"
    (one / "weights.txt").write_text("0")
    assert main(["verify", str(one), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"checkpoint": str(one), "ok": True, "status": "unverified",
                                                   "problems": [FOREIGN]}


def test_verify_missing_prefix_on_s3_is_not_an_experiment(s3_bucket, capsys):
    assert main(["verify", s3_bucket.uri("nothing", "here")]) == 2
    assert "no such experiment directory" in capsys.readouterr().err


def _plain_ray_trainable(config):
    import os
    import tempfile

    for i in range(2):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "weights.txt"), "w") as fh:
                fh.write(str(i))
            tune.report({"i": i}, checkpoint=tune.Checkpoint.from_directory(d))


def test_verify_marks_foreign_checkpoints_unverified(ray_session, storage, capsys):
    tune.Tuner(
        _plain_ray_trainable, run_config=tune.RunConfig(name="plain", storage_path=str(storage), verbose=0)
    ).fit()
    assert main(["verify", str(storage / "plain")]) == 0
    out = capsys.readouterr().out
    assert out.count("unverified: not a tunekit checkpoint") == 2 and "2 unverified" in out
    # every reader says the same of them: never "verified"
    assert main(["status", str(storage / "plain"), "--metric", "i", "--mode", "max"]) == 0
    out = capsys.readouterr().out
    assert "(unverified: not a tunekit checkpoint)" in out and "(verified)" not in out, out


def test_s3_outage_during_a_run_loses_nothing(ray_session, s3_bucket, storage):
    base = s3_bucket.uri("runs")
    outage = S3Outage(s3_bucket.server, at=3, seconds=4)
    grid = _fit(base, "outage", stop=8, callbacks=[outage], max_failures=2)
    assert outage.happened
    exp = _experiment(base, "outage")
    if grid.errors:  # stopped with a clear error: resume it once the server is back
        grid = tune.Tuner.restore(exp, DigitsTrainable, resume_errored=True).fit()
    assert not grid.errors
    reference = _fit(str(storage), "reference", stop=8)
    for result in grid:
        assert sorted(set(result.metrics_dataframe["training_iteration"])) == list(range(1, 9))
        twin = next(r for r in reference if r.config["seed"] == result.config["seed"])
        a, b = read_state(result.checkpoint), read_state(twin.checkpoint)
        assert all(a["models"]["model"][k].equal(v) for k, v in b["models"]["model"].items())
    # Every checkpoint Tune registered is whole. An upload cut by the outage may
    # leave a damaged directory behind: verify reports it, and Tune never uses it.
    registered = {posixpath.basename(c.path) + "@" + r.path for r in grid for c, _ in r.best_checkpoints}
    assert registered and all(verify_checkpoint(c).ok for r in grid for c, _ in r.best_checkpoints)
    trials = {t.name: t.location.path for t in find_trials(resolve_storage(exp))}
    for check in verify_experiment(exp).checks:
        if check.bad:
            assert f"{check.checkpoint}@{trials[check.trial]}" not in registered, check


def test_credentials_never_reach_storage_or_output(ray_session, s3_bucket, capfd):
    grid = _fit(s3_bucket.uri("runs"), "secret")
    assert not grid.errors
    assert main(["verify", _experiment(s3_bucket.uri("runs"), "secret")]) == 0
    for key in s3_bucket.keys():
        assert S3_SECRET.encode() not in s3_bucket.read(key), key
    out, err = capfd.readouterr()
    assert S3_SECRET not in out + err


def test_an_interrupted_s3_upload_is_named_interrupted_not_damage_and_gc_removes_it(ray_session, s3_bucket,
                                                                                     capsys):
    """What a node killed mid-upload leaves on S3 (remote uploads put the manifest, the commit mark, last): a
    checkpoint prefix with tunekit's files and no manifest, never registered by Ray. Every reader names it
    interrupted, none calls it damage or best; `gc --leftovers` removes it. A registered checkpoint that lost its
    manifest is still damage."""
    import pyarrow.fs as pafs

    grid = _fit(s3_bucket.uri("runs"), "cut", stop=2)
    assert not grid.errors
    exp = _experiment(s3_bucket.uri("runs"), "cut")
    storage = resolve_storage(exp)
    fs = storage.filesystem
    trial = find_trials(storage)[0]
    newest = max(trial.checkpoints, key=lambda c: c.name).location.path
    cut = posixpath.join(trial.location.path, "checkpoint_000009")
    for name in ("tunekit.json", "state.pt"):  # the payload arrived, the manifest did not
        fs.copy_file(posixpath.join(newest, name), posixpath.join(cut, name))

    assert main(["verify", exp]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "checkpoint_000009" in line)
    assert "interrupted: a write that never completed" in line and "1 interrupted" in out, out
    assert main(["status", exp, "--metric", "accuracy", "--mode", "max"]) == 0
    shown = capsys.readouterr().out
    assert "checkpoint_000009" not in shown.split("best checkpoint:")[-1].splitlines()[0] and "damage" not in shown
    assert main(["gc", exp, "--leftovers", "--yes"]) == 0
    capsys.readouterr()
    assert fs.get_file_info(cut).type == pafs.FileType.NotFound
    assert main(["verify", exp]) == 0

    delete_manifest(fs, newest)  # registered by Ray: its manifest lost is damage
    assert main(["verify", exp]) == 1
    assert "incomplete: no manifest.json" in capsys.readouterr().out


def test_a_save_to_s3_over_an_earlier_unregistered_attempt_commits_its_own_state(ray_session, s3_bucket):
    """A worker retrying into the index Ray never registered: the earlier attempt's manifest goes before the new
    payload is uploaded, the new manifest comes last; the checkpoint is the new state, whole."""
    from tunekit import _ray, read_metadata

    storage = _ray.storage_context(s3_bucket.uri("runs"), "exp", "trial", validate=True)
    first = DigitsTrainable(config={**CONFIG, "seed": 1}, storage=storage)
    try:
        first.train()
        earlier = first.save()  # an attempt at checkpoint_000000 its driver never registered
    finally:
        first.stop()
    assert posixpath.basename(earlier.checkpoint.path) == "checkpoint_000000"
    storage.current_checkpoint_index = -1  # what the retry's worker is handed: the same index again
    again = DigitsTrainable(config={**CONFIG, "seed": 2}, storage=storage)
    try:
        for _ in range(3):
            again.train()
        saved = again.save()
    finally:
        again.stop()
    assert saved.checkpoint.path == earlier.checkpoint.path
    assert verify_checkpoint(saved.checkpoint).ok
    assert read_metadata(saved.checkpoint)["iteration"] == 3


def test_a_function_trials_own_checkpoints_reach_s3_with_their_manifest_last(ray_session, s3_bucket, tmp_path):
    """``session.report(..., checkpoint=True)`` to S3: each checkpoint whole; the manifest an earlier attempt at
    the same index left is deleted before the upload starts and the new one written after it (an attempt cut
    short leaves no manifest, so nothing describes bytes it did not write)."""
    import pyarrow.fs as pafs

    from tunekit.trainables import TrainDigits
    from tunekit._ray.upload import _manifest_last

    grid = tune.Tuner(TrainDigits, param_space={**CONFIG, "seed": 1},
                      run_config=tune.RunConfig(name="fn", storage_path=s3_bucket.uri("runs"), verbose=0,
                                                stop={"training_iteration": 2})).fit()
    assert not grid.errors, grid.errors
    assert main(["verify", s3_bucket.uri("runs", "fn")]) == 0
    manifests = sorted(k for k in s3_bucket.keys() if k.endswith("/manifest.json"))
    assert [posixpath.basename(posixpath.dirname(k)) for k in manifests] == ["checkpoint_000000", "checkpoint_000001"]

    fs = resolve_storage(s3_bucket.uri("runs", "fn")).filesystem
    target = f"{s3_bucket.name}/{posixpath.dirname(manifests[-1])}"
    (tmp_path / "manifest.json").write_text("{}")
    seen = []

    def cut_short():  # an upload a kill interrupts
        seen.append(fs.get_file_info(f"{target}/manifest.json").type)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _manifest_last(fs, target, str(tmp_path), cut_short)
    assert seen == [pafs.FileType.NotFound]  # the earlier manifest gone before the upload began
    assert fs.get_file_info(f"{target}/manifest.json").type == pafs.FileType.NotFound  # and none written after
