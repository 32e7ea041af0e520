from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import urllib.parse

import pytest
import torch

from tunekit import read_metadata, verify_checkpoint
from tunekit.analysis import best_checkpoint
from tunekit.cli import main
from tunekit.trainables import DigitsTrainable

_TUNEKIT_LINE = re.compile(
    r"^(tunekit quickstart: |results go to |\[ *[0-9.]+s\] |best trial: |best checkpoint: |finished in |next: |your own trainable: tunekit check |\*? +trial +lr|[- ]+$|\*? *[0-9a-f]{5}_\d{5}\s|$)"
)


@pytest.mark.floor
def test_quickstart_names_the_true_best_and_prints_nothing_of_rays(storage, tmp_path):
    """A real `tunekit quickstart` on its own fresh Ray: its lines only; one best, agreed on everywhere."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_AUTH_MODE", "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "RAY_ADDRESS")}
    done = subprocess.run(
        [sys.executable, "-m", "tunekit.cli", "quickstart", "--num-samples", "3", "--max-iterations", "4", "--cpus", "2",
         "--storage-path", str(storage), "--name", "qs"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert f"results go to {storage / 'qs'}" in out
    foreign = [line for line in out.splitlines() if not _TUNEKIT_LINE.match(line)]
    assert foreign == [], out
    assert "\nyour own trainable: tunekit check my_module:MyTrainable" in out, out[-500:]
    header = next(line for line in out.splitlines() if re.match(r"^ +trial ", line))
    assert header.split() == ["trial", "lr", "momentum", "accuracy", "best", "ckpt", "iterations", "state"]
    rows = [line.split() for line in out.splitlines() if re.match(r"^\*? *[0-9a-f]{5}_\d{5}\s", line)]
    assert len(rows) == 3
    marked = [row[1] for row in rows if row[0] == "*"]
    rows = [row[-7:] for row in rows]
    # A PBT exploit late in the run can carry a trial to its donor's iteration, one past the stop.
    assert all(int(row[5]) >= 4 and row[6] == "TERMINATED" for row in rows), rows
    best = re.search(r"best trial: (\S+) \(its checkpoint at iteration (\d+): accuracy ([0-9.]+)\)", out)
    best_id, best_acc = best.group(1), float(best.group(3))
    ckpt = re.search(r"best checkpoint: (\S+)", out).group(1)
    assert marked == [best_id]
    assert best_acc == max(float(row[4]) for row in rows)  # the best "best ckpt" in the table
    # It is the best checkpoint on storage, by each checkpoint's own record.
    experiment = storage / "qs"
    recorded = [read_metadata(str(c))["metrics"]["accuracy"] for c in experiment.glob("*/checkpoint_*")]
    assert abs(max(recorded) - best_acc) <= 5e-5
    assert int(best.group(2)) == read_metadata(ckpt)["iteration"]
    # quickstart, `tunekit status --metric --mode` and tunekit.analysis._load agree.
    status = subprocess.run(
        [sys.executable, "-m", "tunekit.cli", "status", str(experiment), "--metric", "accuracy", "--mode", "max", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    payload = json.loads(status.stdout)
    assert (payload["best_trial"], payload["best_checkpoint"]) == (best_id, ckpt)
    assert best_checkpoint(str(experiment), metric="accuracy", mode="max") == ckpt
    assert verify_checkpoint(ckpt).ok
    model = DigitsTrainable.load_model(ckpt)
    from tunekit.trainables.digits import load_digits_data

    data = load_digits_data()
    with torch.no_grad():
        acc = (model(data.x_val).argmax(1) == data.y_val).float().mean().item()
    # The printed accuracy is the checkpoint's own accuracy on the validation split.
    assert abs(acc - best_acc) <= 5e-5  # printed with 4 decimals


def test_quickstart_on_s3(ray_session, s3_bucket, capsys):
    base = s3_bucket.uri("qs-runs")
    args = ["quickstart", "--num-samples", "2", "--max-iterations", "2", "--storage-path", base, "--name", "qs"]
    assert main(args) == 0
    out = capsys.readouterr().out
    experiment = base.replace("/qs-runs?", "/qs-runs/qs?")
    assert f"results go to {experiment}" in out
    ckpt = re.search(r"best checkpoint: (\S+)", out).group(1)
    assert ckpt.startswith(f"s3://{s3_bucket.name}/qs-runs/qs/") and "endpoint_override=" in ckpt
    assert verify_checkpoint(ckpt).ok
    assert isinstance(DigitsTrainable.load_model(ckpt), torch.nn.Module)
    assert main(["verify", experiment]) == 0
    _verify_reads_the_listing(experiment, s3_bucket, capsys)
    _status_reads_the_index(experiment, s3_bucket, capsys)


def _verify_reads_the_listing(experiment, s3_bucket, capsys):
    """`verify` on S3 checks sizes from one listing and the index, a request count that does not grow with
    the trials; `--full` hashes every file; a cut file is named by either, a flipped byte by `--full`."""
    from tunekit import resolve_storage

    capsys.readouterr()
    with s3_bucket.server.recording() as seen:
        assert main(["verify", experiment]) == 0
    sizes = capsys.readouterr().out
    assert "no file's bytes read" in sizes and "--full" in sizes
    _listing_and_index_alone(seen)
    assert main(["verify", experiment, "--full"]) == 0
    assert "size and hash" in capsys.readouterr().out
    with s3_bucket.server.recording() as seen:  # again: the bytes on storage, never a copy the readers kept
        assert main(["verify", experiment, "--full"]) == 0
    got = {urllib.parse.unquote(line.split(" ", 1)[1].split("?")[0]) for line in seen if line.startswith("GET ")}
    payloads = [k for k in s3_bucket.keys() if "/checkpoint_" in k and k.endswith("/state.pt")]
    assert payloads and all(any(u.endswith(f"/{s3_bucket.name}/{k}") for u in got) for k in payloads), seen
    payload = sorted(k for k in s3_bucket.keys() if "/checkpoint_" in k and k.endswith("/state.pt"))[-1]
    where = resolve_storage(experiment)
    original = s3_bucket.read(payload)
    try:
        for damaged, found_by in ((original[:-1], ["verify", experiment]),
                                  (original[:-1] + bytes([original[-1] ^ 1]), ["verify", experiment, "--full"])):
            with where.filesystem.open_output_stream(f"{s3_bucket.name}/{payload}") as out:
                out.write(damaged)
            assert main(found_by) == 1
            out = capsys.readouterr().out
            assert payload.rsplit("/", 2)[-2] in out and "corrupt" in out
    finally:
        with where.filesystem.open_output_stream(f"{s3_bucket.name}/{payload}") as out:
            out.write(original)
    # The index's verdicts on Ray's experiment state and tunekit's record stand only while the files are unchanged.
    state = sorted(k for k in s3_bucket.keys() if k.rsplit("/", 1)[-1].startswith("experiment_state-"))[-1]
    record = next(k for k in s3_bucket.keys() if k.endswith("qs/tunekit-experiment.json"))
    for key, said in ((state, "is damaged"), (record, "tunekit's record of the run is lost")):
        kept = s3_bucket.read(key)
        try:
            with where.filesystem.open_output_stream(f"{s3_bucket.name}/{key}") as out:
                out.write(kept[: len(kept) // 2])
            assert main(["verify", experiment]) == 1
            out = capsys.readouterr().out
            assert said in out and key.rsplit("/", 1)[-1] in out, out
        finally:
            with where.filesystem.open_output_stream(f"{s3_bucket.name}/{key}") as out:
                out.write(kept)
    assert main(["verify", experiment]) == 0


def _listing_and_index_alone(seen):
    """The requests of a `verify` (sizes) whose index holds every file unchanged: the experiment's one recursive
    listing (a page per 1,000 objects, no listing by directory) and the index; Ray's experiment state and tunekit's
    record judged from the index, where the listing shows them unchanged."""
    pages = [r for r in seen if r.startswith("GET ") and "list-type=2" in r and "delimiter" not in r]
    index = [r for r in seen if ".tunekit-index.json" in r.split("?")[0]]
    assert 1 <= len(pages) <= 2 and len(index) <= 2 and len(pages) + len(index) == len(seen), "\n".join(seen)


def _status_reads_the_index(experiment, s3_bucket, capsys):
    """`status` on S3 lists the experiment once and takes what it parsed of each file unchanged since from the
    index it keeps (`.tunekit-index.json`); a damaged index, or a checkpoint gone, is read the slow way."""
    import pyarrow.fs as pafs

    from tunekit import resolve_storage

    capsys.readouterr()
    assert main(["status", experiment, "--json"]) == 0
    first = capsys.readouterr().out
    with s3_bucket.server.recording() as seen:
        assert main(["status", experiment, "--json"]) == 0
    assert capsys.readouterr().out == first
    trials = len(json.loads(first)["trials"])
    # (the reads without the index: about 20 a trial)
    assert len(seen) <= 25 + trials, "\n".join(seen)
    with s3_bucket.server.recording() as seen:  # status kept what verify read into the index: still valid
        assert main(["verify", experiment]) == 0
    _listing_and_index_alone(seen)
    capsys.readouterr()
    index = next(k for k in s3_bucket.keys() if k.endswith("qs/.tunekit-index.json"))
    where = resolve_storage(experiment)
    with where.filesystem.open_output_stream(f"{s3_bucket.name}/{index}") as out:
        out.write(b'{"format": "tunekit-ind')  # cut short
    assert main(["status", experiment, "--json"]) == 0
    assert capsys.readouterr().out == first
    gone = sorted(k for k in s3_bucket.keys() if "/checkpoint_" in k)[0].rsplit("/", 1)[0]
    where.filesystem.delete_dir(f"{s3_bucket.name}/{gone}")
    assert where.filesystem.get_file_info(f"{s3_bucket.name}/{gone}").type == pafs.FileType.NotFound
    assert main(["status", experiment, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    names = [c["name"] for t in shown["trials"] for c in t["checkpoints"]]
    assert sum(1 for t in json.loads(first)["trials"] for _ in t["checkpoints"]) == len(names) + 1


def test_quickstart_fails_before_any_trial_when_storage_is_unreachable(s3_bucket, capsys):
    s3_bucket.server.stop()
    try:
        code = main(["quickstart", "--storage-path", s3_bucket.uri("qs-runs"), "--name", "qs"])
    finally:
        s3_bucket.server.start()
    out, err = capsys.readouterr()
    assert code == 2 and "results go to" not in out
    assert "endpoint unreachable" in err and len(err.strip().splitlines()) == 1
    assert s3_bucket.keys() == []


def test_quickstart_refuses_existing_experiment(ray_session, storage, capsys):
    (storage / "taken").mkdir()
    (storage / "taken" / "precious.txt").write_text("x")
    assert main(["quickstart", "--storage-path", str(storage), "--name", "taken"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (storage / "taken" / "precious.txt").read_text() == "x"


@pytest.mark.parametrize("sent", ["SIGINT", "SIGTERM"])
def test_ctrl_c_during_quickstart_is_shown_as_interrupted_and_resume_finishes_it(storage, tmp_path, capsys, sent):
    """Ctrl-C (or SIGTERM, what a scheduler sends) in the middle of a real quickstart: the summary, tunekit's
    record and `status` say interrupted and name `tunekit resume`, with no traceback; the resume (after Ctrl-C)
    runs every trial to its stop exactly: its last row, its iteration and its newest state's own iteration."""
    import signal

    from tunekit.analysis import load_results
    from tunekit.experiment.snapshot import read_experiment

    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_AUTH_MODE", "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "RAY_ADDRESS")}
    iterations = 200  # (the first progress line comes at the first result: Ctrl-C lands at iteration 1 or so)
    storage = storage / "my runs"  # the printed command is pasted into a shell: quoted
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunekit.cli", "quickstart", "--num-samples", "2", "--max-iterations", str(iterations),
         "--cpus", "2", "--storage-path", str(storage), "--name", "qs"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    seen = []
    for line in proc.stdout:  # Ctrl-C once the sweep runs: its first progress line
        seen.append(line)
        if re.match(r"^\[ *[0-9.]+s\] ", line):
            break
    proc.send_signal(getattr(signal, sent))
    out = "".join(seen) + proc.communicate(timeout=600)[0]
    experiment = storage / "qs"
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    rows = [line.split() for line in out.splitlines() if re.match(r"^\*? *[0-9a-f]{5}_\d{5}\s", line)]
    assert rows and all(row[-1] == "INTERRUPTED" for row in rows), out[-3000:]
    command = re.search(r"trial\(s\) did not finish; `(tunekit resume [^`]+)` continues them", out).group(1)
    assert shlex.split(command) == ["tunekit", "resume", str(experiment)], command
    assert "finished in" not in out
    record = json.loads((experiment / "tunekit-experiment.json").read_text())
    assert record["ended"] and {t["status"] for t in record["trials"]} == {"INTERRUPTED"}
    capsys.readouterr()
    assert main(["status", str(experiment)]) == 0
    status = capsys.readouterr().out
    assert "interrupted: the run stopped before 2 trial(s) finished" in status
    # where resume continues each trial, said by status from the state its newest checkpoint holds
    notes = {m[0]: m[1:] for m in re.findall(r"^note: (\S+) continues at iteration (\d+) from (checkpoint_\d+), "
                                              r"the state of iteration (\d+)", status, flags=re.M)}
    fresh = re.findall(r"^note: (\S+) has no checkpoint: resume starts it again$", status, flags=re.M)
    pinned = re.findall(r"^note: (\S+) continues from \S+, the PBT donor's checkpoint it cloned", status, flags=re.M)
    assert len(notes) + len(fresh) + len(pinned) == 2, status
    assert all(int(at) == int(state) + 1 for at, _, state in notes.values()), status
    if sent == "SIGTERM":
        return

    resumed = subprocess.run([sys.executable, "-m", "tunekit.cli", "resume", str(experiment), "--cpus", "2"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    for trial_id, (_, name, state) in notes.items():  # resume continues where status said it would
        assert re.search(rf"^  {trial_id} \(\w+\): continues from {name} \(iteration {state}\)", resumed.stdout,
                         flags=re.M), resumed.stdout[:3000]
    assert main(["status", str(experiment)]) == 0
    shown = capsys.readouterr().out
    assert "interrupted:" not in shown and "2 trials: 2 TERMINATED" in shown
    df = load_results(str(experiment))
    assert all(n == iterations for n in df.groupby("trial_id")["training_iteration"].max()), df.tail()
    for trial in read_experiment(str(experiment)).trials:  # never past the stop, by the state's own count
        assert trial.iterations == iterations and max(c.iteration for c in trial.checkpoints) == iterations
        assert read_metadata(str(experiment / trial.name / max(trial.checkpoints, key=lambda c: c.iteration).name)
                             )["iteration"] == iterations


def test_digits_are_scikit_learns_read_without_importing_it(tmp_path):
    """The trainables' digits are ``load_digits()``'s arrays, read without scikit-learn's import in the worker."""
    probe = ("import sys, numpy as np\n"
             "from tunekit.trainables.digits import _digits_arrays, load_digits_data\n"
             "x, y = _digits_arrays(); load_digits_data()\n"
             "assert 'sklearn' not in sys.modules, 'scikit-learn was imported'\n"
             "np.save(sys.argv[1], np.concatenate([x, y[:, None]], axis=1))\n")
    import numpy as np
    from sklearn.datasets import load_digits

    out = tmp_path / "digits.npy"
    subprocess.run([sys.executable, "-c", probe, str(out)], check=True, timeout=300)
    table = np.load(out)
    bunch = load_digits()
    assert np.array_equal(table[:, :-1], bunch.data) and np.array_equal(table[:, -1].astype(int), bunch.target)
