from __future__ import annotations

import re

import torch

from tunekit.trainables import DigitsTrainable
from tunekit import verify_checkpoint
from tunekit.cli import main


def test_quickstart_runs_and_prints_table(ray_session, storage, capsys):
    code = main(
        ["quickstart", "--num-samples", "2", "--max-iterations", "4", "--storage-path", str(storage), "--name", "qs"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"results go to {storage / 'qs'}" in out
    header = next(line for line in out.splitlines() if line.startswith("trial"))
    assert header.split() == ["trial", "lr", "momentum", "accuracy", "iterations", "state"]
    rows = [line.split() for line in out.splitlines() if re.match(r"^[0-9a-f]{5}_\d{5}\s", line)]
    assert len(rows) == 2
    # A PBT exploit late in the run can carry a trial to its donor's iteration, one past the stop.
    assert all(int(row[4]) >= 4 and row[5] == "TERMINATED" for row in rows), rows
    best_acc = float(re.search(r"best trial: \S+ \(accuracy ([0-9.]+)\)", out).group(1))
    assert best_acc >= max(float(row[3]) for row in rows) - 1e-9
    ckpt = re.search(r"best checkpoint: (\S+)", out).group(1)
    assert ckpt.startswith(str(storage / "qs"))
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
