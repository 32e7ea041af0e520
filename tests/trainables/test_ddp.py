"""The reference multi-worker trainable (tunekit.trainables.ddp, on tunekit.multiworker): a Tune trial
training data-parallel with 2 Ray Train workers (DDP, gloo); the readers see its checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
from ray import tune
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from tunekit import read_metadata, read_state, verify_checkpoint
from tunekit.cli import main
from tunekit.trainables.ddp import train_loop, tune_ddp

CONFIG = {"lr": 0.05, "momentum": 0.9, "hidden_size": 16, "batch_size": 32, "seed": 7,
          "epochs": 4, "checkpoint_every": 2, "steps_per_iteration": 8, "workers": 2, "cpus_per_worker": 0.9}


def test_data_parallel_trial_writes_every_rank_part_and_the_readers_verify_them(fresh_ray, storage, capsys):
    grid = tune.Tuner(
        tune.with_resources(tune_ddp, {"cpu": 0.1}),  # the trial only drives the two Train workers
        param_space=CONFIG,
        run_config=tune.RunConfig(name="ddp", storage_path=str(storage), verbose=0),
    ).fit()
    assert not grid.errors, grid.errors
    assert grid[0].metrics["iteration"] == CONFIG["epochs"] and grid[0].metrics["world_size"] == 2

    checkpoints = sorted(p for p in (Path(grid[0].path) / "train").glob("checkpoint_*") if p.is_dir())
    assert len(checkpoints) == 2  # iterations 2 and 4
    for ckpt in checkpoints:
        # rank 0 wrote the replicated state once; each rank its own part, under a rank-specific name
        assert verify_checkpoint(str(ckpt)).status == "good"
        assert set(read_state(str(ckpt))) == {"format", "models", "optimizers", "schedulers", "scaler",
                                              "counters", "extras"}
        assert [read_metadata(str(ckpt / f"rank-{r}"))["rank"] for r in (0, 1)] == [0, 1]
        streams = [read_state(str(ckpt / f"rank-{r}"))["data"] for r in (0, 1)]
        assert streams[0] != streams[1]  # the ranks' data positions differ: each rank's own state
    assert read_metadata(str(checkpoints[-1]))["iteration"] == CONFIG["epochs"]

    assert main(["verify", str(storage / "ddp")]) == 0
    out = capsys.readouterr().out
    assert all(f"train/{c.name}" in out for c in checkpoints), out
    # gc keeps the Train checkpoint the kept Tune checkpoint (the newest) names, and deletes the other; what
    # is left verifies
    assert main(["gc", str(storage / "ddp"), "--trial-latest", "1", "--yes"]) == 0
    assert [c.is_dir() for c in checkpoints] == [False, True]
    assert main(["verify", str(storage / "ddp")]) == 0

    # replicated state with one data stream per rank cannot go to another number of workers: one clear line
    with pytest.raises(Exception, match=r"written by 2 workers, this run has 1; its state is replicated"):
        TorchTrainer(train_loop, train_loop_config={**CONFIG, "resume_from": str(checkpoints[-1])},
                     scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 0.9}),
                     torch_config=TorchConfig(backend="gloo"),
                     run_config=RunConfig(name="on-one", storage_path=str(storage / "on-one"))).fit()
