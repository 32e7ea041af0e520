"""kill -9 of a real driver at several points, then `tunekit resume`: nothing lost, nothing twice."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.support.faults import flip_byte
from tunekit.testing import run_and_reap
from tests.tunekit.kill_driver import OPTUNA_STOP, OPTUNA_TRIALS, STOP, make_tuner
from tunekit import read_state, resolve_storage
from tunekit.checkpoint import verify_checkpoint
from tunekit.analysis import load_results
from tunekit.cli import main
from tunekit.checkpoint._layout import root_files
from tunekit.experiment._pickles import driver_state_problem
from tunekit.experiment.snapshot import read_experiment

ROOT = Path(__file__).resolve().parents[2]


def _run_killed_driver(point: str, storage: Path, name: str) -> Path:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    proc = run_and_reap(
        [sys.executable, "-m", "tests.tunekit.kill_driver", point, str(storage), name],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout[-3000:] + proc.stderr[-3000:]
    return storage / name


@pytest.fixture(scope="module")
def reference(ray_session, built_once):
    """The same experiment, uninterrupted (run once for every test process): final state of each trial by seed."""
    def build(where: Path) -> None:
        grid = make_tuner("none", str(where), "reference").fit()
        assert not grid.errors
        finals = {r.config["seed"]: r.checkpoint.path for r in grid}
        (where / "finals.json").write_text(json.dumps(finals))

    finals = json.loads((built_once("resume-reference", build) / "finals.json").read_text())
    return {int(seed): read_state(path) for seed, path in finals.items()}


@pytest.mark.parametrize("point", ["training", "checkpoint", "snapshot", "stale"])
def test_resume_after_kill_completes_every_trial_exactly(point, reference, storage, capsys, caplog):
    caplog.set_level(logging.INFO)
    exp = _run_killed_driver(point, storage, "exp")
    before = read_experiment(str(exp))
    assert not all(t.status == "TERMINATED" for t in before.trials), "the driver was not interrupted"
    # what the killed driver's ParquetLogger secured (at each checkpoint: in its journal) reads back whole
    secured = load_results(str(exp), source="parquet")
    assert not secured.empty
    for trial, its in secured.groupby("trial_id")["training_iteration"].apply(list).items():
        assert its == list(range(1, len(its) + 1)), (trial, its)

    assert main(["resume", str(exp)]) == 0
    out = capsys.readouterr().out
    assert "trainable: tunekit.trainables.class_api:DigitsTrainable (recorded in its checkpoints)" in out
    assert "now 2 TERMINATED" in out
    if point == "stale":  # Ray's index named checkpoints num_to_keep had deleted: left out, not deleted again
        assert "checkpoint(s) deleted after it was written" in caplog.text

    after = read_experiment(str(exp))
    assert after.counts() == {"TERMINATED": 2}
    for trial in after.trials:
        # Ray's result.json may lose the rows its killed driver had not flushed (load decides which): each
        # iteration once at most, through to the end, and whatever it lacks named by the read model.
        its = [r["training_iteration"] for r in trial.results]
        assert its == sorted(set(its)) and its[-1] == STOP, its
        assert trial.missing_iterations == sorted(set(range(1, STOP + 1)) - set(its)), (its, trial.missing_iterations)
        final = read_state(trial.checkpoints[-1].uri)
        assert final["counters"]["iteration"] == STOP
        expected = reference[trial.config["seed"]]
        for key, tensor in expected["models"]["model"].items():
            assert final["models"]["model"][key].equal(tensor), f"{trial.trial_id}: {key} differs"
    assert main(["verify", str(exp)]) == 0
    # The Parquet log of the killed and the resumed driver: every iteration exactly once.
    logged = load_results(str(exp), source="parquet")
    assert logged.groupby("trial_id")["training_iteration"].apply(list).tolist() == [list(range(1, STOP + 1))] * 2
    raw = pq.read_table(exp / "tunekit_results").to_pandas()  # before deduplication: nothing lost
    assert all(set(its) == set(range(1, STOP + 1)) for its in raw.groupby("trial_id")["training_iteration"].apply(set))


def test_optuna_search_resumes_with_its_state(ray_session, storage, capsys):
    exp = _run_killed_driver("optuna", storage, "optuna")
    before = read_experiment(str(exp))
    assert 2 <= len(before.trials) < OPTUNA_TRIALS + 1
    assert main(["resume", str(exp)]) == 0
    capsys.readouterr()
    after = read_experiment(str(exp))
    assert len(after.trials) == OPTUNA_TRIALS and after.counts() == {"TERMINATED": OPTUNA_TRIALS}
    suggestions = [(t.config["lr"], t.config["momentum"]) for t in after.trials]
    assert len(set(suggestions)) == OPTUNA_TRIALS, "a suggestion was repeated"
    kept = {t.trial_id: (t.config["lr"], t.config["momentum"]) for t in before.trials}
    assert all(dict((t.trial_id, s) for t, s in zip(after.trials, suggestions)).get(k) == v for k, v in kept.items())
    for trial in after.trials:
        assert [r["training_iteration"] for r in trial.results] == list(range(1, OPTUNA_STOP + 1))


def test_resume_needs_a_trainable_it_can_find(tmp_path, capsys):
    exp = tmp_path / "exp"
    trial = exp / "f_00000_0"
    trial.mkdir(parents=True)
    (exp / "experiment_state-2026-01-01_00-00-00.json").write_text(
        '{"trial_data": [["{\\"trial_id\\": \\"00000\\", \\"trainable_name\\": \\"f\\", \\"relative_logdir\\": \\"f_00000_0\\", \\"status\\": \\"RUNNING\\"}", "{}"]], "stats": {}}'
    )
    (trial / "params.json").write_text("{}")
    assert main(["resume", str(exp)]) == 2
    err = capsys.readouterr().err
    assert "cannot tell which trainable ran" in err and "pass --trainable module:attr" in err
    assert main(["resume", str(exp), "--trainable", "no_such_module:Thing"]) == 2
    assert "cannot import no_such_module" in capsys.readouterr().err
    assert main(["resume", str(exp), "--resume-errored", "--restart-errored"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def _one_trial_experiment(exp: Path, status: str = "RUNNING", trainable: str | None = None) -> Path:
    """An experiment directory of one trial ``f`` (Ray's state; a tunekit checkpoint recording ``trainable``)."""
    import torch

    from tunekit import write_checkpoint

    trial = exp / "f_00000_0"
    trial.mkdir(parents=True)
    (exp / "experiment_state-2026-01-01_00-00-00.json").write_text(
        '{"trial_data": [["{\\"trial_id\\": \\"00000\\", \\"trainable_name\\": \\"f\\", \\"relative_logdir\\": '
        f'\\"f_00000_0\\", \\"status\\": \\"{status}\\"}}", "{{}}"]], "stats": {{}}}}'
    )
    (trial / "params.json").write_text("{}")
    if trainable:
        write_checkpoint(trial / "checkpoint_000000", {"w": torch.zeros(1)},
                         metadata={"trainable": trainable, "iteration": 1})
    return exp


def test_resume_finds_the_users_trainable_in_the_project_directory(tmp_path, monkeypatch):
    """`cd project && tunekit resume EXP`: the trainable its checkpoints record is imported from there, as
    `tunekit check` imports it; one it cannot import is named with the import error."""
    from tunekit.commands._find_trainable import find_trainable
    from tunekit.errors import ConfigError

    project = tmp_path / "project"
    project.mkdir()
    (project / "mytrainables_for_resume.py").write_text(
        "from tunekit.trainables import DigitsTrainable\n\nclass Mine(DigitsTrainable):\n    pass\n")
    exp = _one_trial_experiment(tmp_path / "exp", trainable="mytrainables_for_resume:Mine")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(project))])
    monkeypatch.chdir(project)
    found, where = find_trainable(resolve_storage(str(exp)), read_experiment(str(exp)))
    assert found.__name__ == "Mine" and where == "mytrainables_for_resume:Mine (recorded in its checkpoints)"

    monkeypatch.chdir(tmp_path)
    sys.modules.pop("mytrainables_for_resume", None)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(project)])
    with pytest.raises(ConfigError) as raised:
        find_trainable(resolve_storage(str(exp)), read_experiment(str(exp)))
    said = str(raised.value)
    assert "\n" not in said and "mytrainables_for_resume:Mine (recorded in its checkpoints): cannot import " \
        "mytrainables_for_resume (No module named 'mytrainables_for_resume')" in said and "--trainable" in said


_HOLDER = """
import sys
from tunekit.experiment._lease import experiment_lease
from tunekit.storage import resolve_storage
with experiment_lease(resolve_storage(sys.argv[1]), "resume"):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_two_resumes_at_once_the_second_refuses_naming_the_first(tmp_path, capsys):
    """A resume holding the experiment's lease (a real process): a second is refused in one line naming it and
    changes nothing; once the first is gone (killed: its lease left behind), a resume takes the lease over."""
    exp = _one_trial_experiment(tmp_path / "exp", status="TERMINATED")
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(exp)], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        listing = sorted((str(p.relative_to(exp)), p.read_bytes() if p.is_file() else b"") for p in exp.rglob("*"))
        assert main(["resume", str(exp)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert f"is in use: tunekit resume (pid {holder.pid} on this machine) took it" in err, err
        assert sorted((str(p.relative_to(exp)), p.read_bytes() if p.is_file() else b"")
                      for p in exp.rglob("*")) == listing
    finally:
        holder.kill()
        holder.wait()
    assert (exp / ".tunekit-lease.json").exists()  # killed: its lease stays, naming a dead process
    assert main(["resume", str(exp)]) == 0
    assert "nothing to resume" in capsys.readouterr().out
    assert not (exp / ".tunekit-lease.json").exists()


def test_trainables_recorded_under_the_old_top_level_names_are_found(tmp_path):
    """Experiments of tunekit before 0.2 recorded `trainables.class_api:DigitsTrainable`."""
    code = (
        "from tunekit.commands.resume import import_trainable\n"
        "from tunekit.trainables import DigitsTrainable, train_digits\n"
        "assert import_trainable('trainables.class_api:DigitsTrainable') is DigitsTrainable\n"
        "assert import_trainable('trainables.function_api:train_digits') is train_digits\n"
        "import_trainable('nothing_like_it:X')\n"
    )
    # A fresh interpreter away from the checkout: no top-level `trainables` exists there.
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "ConfigError: trainable 'nothing_like_it:X': cannot import nothing_like_it" in done.stderr


def test_extend_continues_a_finished_experiment_with_every_iteration_once(ray_session, storage, capsys):
    from ray import tune

    from tunekit.trainables import DigitsTrainable

    config = {"hidden_size": 8, "steps_per_iteration": 3, "seed": 5}
    tune.Tuner(DigitsTrainable, param_space=config, run_config=tune.RunConfig(
        name="short", storage_path=str(storage), stop={"training_iteration": 2},
        checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True), verbose=0)).fit()
    exp = storage / "short"

    assert main(["resume", str(exp), "--extend", "2"]) == 2  # nothing to extend to
    assert "has a checkpoint at iteration 2 already" in capsys.readouterr().err

    assert main(["resume", str(exp), "--extend", "4"]) == 0
    out = capsys.readouterr().out
    extended = storage / "short-to-4"
    assert f"extending {exp}: 1 trials to iteration 4, into {extended}" in out
    assert "was warm-started from" in out and "continuing its complete state" in out
    df = load_results(str(extended))
    assert list(df["training_iteration"]) == [1, 2, 3, 4]
    assert df["inherited_from"].notna().tolist() == [True, True, False, False]
    assert read_experiment(str(exp)).trials[0].iterations == 2  # the original is unchanged
    (trial,) = read_experiment(str(extended)).trials
    assert read_state(trial.checkpoints[-1].uri)["counters"]["iteration"] == 4


@pytest.fixture
def other_ray():
    """Somebody else's Ray on this machine (`ray start --head`), which a bare ray.init() would join.

    Yields its session directory: every driver that connects to it leaves a
    ``python-core-driver-*.log`` in its ``logs``.
    """
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    ray_bin = Path(sys.executable).parent / "ray"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [str(ray_bin), "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
         "--disable-usage-stats", "--block"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "Ray runtime started" in line:
            break
    else:
        pytest.fail("ray start --head did not start:\n" + "".join(lines[-30:]))
    # (its own session: the one whose GCS listens on its port; another Ray may have started since)
    ray_dir = Path(os.environ["RAY_TMPDIR"]) / "ray"  # (the test process's own: tests/conftest.py)
    session = next(s for s in ray_dir.glob("session_2*")
                   if any(f.read_text().strip() == str(port) for f in s.glob("gcs_server_port_*")))
    try:
        yield session
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
        # `ray start` leaves its address for bare ray.init() calls to find; later tests must not.
        current = ray_dir / "ray_current_cluster"
        if current.exists() and current.read_text().strip().endswith(f":{port}"):
            current.unlink()


def _drivers(session: Path) -> list[str]:
    return sorted(p.name for p in (session / "logs").iterdir() if p.name.startswith("python-core-driver"))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_resume_of_a_killed_quickstart_needs_no_trainable_and_keeps_damaged_checkpoints(where, storage, request):
    """`tunekit resume EXP` as a new user types it: its own local Ray, the trainable found, damage said and kept."""
    if where == "local":
        other = request.getfixturevalue("other_ray")
        base = str(storage)
    else:
        other = None
        base = request.getfixturevalue("s3_bucket").uri()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    proc = run_and_reap([sys.executable, "-m", "tests.tunekit.kill_driver", "quickstart", base, "qs"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stdout[-3000:] + proc.stderr[-3000:]
    exp = resolve_storage(base).join("qs")
    before = read_experiment(exp.uri)
    assert not all(t.status == "TERMINATED" for t in before.trials)
    # (a kill during an upload leaves a checkpoint without its metadata, iteration None, or with it and
    # without its state.pt (seen on S3): only checkpoints that verify are candidates)
    whole_of = {t.name: [c for c in t.checkpoints if c.iteration is not None
                         and verify_checkpoint(exp.join(t.name, c.name).uri).ok] for t in before.trials}
    trial = max(before.trials, key=lambda t: len(whole_of[t.name]))
    whole = whole_of[trial.name]
    assert len(whole) >= 2, [t.checkpoints for t in before.trials]
    newest, older = sorted(whole, key=lambda c: (c.iteration, c.name), reverse=True)[:2]
    # (both may hold one iteration, hard links of one save: damage the newest's own copy)
    flip_byte(exp.filesystem, exp.join(trial.name, newest.name).path, this_copy_only=True)
    drivers = _drivers(other) if other else []
    if where == "s3":  # a worker killed inside an upload of its state leaves the multipart upload open
        bucket = request.getfixturevalue("s3_bucket")
        client, key = bucket.server.client(), f"qs/{trial.name}/checkpoint_000099/state.pt"
        upload = client.create_multipart_upload(Bucket=bucket.name, Key=key)["UploadId"]
        client.upload_part(Bucket=bucket.name, Key=key, UploadId=upload, PartNumber=1, Body=b"\0" * (5 << 20))

    done = subprocess.run([sys.executable, "-m", "tunekit.cli", "resume", exp.uri],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "trainable: tunekit.trainables.class_api:DigitsTrainable (recorded in its checkpoints)" in out, out[:6000]
    said = [line for line in out.splitlines() if f"{trial.trial_id} ({trial.status}): continues from" in line]
    assert len(said) == 1, out[:6000]
    assert f"continues from {older.name} (iteration {older.iteration}); passed over: " in said[0], out[:6000]
    assert f"{newest.name} is corrupt" in said[0].split("passed over: ")[1], out[:6000]
    assert f"damaged copies kept as .{newest.name}.damaged" in out, out[:6000]
    # A kill that lands while Ray copies its experiment state (or its search algorithm's) to storage tears it:
    # then the trials go on from tunekit's record in a new experiment beside (test_resume_torn.py); else in place.
    torn = before.damaged_state_files or driver_state_problem(exp, root_files(exp))
    into = exp if not torn else resolve_storage(base).join("qs-resumed")
    after = read_experiment(into.uri)
    assert set(after.counts()) == {"TERMINATED"}, out[-6000:]
    assert all(t.iterations >= STOP for t in after.trials), out[-6000:]
    # The damaged checkpoint survives Ray's num_to_keep as its copy, and every reader shows it.
    copy = exp.join(trial.name, f".{newest.name}.damaged")
    assert exp.filesystem.get_file_info(copy.path).type.name == "Directory"
    assert not verify_checkpoint(copy).ok
    assert main(["verify", exp.uri, "--full"]) == 1
    assert main(["status", exp.uri]) == 2
    if other is not None:
        assert _drivers(other) == drivers, "tunekit resume joined somebody else's Ray"
    else:  # every upload left open under the experiment aborted (the killed driver's too), none left by resume
        said = re.search(r"^aborted [1-9]\d* interrupted multipart upload\(s\) a kill left in ", out, flags=re.M)
        assert said, out[:3000]
        assert not client.list_multipart_uploads(Bucket=bucket.name, Prefix="qs/").get("Uploads"), out[:3000]


def test_resume_of_a_finished_experiment_says_so_and_writes_nothing(quickstart_experiment, tmp_path, capsys):
    exp = tmp_path / "finished"
    shutil.copytree(quickstart_experiment, exp)
    listing = sorted(str(p.relative_to(exp)) for p in exp.rglob("*"))
    assert main(["resume", str(exp)]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines() == [
        "nothing to resume: 4 trials 4 TERMINATED; `tunekit resume EXP --extend N` continues finished trials "
        "to iteration N"]
    assert sorted(str(p.relative_to(exp)) for p in exp.rglob("*")) == listing


def test_a_second_run_beside_a_live_driver_is_refused_before_training(ray_session, storage):
    """The experiment's record names a driver still running (a real process, its heartbeat fresh): a second run
    of it (a `Tuner.restore`, the same name again) stops at its first write of the record, naming that driver,
    before any trial trains; the record is the first driver's still."""
    import json
    import time

    from ray import tune

    from tunekit.callbacks import ExperimentRecord
    from tunekit.trainables import DigitsTrainable

    def run():
        return tune.Tuner(DigitsTrainable, param_space={"hidden_size": 8, "steps_per_iteration": 2, "seed": 1},
                          run_config=tune.RunConfig(name="busy", storage_path=str(storage), verbose=0,
                                                    stop={"training_iteration": 1},
                                                    callbacks=[ExperimentRecord()])).fit()

    assert not run().errors
    record_path = storage / "busy" / "tunekit-experiment.json"
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        record = json.loads(record_path.read_text())
        record.update(ended=False, updated=time.time())
        record["driver"] = {**record["driver"], "pid": other.pid}
        record_path.write_text(json.dumps(record))
        before = record_path.read_text()
        with pytest.raises(Exception, match=rf"busy is in use: its driver is running \(pid {other.pid} on this "
                                            r"machine.*this run would train its trials twice"):
            grid = run()
            raise AssertionError([r.error for r in grid])  # (not refused)
        assert record_path.read_text() == before
    finally:
        other.kill()
        other.wait()


def test_an_experiment_of_an_older_tunekit_unpickles_where_its_modules_moved(monkeypatch):
    """``tuner.pkl`` of tunekit 0.3 refers to ``tunekit.torch_trainable`` and ``tunekit.function``: before
    ``Tuner.restore`` those names lead to the modules' layer packages, and nothing else is aliased."""
    import pickle

    from tunekit.commands._find_trainable import _alias_moved_packages
    from tunekit.experiment._pickles import pickle_globals
    from tunekit.trial import function, torch_trainable

    old = b"(ctunekit.torch_trainable\nTorchTrainable\nctunekit.function\nfunction_trainable\ntp0\n."
    for name in ("tunekit.torch_trainable", "tunekit.function"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ModuleNotFoundError):
        pickle.loads(old)
    _alias_moved_packages(pickle_globals(old))
    assert pickle.loads(old) == (torch_trainable.TorchTrainable, function.function_trainable)
    assert "tunekit.state" not in sys.modules  # (a moved module the pickle does not name)
    for name in ("tunekit.torch_trainable", "tunekit.function"):
        monkeypatch.delitem(sys.modules, name)
