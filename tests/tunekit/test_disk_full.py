"""A save onto a full disk (a real, small tmpfs): one line naming where and how much, nothing half-written kept."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
import torch
from ray import tune

from tunekit import TorchTrainable, TrainingState, verify_checkpoint

MIB = 1024 * 1024


class Big(TorchTrainable):
    """About 1 MiB of weights: the third checkpoint does not fit on the 2.6 MiB filesystem."""

    def build(self, config):
        model = torch.nn.Linear(512, 512)
        return TrainingState(models={"m": model}, optimizers={"sgd": torch.optim.SGD(model.parameters(), lr=0.1)})

    def train_iteration(self):
        with torch.no_grad():
            self.state.models["m"].weight.add_(0.01)
        return {"loss": 1.0 / (1 + self.iteration)}


@pytest.fixture
def small_disk(tmp_path):
    where = tmp_path / f"small-{uuid.uuid4().hex[:6]}"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2600k", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"this machine refuses to mount a small tmpfs: {done.stderr.strip() or done.stdout.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_save_onto_a_full_disk_fails_the_trial_in_one_line_and_keeps_the_previous_checkpoint(ray_session,
                                                                                                small_disk):
    grid = tune.Tuner(
        Big, param_space={},
        run_config=tune.RunConfig(name="full", storage_path=str(small_disk), stop={"training_iteration": 6},
                                  checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=0)),
    ).fit()
    assert len(grid.errors) == 1
    trial_dir = Path(grid[0].path)
    message = str(grid.errors[0])
    line = next(line for line in message.splitlines() if "no space left on the device of" in line)
    assert str(trial_dir) in line and "needs about" in line and "bytes)" in line, message[-2000:]
    needed = int(line.split("(")[1].split(" bytes")[0])
    assert needed >= MIB  # the weights alone
    # Its own partial write is gone (the checkpoint it announced stays empty: never written, and `verify` says
    # so); what it had before is whole and verifies.
    names = sorted(p.name for p in trial_dir.iterdir() if "checkpoint" in p.name)
    assert not [n for n in names if ".partial-" in n], names
    announced = [n for n in names if n.startswith("checkpoint_") and not any((trial_dir / n).iterdir())]
    whole = [n for n in names if n.startswith("checkpoint_") and n not in announced]
    assert announced in ([], [max(n for n in names if n.startswith("checkpoint_"))]), names
    assert whole and all(verify_checkpoint(str(trial_dir / n)).ok for n in whole), names


def fill(path) -> None:
    """Fill the filesystem of ``path`` to the last byte (a file written until the disk refuses; none if it is
    full already)."""
    try:
        with open(path, "wb") as fh:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
    except OSError:  # (at the write that found the disk full, or at the close flushing its last bytes)
        pass


def fills_the_disk(config):
    """Reports 6 iterations; after the first it fills the experiment's disk to the last byte."""
    for i in range(6):
        if i == 1:
            fill(config["filler"])
        tune.report({"loss": 1.0 / (1 + i)})


def test_a_full_disk_under_parquet_logger_stops_the_logger_not_the_run(ray_session, small_disk, caplog):
    from tunekit.callbacks import ParquetLogger
    from tunekit.table import RESULTS_DIR

    filler = small_disk / "filler"
    grid = tune.Tuner(
        fills_the_disk, param_space={"filler": str(filler)},
        run_config=tune.RunConfig(name="full-results", storage_path=str(small_disk), stop={"training_iteration": 6},
                                  callbacks=[ParquetLogger(batch_rows=1)], verbose=0),
    ).fit()
    assert not grid.errors and grid[0].metrics["training_iteration"] == 6  # the run went on to its stop
    said = [r.getMessage() for r in caplog.records if "ParquetLogger cannot write" in r.getMessage()]
    assert len(said) == 1 and str(small_disk / "full-results" / RESULTS_DIR) in said[0], said
    results = small_disk / "full-results" / RESULTS_DIR
    assert not [p.name for p in results.iterdir() if p.name.endswith(".tmp")]  # no torn batch left
    filler.unlink()
    import pyarrow.parquet as pq

    rows = pq.read_table(str(results)).to_pylist()  # what it wrote before the disk filled is whole
    assert [r["training_iteration"] for r in rows] == list(range(1, len(rows) + 1)) and rows


def test_report_onto_a_full_disk_says_so_in_one_line_and_keeps_the_old_report(quickstart_experiment, small_disk,
                                                                             capsys):
    from tunekit.cli import main

    out = small_disk / "report"
    assert main(["report", str(quickstart_experiment), "--output", str(out)]) == 0
    old = (out / "index.html").read_bytes()
    capsys.readouterr()
    fill(small_disk / "filler")
    assert main(["report", str(quickstart_experiment), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("reading ") and len(err) == 2, err  # its progress line, then the one error line
    assert "cannot write the report into" in err[1] and "No space left" in err[1] and "unchanged" in err[1], err
    assert (out / "index.html").read_bytes() == old
    assert not [p for p in out.iterdir() if p.name.startswith(".tunekit_report.tmp")]


@pytest.fixture
def read_only_copy(quickstart_experiment, tmp_path):
    """A copy of the quickstart's experiment on a filesystem remounted read-only (a real tmpfs)."""
    import shutil

    where = tmp_path / f"ro-{uuid.uuid4().hex[:6]}"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"this machine refuses to mount a tmpfs: {done.stderr.strip() or done.stdout.strip()}")
    try:
        shutil.copytree(quickstart_experiment, where / "qs")
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        yield where / "qs"
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_gc_and_extend_on_read_only_storage_say_so_in_one_line(read_only_copy, capsys):
    from tunekit.cli import main

    listing = sorted(str(p) for p in read_only_copy.rglob("*"))
    assert main(["gc", str(read_only_copy), "--trial-latest", "1", "--yes"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot delete" in err and "Read-only file system" in err, err
    assert main(["resume", str(read_only_copy), "--extend", "20"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Read-only file system" in err, err
    assert sorted(str(p) for p in read_only_copy.rglob("*")) == listing
