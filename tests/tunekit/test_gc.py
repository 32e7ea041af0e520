"""`tunekit gc`: a preview that changes nothing, then exactly that deleted; what resume needs is never deleted."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pyarrow.fs as pafs
import pytest
from ray import tune

from tunekit.analysis import load_results
from tunekit.cli import main
from tunekit.experiment.record import FORMAT, write_record
from tunekit.experiment.snapshot import read_experiment
from tunekit.storage import resolve_storage
from tunekit.trainables.toy_pbt import ToyPBT


def _tree(fs: pafs.FileSystem, root: str) -> dict[str, str]:
    """Every file under ``root`` and the hash of its bytes (but the readers' index of a remote experiment)."""
    out = {}
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        if info.type == pafs.FileType.File and not info.path.endswith("/.tunekit-index.json"):
            with fs.open_input_stream(info.path) as stream:
                out[info.path[len(root):]] = hashlib.sha256(stream.read()).hexdigest()
    return out


def _sizes(fs: pafs.FileSystem, root: str) -> dict[str, int]:
    return {i.path: i.size for i in fs.get_file_info(pafs.FileSelector(root, recursive=True))
            if i.type == pafs.FileType.File}


def _listed(out: str) -> set[str]:
    """``trial/checkpoint`` pairs a gc preview lists for deletion."""
    pairs = set()
    for line in out.splitlines():
        trial, sep, rest = line.partition(": delete ")
        if sep and "): " in rest:
            names = rest.split("): ", 1)[1].split("; keep")[0]
            pairs |= {f"{trial}/{name}" for name in names.split(", ")}
    return pairs


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_dry_run_changes_nothing_and_yes_deletes_exactly_what_it_listed(where, quickstart_experiment, tmp_path,
                                                                        capsys, request):
    if where == "local":
        exp = resolve_storage(str(tmp_path / "qs"))
        shutil.copytree(quickstart_experiment, exp.path)
    else:
        exp = resolve_storage(request.getfixturevalue("s3_bucket").uri("qs"))
        pafs.copy_files(str(quickstart_experiment), exp.path, destination_filesystem=exp.filesystem)
    fs = exp.filesystem
    before = _tree(fs, exp.path)
    rows = load_results(exp.uri)
    args = ["gc", exp.uri, "--experiment-best", "1", "--trial-latest", "1", "--metric", "accuracy", "--mode", "max"]

    assert main(["status", exp.uri, "--json"]) == 0
    held = sum(t["checkpoint_bytes"] for t in json.loads(capsys.readouterr().out)["trials"])
    assert held == sum(size for path, size in _sizes(fs, exp.path).items() if "/checkpoint_" in path)
    index = [i.mtime_ns for i in fs.get_file_info(pafs.FileSelector(exp.path)) if i.base_name == ".tunekit-index.json"]
    assert main(args) == 0
    preview = capsys.readouterr().out
    assert "dry run: nothing deleted" in preview
    assert _tree(fs, exp.path) == before
    assert index == [i.mtime_ns for i in fs.get_file_info(pafs.FileSelector(exp.path))
                     if i.base_name == ".tunekit-index.json"]  # (status kept it; the dry run wrote nothing)
    listed = _listed(preview)
    snapshot = read_experiment(exp.uri)
    best = snapshot.best_checkpoint("accuracy", "max")
    assert listed, preview
    assert not any(p.endswith("/" + best.checkpoint.name) and p.startswith(best.trial.name) for p in listed)

    assert main([*args, "--yes"]) == 0
    done = capsys.readouterr().out
    assert f"deleted {len(listed)} directories" in done
    freed = int(done.rsplit("directories, ", 1)[1].split(" bytes")[0])
    gone = {p for p in before if "/".join(p.lstrip("/").split("/")[:2]) in listed}
    after = _tree(fs, exp.path)
    assert set(after) == set(before) - gone  # exactly the listed directories, nothing else
    assert all(after[p] == before[p] for p in after)
    left = read_experiment(exp.uri)
    assert all(len(t.checkpoints) >= 1 for t in left.trials)
    assert sum(len(t.checkpoints) for t in left.trials) == sum(len(t.checkpoints) for t in snapshot.trials) - len(listed)
    assert main(["verify", exp.uri]) == 0
    assert main(["status", exp.uri]) == 0
    assert f"checkpoints: {sum(len(t.checkpoints) for t in left.trials)}, " in capsys.readouterr().out
    assert main(["status", exp.uri, "--json"]) == 0
    assert sum(t["checkpoint_bytes"] for t in json.loads(capsys.readouterr().out)["trials"]) == held - freed > 0
    assert load_results(exp.uri).equals(rows)
    capsys.readouterr()


def test_gc_refuses_an_experiment_whose_driver_runs_and_bad_selections(quickstart_experiment, tmp_path, capsys):
    exp = tmp_path / "qs"
    shutil.copytree(quickstart_experiment, exp)
    record = {"format": FORMAT, "trials": [], "ended": False, "updated": time.time(),
              "driver": {"host": socket.gethostname(), "pid": os.getpid()}}  # this process: alive
    write_record(pafs.LocalFileSystem(), str(exp), record)
    before = _tree(pafs.LocalFileSystem(), str(exp))

    assert main(["gc", str(exp), "--trial-latest", "1", "--yes"]) == 2
    err = capsys.readouterr().err
    assert f"its driver is running (pid {os.getpid()} on this machine" in err and "--force" in err
    assert len(err.strip().splitlines()) == 1
    assert _tree(pafs.LocalFileSystem(), str(exp)) == before

    assert main(["gc", str(exp), "--trial-best", "1"]) == 2
    assert "give --metric M and --mode max|min" in capsys.readouterr().err
    assert main(["gc", str(exp)]) == 2
    assert "say what to keep" in capsys.readouterr().err

    write_record(pafs.LocalFileSystem(), str(exp), {**record, "ended": True})  # the run is over
    assert main(["gc", str(exp), "--trial-latest", "1"]) == 0
    assert "dry run" in capsys.readouterr().out
    assert main(["gc", str(exp), "--trial-latest", "1", "--yes", "--force"]) == 0
    assert all(len(t.checkpoints) == 1 for t in read_experiment(str(exp)).trials)
    capsys.readouterr()



class FailsOnce(ToyPBT):
    """Fails at iteration 3 while the file ``config["fail_once"]`` exists (and deletes it)."""

    def train_iteration(self):
        marker = self.config["fail_once"]
        if self.iteration == 2 and os.path.exists(marker):
            os.remove(marker)
            raise RuntimeError("failing once, as the test asks")
        return super().train_iteration()


@pytest.mark.parametrize("where", ["local", "s3"])
def test_gc_never_deletes_what_resume_needs_and_resume_then_completes_the_experiment(where, ray_session, storage,
                                                                                    capsys, request):
    marker = storage / "fail-once"
    marker.touch()
    base = str(storage) if where == "local" else request.getfixturevalue("s3_bucket").uri()
    grid = tune.Tuner(
        FailsOnce, param_space={"h": [1.0, 0.0], "lr": 0.1, "fail_once": str(marker)},
        run_config=tune.RunConfig(name="unfinished", storage_path=base, stop={"training_iteration": 5},
                                  checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1), verbose=0),
    ).fit()
    assert len(grid.errors) == 1
    exp = resolve_storage(base).join("unfinished").uri
    (trial,) = read_experiment(exp).trials
    assert [c.iteration for c in trial.checkpoints] == [1, 2]

    assert main(["gc", exp, "--trial-latest", "0", "--yes"]) == 0  # keeps nothing by itself
    (trial,) = read_experiment(exp).trials
    assert [c.iteration for c in trial.checkpoints] == [2], "gc deleted what resume continues from"
    capsys.readouterr()
    assert main(["resume", exp, "--resume-errored"]) == 0
    assert f"continues from {trial.checkpoints[0].name} (iteration 2)" in capsys.readouterr().out
    (trial,) = read_experiment(exp).trials
    assert trial.status == "TERMINATED" and trial.iterations == 5
    assert main(["verify", exp]) == 0


def _train_checkpoint(path, iteration: int):
    """A two-rank Train checkpoint as tunekit.multiworker writes it (the shards' bytes made up)."""
    from tunekit.checkpoint import write_checkpoint

    path.mkdir(parents=True)
    (path / "ranks.json").write_text(json.dumps({"world_size": 2, "sharded": True}))
    write_checkpoint(path, {"counters": {"iteration": iteration}}, metadata={"iteration": iteration})
    for rank in (0, 1):
        (path / f"rank-{rank}").mkdir()
        (path / f"rank-{rank}" / f"__{rank}_0.distcp").write_bytes(bytes([iteration, rank]) * 512)
        write_checkpoint(path / f"rank-{rank}", {"rng": rank}, metadata={"rank": rank})
    return path


@pytest.mark.parametrize("select", [["--trial-latest", "1"], ["--trial-best", "1", "--metric", "loss", "--mode", "min"]])
def test_gc_of_multi_worker_trials_keeps_every_train_checkpoint_a_kept_pointer_needs(tmp_path, capsys, select):
    """A multi-worker trial's Tune checkpoints are pointers to its Train checkpoints: the selections count the
    pointers; a Train checkpoint goes only when no kept pointer (of any trial: a PBT clone's points at its
    donor's) names it and it is not its trial's newest."""
    from tunekit import verify_experiment
    from tunekit.multiworker.trial import write_pointer

    exp = tmp_path / "exp"
    losses = {"a": [0.9, 0.8, 0.7], "b": [0.5, 0.95]}  # b's best is its first: the one it cloned from a
    for trial, loss in losses.items():
        (exp / f"loop_{trial}").mkdir(parents=True)
        (exp / f"loop_{trial}" / "result.json").write_text("".join(
            json.dumps({"trial_id": trial, "training_iteration": i + 1, "loss": v, "done": i + 1 == len(loss)}) + "\n"
            for i, v in enumerate(loss)))
    a, b = exp / "loop_a", exp / "loop_b"
    t = [_train_checkpoint(a / "train" / f"checkpoint_2026-11-26_0{i}", i) for i in (1, 2, 3)]
    u = _train_checkpoint(b / "train" / "checkpoint_2026-11-26_05", 2)
    write_pointer(str(a / "checkpoint_000000"), str(t[0]), "loop", {}, None)  # a: iterations 1 and 2 reached
    write_pointer(str(a / "checkpoint_000001"), str(t[1]), "loop", {}, None)  # Tune; its workers wrote t[2]
    write_pointer(str(b / "checkpoint_000000"), str(t[0]), "loop", {}, None)  # b: cloned a's iteration 1
    write_pointer(str(b / "checkpoint_000001"), str(u), "loop", {}, None)
    assert verify_experiment(str(exp)).ok
    assert main(["status", str(exp)]) == 0
    out = capsys.readouterr().out
    assert "2+3 train" in out and "2+1 train" in out  # each trial's Tune checkpoints, then its Train ones
    assert "checkpoints: 4 and 4 Ray Train checkpoints of multi-worker trials" in out

    assert main(["gc", str(exp), *select]) == 0
    listed = _listed(capsys.readouterr().out)
    assert main(["gc", str(exp), *select, "--yes"]) == 0
    left = {str(p.relative_to(exp)) for p in [*exp.glob("*/checkpoint_*"), *exp.glob("*/train/checkpoint_*")]}
    if select[0] == "--trial-latest":  # a's newest pointer and what it names; a's newest Train one; b's newest
        gone = {"loop_a/checkpoint_000000", "loop_a/train/checkpoint_2026-11-26_01", "loop_b/checkpoint_000000"}
    else:  # b's best is its clone of a's first: that Train checkpoint, in a's directory, stays
        gone = {"loop_a/checkpoint_000000", "loop_b/checkpoint_000001"}
    assert listed == gone
    assert left == {"loop_a/checkpoint_000000", "loop_a/checkpoint_000001", "loop_b/checkpoint_000000",
                    "loop_b/checkpoint_000001", "loop_a/train/checkpoint_2026-11-26_01",
                    "loop_a/train/checkpoint_2026-11-26_02", "loop_a/train/checkpoint_2026-11-26_03",
                    "loop_b/train/checkpoint_2026-11-26_05"} - gone
    assert verify_experiment(str(exp)).ok  # no pointer left pointing at nothing


def test_gc_leftovers_aborts_the_multipart_uploads_a_kill_left_open_on_s3(quickstart_experiment, s3_bucket, capsys):
    """A worker killed while uploading a large state leaves its multipart upload open, billed and invisible to
    listings: `gc --leftovers` names it in its preview and aborts it with --yes; another experiment's stays."""
    exp = resolve_storage(s3_bucket.uri("qs"))
    pafs.copy_files(str(quickstart_experiment), exp.path, destination_filesystem=exp.filesystem)
    client = s3_bucket.server.client()
    trial = read_experiment(exp.uri).trials[0].name

    def cut_short(key: str) -> str:  # an upload whose first part went up, then its writer died
        upload = client.create_multipart_upload(Bucket=s3_bucket.name, Key=key)["UploadId"]
        client.upload_part(Bucket=s3_bucket.name, Key=key, UploadId=upload, PartNumber=1, Body=b"\0" * (5 << 20))
        return upload

    ours = cut_short(f"qs/{trial}/checkpoint_000009/state.pt")
    other = cut_short("qs-other/t/checkpoint_000001/state.pt")
    assert main(["status", exp.uri]) == 0  # nothing lost: an open upload is no damage

    assert main(["gc", exp.uri, "--leftovers"]) == 0
    preview = capsys.readouterr().out
    assert f"1 interrupted multipart upload(s) to abort: {trial}/checkpoint_000009/state.pt" in preview, preview
    assert len(client.list_multipart_uploads(Bucket=s3_bucket.name)["Uploads"]) == 2  # a dry run aborts nothing
    without = subprocess.run([sys.executable, "-c", "import sys; sys.modules['boto3'] = None; from tunekit.cli import "
                              f"main; sys.exit(main(['gc', {exp.uri!r}, '--leftovers', '--yes']))"],
                             capture_output=True, text=True, timeout=600)  # (a machine without boto3)
    assert without.returncode == 0, without.stderr[-2000:]
    assert "cannot be listed without boto3: pip install 'tunekit[s3]'" in without.stdout, without.stdout
    assert len(client.list_multipart_uploads(Bucket=s3_bucket.name)["Uploads"]) == 2

    assert main(["gc", exp.uri, "--leftovers", "--yes"]) == 0
    assert "aborted 1 interrupted multipart upload(s)" in capsys.readouterr().out
    left = [u["UploadId"] for u in client.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads", [])]
    assert ours not in left and left == [other]
    assert main(["verify", exp.uri]) == 0


def test_gc_of_an_unreachable_storage_says_so_in_one_line(capsys):
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    uri = f"s3://nobucket/exp?endpoint_override=http://127.0.0.1:{port}&region=us-east-1"
    assert main(["gc", uri, "--leftovers"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tunekit gc: cannot read {uri}: ") and "\n" not in err, err
