"""Multi-worker trials: a Tune trial training data-parallel with 2 Ray Train workers (DDP, gloo)."""

from __future__ import annotations

from pathlib import Path

import torch
from ray import tune

from tunekit import read_metadata, read_state, verify_checkpoint
from tunekit.trainables.ddp import rank_dir, tune_ddp

CONFIG = {"lr": 0.05, "momentum": 0.9, "hidden_size": 16, "batch_size": 32, "seed": 7,
          "epochs": 6, "checkpoint_every": 2, "steps_per_iteration": 8, "workers": 2, "cpus_per_worker": 0.9}


def _run(storage: Path, name: str, **extra) -> tuple[tune.ResultGrid, Path]:
    train_runs = storage / f"{name}-train"
    grid = tune.Tuner(
        tune.with_resources(tune_ddp, {"cpu": 0.2}),  # the trial only drives the two Train workers
        param_space={**CONFIG, "storage_path": str(train_runs), **extra},
        run_config=tune.RunConfig(name=name, storage_path=str(storage), verbose=0),
    ).fit()
    return grid, train_runs


def _checkpoints(train_runs: Path) -> list[Path]:
    return sorted(p for p in train_runs.glob("ddp-*/checkpoint_*") if p.is_dir())


def test_data_parallel_trial_checkpoints_every_rank_and_recovers_a_killed_worker(fresh_ray, storage, tmp_path):
    clean, clean_runs = _run(storage, "clean")
    assert not clean.errors, clean.errors
    assert clean[0].metrics["iteration"] == CONFIG["epochs"] and clean[0].metrics["world_size"] == 2

    checkpoints = _checkpoints(clean_runs)
    assert len(checkpoints) == 3  # iterations 2, 4, 6
    for ckpt in checkpoints:
        # rank 0 wrote the replicated state once; each rank its own shard, under a rank-specific name
        assert verify_checkpoint(str(ckpt)).status == "good"
        assert set(read_state(str(ckpt))) == {"format", "models", "optimizers", "schedulers", "scaler",
                                              "counters", "extras"}
        for rank in (0, 1):
            shard = ckpt / rank_dir(rank)
            assert verify_checkpoint(str(shard)).status == "good"
            assert read_metadata(str(shard))["rank"] == rank
        streams = [read_state(str(ckpt / rank_dir(r)))["data"] for r in (0, 1)]
        assert streams[0] != streams[1]  # the ranks' data positions differ: sharded state

    # Rank 1's process is killed after iteration 5; Train restarts the worker group from
    # its newest registered checkpoint (iteration 4, or 2 if 4 was not registered yet when
    # the death was seen; all ranks restored) and the run ends bit-equal.
    marker = tmp_path / "killed"
    faulty, faulty_runs = _run(storage, "faulty", fault={"rank": 1, "iteration": 5, "marker": str(marker)},
                               max_failures=2)
    assert marker.exists(), "the worker was never killed"
    assert not faulty.errors, faulty.errors
    assert faulty[0].metrics["iteration"] == CONFIG["epochs"]
    reported = faulty[0].metrics_dataframe["iteration"].tolist()
    # restarted from a checkpoint, not from scratch: iteration 1 ran once
    assert reported.count(1) == 1 and sorted(set(reported)) == list(range(1, CONFIG["epochs"] + 1)), reported
    final_clean = read_state(str(_checkpoints(clean_runs)[-1]))["models"]["model"]
    final_faulty = read_state(str(_checkpoints(faulty_runs)[-1]))["models"]["model"]
    assert final_clean.keys() == final_faulty.keys()
    assert all(torch.equal(final_clean[k], final_faulty[k]) for k in final_clean)

