"""The checkpoint-complete contract, written once, run against both reference trainables."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import ray
from ray import tune

from tests.support.fit import fit, only_result, tunekit_rows
from tests.support.contract import (
    DamageAndKill,
    DyingDigits,
    DyingTrainDigits,
    KillActorOnce,
    SmallDyingDigits,
    SmallDyingTrainDigits,
    checkpoint_iterations,
    end_actor,
    make_actor,
    run_actor,
    run_actor_saving_midway,
    worker_logs_mention,
)
import tunekit
from tunekit import read_metadata, read_state, verify_checkpoint, warm_start
from tunekit.testing import tensors_equal
from tunekit.callbacks import CheckpointByStepsTaken, ParquetLogger
from tunekit.experiment.snapshot import read_experiment
from tunekit.trainables import DigitsTrainable, TrainDigits

CONFIG = {"lr": 0.05, "momentum": 0.9, "hidden_size": 16, "batch_size": 32, "seed": 7, "steps_per_iteration": 7}


@pytest.fixture(params=["class", "function"])
def trainable(request):
    return {"class": DigitsTrainable, "function": TrainDigits}[request.param]


def _fit(trainable, storage, name, *, stop, config=None, callbacks=(), max_failures=0, errors_ok=False, **ckpt):
    return fit(trainable, storage, name, stop=stop, config=config or CONFIG, callbacks=callbacks,
               max_failures=max_failures, errors_ok=errors_ok, **ckpt)


@pytest.mark.floor
def test_resume_in_fresh_process_is_bit_exact(ray_session, trainable, storage):
    """Saved after 3 of 6 iterations, restored in a new worker that trains the other 3: the state and every
    result equal the first worker's."""
    full_results, half, full = run_actor_saving_midway(trainable, CONFIG, storage, "full", 6, 3)
    second_results, resumed = run_actor(trainable, CONFIG, storage, "second", 3, restore_from=half)

    a, b = read_state(full.checkpoint.path), read_state(resumed.checkpoint.path)
    assert tensors_equal(a["models"], b["models"]) == []
    assert tensors_equal(a["optimizers"], b["optimizers"]) == []
    assert tensors_equal(a["data"], b["data"]) == []
    assert tensors_equal(a["rng"], b["rng"]) == []
    assert a["counters"] == b["counters"] and a["counters"]["iteration"] == 6
    for key in ("loss", "accuracy", "train_loss"):
        assert [r[key] for r in full_results[3:]] == [r[key] for r in second_results]
    assert [r["training_iteration"] for r in second_results] == [4, 5, 6]


def test_second_save_of_one_iteration_is_a_checkpoint_of_its_own(ray_session, trainable, storage):
    """Tune may save one iteration twice (PBT's save and checkpoint_frequency): two checkpoints, no rewrite."""
    actor = make_actor(trainable, CONFIG, storage, "twice")
    try:
        ray.get([actor.train.remote() for _ in range(2)])
        first, second = (ray.get(actor.save.remote()).checkpoint.path for _ in range(2))
    finally:
        end_actor(actor)
    assert first != second and read_state(first)["counters"] == read_state(second)["counters"]
    # The second one's files are the first one's (hard links): nothing was written twice.
    assert os.stat(Path(first, "state.pt")).st_ino == os.stat(Path(second, "state.pt")).st_ino
    shutil.rmtree(first)  # what num_to_keep=1 does to the older one
    assert verify_checkpoint(second).ok


PLAIN = dict(stop=8, checkpoint_frequency=2, checkpoint_at_end=True)


@pytest.fixture(scope="module")
def plain_run(built_once):
    """The uninterrupted reference run of each trainable, run once for every test process; read-only."""
    cache = {}

    def get(trainable):
        if trainable not in cache:
            where = built_once(f"plain-{trainable.__name__}", lambda where: _fit(trainable, where, "plain", **PLAIN))
            cache[trainable] = only_result(where / "plain")
        return cache[trainable]

    return get


def test_killed_worker_finishes_with_same_weights(ray_session, trainable, storage, plain_run):
    kwargs = PLAIN
    plain = plain_run(trainable)
    kill = KillActorOnce(5)
    killed = _fit(trainable, storage, "killed", callbacks=[kill, ParquetLogger()], max_failures=2, **kwargs)[0]

    assert kill.killed
    df = tunekit_rows(killed)
    pids = list(dict.fromkeys(df["pid"]))
    assert len(pids) == 2, "the trial was not restarted in a new worker"
    before, after = (list(df[df["pid"] == pid]["training_iteration"]) for pid in pids)
    # Killed once it reported 5 (the worker may have reported one more before the kill landed),
    # then restarted from its newest checkpoint (every 2 iterations) and run to the end once.
    killed_at = before[-1]
    assert killed_at >= 5 and before == list(range(1, killed_at + 1)), before
    assert after == list(range(after[0], 9)) and (after[0] - 1) % 2 == 0 and after[0] <= killed_at + 1, after
    a, b = read_state(plain.checkpoint.path), read_state(killed.checkpoint.path)
    assert a["counters"]["iteration"] == b["counters"]["iteration"] == 8
    assert tensors_equal(a["models"], b["models"]) == []
    assert tensors_equal(a["optimizers"], b["optimizers"]) == []
    assert killed.metrics["accuracy"] == plain.metrics["accuracy"]


def test_killed_inside_a_background_write_resumes_bit_exact(ray_session, trainable, storage, plain_run, tmp_path):
    """SIGKILL inside the two-phase write of iteration 4's checkpoint, with num_to_keep=1.

    Tune has registered the checkpoint being written and deleted the one of iteration 2; the
    kept copy of that one is what the retry restores from, bit-exact. The class trainable dies
    in the middle of writing state.pt, the function trainable with every file written but the
    manifest (tests/tunekit/test_two_phase.py kills a writer at both points).
    """
    dying = {DigitsTrainable: DyingDigits, TrainDigits: DyingTrainDigits}[trainable]
    phase = "state" if trainable is DigitsTrainable else "manifest"
    died = tmp_path / "died"
    config = {**CONFIG, "die_at": 4, "die_in_write": phase, "die_marker": str(died)}
    killed = _fit(dying, storage, f"killwrite-{phase}", config=config, max_failures=2, num_to_keep=1,
                  callbacks=[ParquetLogger()], **PLAIN)[0]
    assert died.exists()

    df = tunekit_rows(killed)
    pids = list(dict.fromkeys(df["pid"]))
    assert len(pids) == 2, "the trial was not restarted in a new worker"
    before, after = (list(df[df["pid"] == pid]["training_iteration"]) for pid in pids)
    assert before[:4] == [1, 2, 3, 4] and after == list(range(3, 9)), (before, after)
    trial = Path(killed.path)
    assert worker_logs_mention(f"{trial.name}/.checkpoint_000000.kept (iteration 2)")
    plain = plain_run(trainable)
    a, b = read_state(plain.checkpoint.path), read_state(killed.checkpoint.path)
    assert tensors_equal(a["models"], b["models"]) == [] and tensors_equal(a["optimizers"], b["optimizers"]) == []
    # Nothing is left over: one checkpoint (num_to_keep=1), whole; no kept copy, no staging directory.
    assert sorted(p.name for p in trial.iterdir() if p.is_dir()) == [Path(killed.checkpoint.path).name]
    assert verify_checkpoint(killed.checkpoint.path).ok


def test_killed_inside_the_first_background_write_starts_afresh_bit_exact(ray_session, trainable, storage, plain_run,
                                                                        tmp_path):
    """SIGKILL inside the write of the trial's first checkpoint (iteration 2), which Tune has registered.

    Nothing complete came before it: the retry finds the dead writer's staging directory,
    starts the trial afresh (iterations 1, 2 run again) and ends bit-exact.
    """
    dying = {DigitsTrainable: DyingDigits, TrainDigits: DyingTrainDigits}[trainable]
    died = tmp_path / "died"
    config = {**CONFIG, "die_at": 2, "die_in_write": "state", "die_marker": str(died)}
    killed = _fit(dying, storage, "killfirst", config=config, max_failures=2, num_to_keep=1,
                  callbacks=[ParquetLogger()], **PLAIN)[0]
    assert died.exists()
    df = tunekit_rows(killed)
    pids = list(dict.fromkeys(df["pid"]))
    assert len(pids) == 2, "the trial was not restarted in a new worker"
    before, after = (list(df[df["pid"] == pid]["training_iteration"]) for pid in pids)
    assert before[:2] == [1, 2] and after == list(range(1, 9)), (before, after)
    trial = Path(killed.path)
    assert worker_logs_mention(f"{trial.name}/checkpoint_000000 was never completed")
    plain = plain_run(trainable)
    a, b = read_state(plain.checkpoint.path), read_state(killed.checkpoint.path)
    assert tensors_equal(a["models"], b["models"]) == [] and tensors_equal(a["optimizers"], b["optimizers"]) == []
    assert sorted(p.name for p in trial.iterdir() if p.is_dir()) == [Path(killed.checkpoint.path).name]


def test_warm_start_continue_equals_one_longer_run(ray_session, trainable, storage, plain_run):
    """A sweep warm-started from iteration 4's complete state ends where one run of 8 ends, bit-exact."""
    half = _fit(trainable, storage, "half", stop=4, checkpoint_at_end=True)[0]
    config = {**CONFIG, **warm_start(half.checkpoint, mode="continue")}
    warm = _fit(trainable, storage, "warm", config=config, **PLAIN)[0]
    plain = plain_run(trainable)
    assert list(warm.metrics_dataframe["training_iteration"]) == [5, 6, 7, 8]
    later = plain.metrics_dataframe[plain.metrics_dataframe["training_iteration"] > 4]
    assert list(warm.metrics_dataframe["loss"]) == list(later["loss"])
    a, b = read_state(plain.checkpoint.path), read_state(warm.checkpoint.path)
    assert tensors_equal(a["models"], b["models"]) == [] and tensors_equal(a["optimizers"], b["optimizers"]) == []
    assert b["counters"] == a["counters"]
    assert b["extras"]["tunekit/warm_start"] == {"checkpoint": half.checkpoint.path, "mode": "continue", "iteration": 4}


def test_warm_start_weights_only_starts_counting_afresh(ray_session, trainable, storage):
    half = _fit(trainable, storage, "src", stop=2, checkpoint_at_end=True)[0]
    config = {**CONFIG, "lr": 0.01, **warm_start(half.checkpoint, mode="weights")}
    tuned = _fit(trainable, storage, "finetune", config=config, stop=2, checkpoint_at_end=True)[0]
    assert list(tuned.metrics_dataframe["training_iteration"]) == [1, 2]
    sd = read_state(tuned.checkpoint.path)
    assert sd["counters"]["iteration"] == 2 and sd["extras"]["tunekit/warm_start"]["mode"] == "weights"
    assert sd["optimizers"]["optimizer"]["param_groups"][0]["lr"] == 0.01


def test_damaged_checkpoint_falls_back_to_newest_good_one(ray_session, trainable, storage, plain_run):
    kwargs = PLAIN
    plain = plain_run(trainable)
    damage = DamageAndKill(at=5)
    restored = _fit(trainable, storage, "fallback", callbacks=[damage, ParquetLogger()], max_failures=2, **kwargs)[0]

    assert damage.damaged == ["checkpoint_000001"]  # the one of iteration 4
    # Restored from iteration 2, the newest good checkpoint: 3, 4, 5 run again.
    assert sorted(tunekit_rows(restored)["training_iteration"]) == [1, 2, 3, 3, 4, 4, 5, 5, 6, 7, 8]
    a, b = read_state(plain.checkpoint.path), read_state(restored.checkpoint.path)
    assert tensors_equal(a["models"], b["models"]) == []
    assert tensors_equal(a["optimizers"], b["optimizers"]) == []
    assert worker_logs_mention("skipped damaged checkpoint") and worker_logs_mention(
        f"fallback/{Path(restored.path).name}/checkpoint_000001 is corrupt"
    )


def test_damaged_checkpoint_on_s3_falls_back(ray_session, trainable, s3_bucket):
    damage = DamageAndKill(at=5)
    restored = _fit(
        trainable, s3_bucket.uri("runs"), "s3fallback", callbacks=[damage, ParquetLogger()], max_failures=2,
        stop=6, checkpoint_frequency=2,
    )[0]
    assert damage.damaged == ["checkpoint_000001"]
    seen = tunekit_rows(restored)["training_iteration"].tolist()
    # Restored from iteration 2: 3, 4 and 5 ran twice.
    assert sorted(seen) == [1, 2, 3, 3, 4, 4, 5, 5, 6], seen
    assert worker_logs_mention("s3fallback/") and worker_logs_mention("restoring from " + s3_bucket.name)
    assert read_state(restored.checkpoint)["counters"]["iteration"] == 6


def test_killed_inside_a_checkpoint_write_on_s3_resumes_bit_exact(ray_session, trainable, s3_bucket, plain_run,
                                                                   tmp_path):
    """On S3 a save is written and uploaded before it returns: a kill inside it registers nothing."""
    dying = {DigitsTrainable: DyingDigits, TrainDigits: DyingTrainDigits}[trainable]
    died = tmp_path / "died"
    config = {**CONFIG, "die_at": 4, "die_in_write": "state", "die_after_step": False, "die_marker": str(died)}
    killed = _fit(dying, s3_bucket.uri("runs"), "s3killwrite", config=config, max_failures=2, num_to_keep=1,
                  callbacks=[ParquetLogger()], **PLAIN)[0]
    assert died.exists()
    seen = tunekit_rows(killed)["training_iteration"].tolist()
    assert [seen.count(i) for i in range(1, 9)] == [1, 1, 2, 2, 1, 1, 1, 1], seen  # resumed from iteration 2
    plain = plain_run(trainable)
    a, b = read_state(plain.checkpoint.path), read_state(killed.checkpoint)
    assert tensors_equal(a["models"], b["models"]) == [] and tensors_equal(a["optimizers"], b["optimizers"]) == []


def test_killed_inside_a_small_checkpoints_write_before_save_returned_resumes_bit_exact(
        ray_session, trainable, storage, plain_run, tmp_path):
    """A small state is written before ``save`` returns (no helper thread): SIGKILL inside that write, with
    num_to_keep=1. Tune registered nothing, so iteration 2's checkpoint is still there and the retry resumes
    from it; the dead writer's staging directory is tidied away."""
    dying = {DigitsTrainable: SmallDyingDigits, TrainDigits: SmallDyingTrainDigits}[trainable]
    phase = "state" if trainable is DigitsTrainable else "manifest"
    died = tmp_path / "died"
    config = {**CONFIG, "die_at": 4, "die_in_write": phase, "die_after_step": False, "die_marker": str(died)}
    killed = _fit(dying, storage, f"killsmall-{phase}", config=config, max_failures=2, num_to_keep=1,
                  callbacks=[ParquetLogger()], **PLAIN)[0]
    assert died.exists()
    seen = tunekit_rows(killed)["training_iteration"].tolist()
    assert [seen.count(i) for i in range(1, 9)] == [1, 1, 2, 2, 1, 1, 1, 1], seen  # resumed from iteration 2
    plain = plain_run(trainable)
    a, b = read_state(plain.checkpoint.path), read_state(killed.checkpoint.path)
    assert tensors_equal(a["models"], b["models"]) == [] and tensors_equal(a["optimizers"], b["optimizers"]) == []
    trial = Path(killed.path)
    assert sorted(p.name for p in trial.iterdir() if p.is_dir()) == [Path(killed.checkpoint.path).name]
    assert verify_checkpoint(killed.checkpoint.path).ok


def test_no_good_checkpoint_to_fall_back_to_fails_clearly(ray_session, trainable, storage):
    damage = DamageAndKill(at=5, damage=2)
    grid = _fit(
        trainable, storage, "nofallback", callbacks=[damage], max_failures=1, errors_ok=True,
        stop=8, checkpoint_frequency=2,
    )
    assert damage.damaged == ["checkpoint_000000", "checkpoint_000001"]
    error = str(grid[0].error)
    assert "checkpoint_000001 is corrupt" in error and "no good checkpoint before it" in error
    # Nothing the user had is touched: the damaged directories are still there.
    assert checkpoint_iterations(Path(grid[0].path)) == [2, 4]


@pytest.mark.parametrize(
    "config_extra, stop, ckpt, callbacks, expected",
    [
        ({}, 7, dict(checkpoint_frequency=3, checkpoint_at_end=True), [], [3, 6, 7]),
        ({}, 6, dict(checkpoint_frequency=3, checkpoint_at_end=True), [], [3, 6]),  # one per iteration
        ({}, 9, dict(checkpoint_at_end=False), [4], [4, 8]),
        ({"checkpoint_every": 4}, 9, dict(checkpoint_frequency=3, checkpoint_at_end=True), [], [3, 4, 6, 8, 9]),
        ({"checkpoint_every": 5}, 10, dict(checkpoint_frequency=5, checkpoint_at_end=True), [2], [2, 4, 5, 6, 8, 10]),
    ],
    ids=["frequency+at_end", "at_end-on-frequency", "callback", "trainable+frequency", "all-overlapping"],
)
def test_checkpoint_semantics(ray_session, trainable, storage, config_extra, stop, ckpt, callbacks, expected):
    config = {**CONFIG, "steps_per_iteration": 2, **config_extra}
    cbs = [CheckpointByStepsTaken(n) for n in callbacks]
    result = _fit(trainable, storage, "sem", stop=stop, config=config, callbacks=cbs, **ckpt)[0]
    assert checkpoint_iterations(Path(result.path)) == expected


def test_plain_function_checkpoints_on_request_and_resumes(ray_session, storage):
    from tunekit.trainables import train_digits

    config = {**CONFIG, "checkpoint_every": 2, "max_iterations": 4}
    grid = tune.Tuner(
        train_digits,
        param_space=config,
        run_config=tune.RunConfig(name="plainfn", storage_path=str(storage), verbose=0),
    ).fit()
    result = grid[0]
    assert result.error is None
    assert checkpoint_iterations(Path(result.path)) == [2, 4]
    assert result.metrics["training_iteration"] == 4


def test_a_save_right_after_restore_records_the_restored_metrics(ray_session, storage):
    """PBT may save a trial it just cloned before it trains again: that checkpoint says how good its state is."""
    _, first = run_actor(DigitsTrainable, CONFIG, storage, "m1", 2)
    actor = make_actor(DigitsTrainable, CONFIG, storage, "m2")
    try:
        ray.get(actor.restore.remote(first))
        again = ray.get(actor.save.remote())
    finally:
        end_actor(actor)
    metrics = read_metadata(first.checkpoint.path)["metrics"]
    assert "accuracy" in metrics and read_metadata(again.checkpoint.path)["metrics"] == metrics


def _seeds_function_api_example(config):
    """The seeds' function-API example as written: its own torch.save'd checkpoint each epoch."""
    import os
    import tempfile

    import torch
    from ray.tune import Checkpoint

    start = 1
    my_model = torch.nn.Linear(4, 2)
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            checkpoint_dict = torch.load(os.path.join(checkpoint_dir, "checkpoint.pt"))
        start = checkpoint_dict["epoch"] + 1
        my_model.load_state_dict(checkpoint_dict["model_state"])
    for epoch in range(start, config["epochs"] + 1):
        metrics = {"metric": 1, "epoch": epoch}
        with tempfile.TemporaryDirectory() as tempdir:
            torch.save({"epoch": epoch, "model_state": my_model.state_dict()}, os.path.join(tempdir, "checkpoint.pt"))
            tune.report(metrics=metrics, checkpoint=Checkpoint.from_directory(tempdir))


def test_a_function_reporting_its_own_checkpoints_is_retried_as_ray_would(ray_session, storage):
    """Wrapped by function_trainable, the seeds' example survives a killed worker: its checkpoints come back unverified."""
    grid = tune.Tuner(
        tunekit.function_trainable(_seeds_function_api_example),
        param_space={"epochs": 6},
        run_config=tune.RunConfig(
            name="seeds", storage_path=str(storage), callbacks=[KillActorOnce(at=4)],
            failure_config=tune.FailureConfig(max_failures=2), verbose=0,
        ),
    ).fit()
    assert not grid.errors, grid.errors
    (result,) = grid
    assert result.metrics["epoch"] == 6
    epochs = [row["epoch"] for row in read_experiment(str(storage / "seeds")).trials[0].results]
    assert epochs[-1] == 6 and set(range(1, 7)) <= set(epochs)
