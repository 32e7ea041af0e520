"""KeepCheckpoints through real Tune runs: PBT (tunekit's and Ray's), HyperBand, a disk budget; bad arguments."""

from __future__ import annotations

import functools
import json
import random
import warnings
from pathlib import Path

import pytest
from ray import tune
from ray.tune.schedulers import HyperBandScheduler, PopulationBasedTraining

from tunekit import read_state, verify_checkpoint
from tunekit.callbacks import KeepCheckpoints, ParquetLogger
from tunekit.cli import main
from tunekit.schedule.pbt import pbt_setup, quiet_pbt_keep_warning
from tunekit.experiment.snapshot import read_experiment
from tunekit.trainables.toy_pbt import THETA0, ToyPBT, explore_h

TRIALS, ITERATIONS, EVERY = 8, 16, 2
H = [[1.0 - k / (TRIALS - 1), k / (TRIALS - 1)] for k in range(TRIALS)]


@pytest.mark.parametrize("kwargs, message", [
    ({"trial_latest": -1}, r"KeepCheckpoints\(trial_latest=-1\): expected a whole number >= 0"),
    ({"experiment_best": 2}, r"experiment_best and trial_best rank by a metric: give metric= and mode="),
    ({"trial_best": 1, "metric": "Q", "mode": "up"}, r"KeepCheckpoints\(mode='up'\): expected 'max' or 'min'"),
    ({"max_bytes": 0}, r"KeepCheckpoints\(max_bytes=0\): expected a whole number of bytes > 0"),
])
def test_bad_arguments_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KeepCheckpoints(**kwargs)


class _CountOnDisk(tune.Callback):
    """After every result: the checkpoint directories on disk (writes in flight are hidden until whole), once
    the deletions the policy decided (on its own thread) are done."""

    def __init__(self, experiment: Path, keep: KeepCheckpoints | None) -> None:
        self.experiment, self.keep, self.counts = experiment, keep, []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if self.keep is not None:
            self.keep.wait()
        self.counts.append(len(list(self.experiment.glob("*/checkpoint_*"))))


def _checkpoints(exp: Path) -> dict[str, list[tuple[int, float]]]:
    """Per trial (by its index): (iteration, Q) of each checkpoint on disk, from the checkpoints' own metadata."""
    out = {}
    for trial in read_experiment(str(exp)).trials:
        index = trial.name.split("_")[2]
        out[index] = sorted((c.iteration, c.metrics["Q"]) for c in trial.checkpoints)
    return out


def _pbt_sweep(storage: Path, name: str, scheduler: str, keep: KeepCheckpoints | None):
    """8 trials x 16 iterations, perturbation and checkpoint every 2, the trials sharing one slot (so the
    population's path follows from iteration counts alone, not from timing)."""
    quiet_pbt_keep_warning()
    explore = functools.partial(explore_h, rng=random.Random(0))
    setup = pbt_setup(ToyPBT, metric="Q", mode="max", perturbation_interval=EVERY, custom_explore_fn=explore)
    tune_config = setup.tune_config_kwargs()
    if scheduler == "ray":
        tune_config["scheduler"] = PopulationBasedTraining(
            time_attr="training_iteration", perturbation_interval=EVERY, custom_explore_fn=explore)
    counter = _CountOnDisk(storage / name, keep)
    random.seed(0)  # PBT's choice of donor
    grid = tune.Tuner(
        tune.with_resources(ToyPBT, {"cpu": 2}),
        param_space={"h": tune.grid_search(H), "lr": 0.1},
        tune_config=tune.TuneConfig(**tune_config),
        run_config=tune.RunConfig(name=name, storage_path=str(storage), stop={"training_iteration": ITERATIONS},
                                  checkpoint_config=setup.checkpoint_config, verbose=0,
                                  callbacks=[counter, ParquetLogger()] + ([keep] if keep else [])),
    ).fit()
    return grid, counter.counts


def _rows(exp: Path) -> dict[str, list[dict]]:
    """Per trial (by its index): its result rows in the order it reported them, from tunekit's own record
    (ParquetLogger). Not Ray's result.json: when Ray restarts a trial (an exploit) it copies the trial's
    result.json back from storage, which lags behind under load, and the rows since are lost (seen in CI)."""
    from tunekit.analysis import load_results

    out = {}
    for trial_id, group in load_results(str(exp), source="parquet").groupby("trial_id", sort=False):
        rows = group.sort_values("training_iteration", kind="stable").to_dict("records")
        for row in rows:
            h = row["config/h"]
            row["config"] = {"h": json.loads(h) if isinstance(h, str) else list(h), "lr": row["config/lr"]}
        out[trial_id.split("_")[1]] = rows
    return out


def _one_step(theta: tuple[float, float], config: dict) -> list[float]:
    """ToyPBT's SGD step on Q^ = 1.2 - (h0 theta0^2 + h1 theta1^2): theta_i *= 1 - 2 lr h_i."""
    return [t * (1 - 2 * config["lr"] * h) for t, h in zip(theta, config["h"])]


@pytest.mark.parametrize("scheduler", ["tunekit", "ray"])
def test_pbt_keeps_the_union_and_what_exploits_need_and_trains_as_if_it_kept_everything(
        ray_session, storage, scheduler):
    keep = KeepCheckpoints(experiment_best=2, trial_latest=1, metric="Q", mode="max")
    grid, counts = _pbt_sweep(storage, "kept", scheduler, keep)

    assert not grid.errors
    exploits = (storage / "kept" / "pbt_global.txt").read_text().splitlines()
    assert exploits, "no exploit happened: the test proves nothing"
    # Retention does not change training: every row is one exact step of ToyPBT from the state the trial had
    # at the iteration before, its own or (after an exploit) a donor's, as a run that kept everything trains.
    rows = _rows(storage / "kept")
    assert len(rows) == TRIALS
    before: dict[int, list[tuple[float, float]]] = {0: [THETA0]}  # the states reached at each iteration
    cloned = 0
    for n in range(1, ITERATIONS + 1):
        for index, trial_rows in sorted(rows.items()):
            for k, row in enumerate(trial_rows):
                if row["training_iteration"] != n:
                    continue
                theta = (row["theta0"], row["theta1"])
                sources = [s for s in before[n - 1] if _one_step(s, row["config"]) == pytest.approx(theta, rel=1e-12)]
                assert sources, f"trial {index}, iteration {n}: {theta} is no step from any state at {n - 1}"
                own = k > 0 and trial_rows[k - 1]["training_iteration"] == n - 1
                cloned += not own or (trial_rows[k - 1]["theta0"], trial_rows[k - 1]["theta1"]) not in sources
        before[n] = [(r["theta0"], r["theta1"]) for tr in rows.values() for r in tr if r["training_iteration"] == n]
    assert cloned > 0, "no trial went on from a donor's checkpoint: the test proves nothing"
    assert all(trial_rows[-1]["training_iteration"] == ITERATIONS for trial_rows in rows.values())
    # Never more than one per trial, the 2 best, and the one kept while the next is written.
    assert counts and max(counts) <= TRIALS + 2 + 1, counts
    # At the end exactly the union: each trial's newest and the experiment's 2 best of all ever written (a
    # checkpoint every EVERY iterations, each holding the Q of the row it was written after).
    written = [(row["Q"], index, row["training_iteration"]) for index, trial_rows in rows.items()
               for row in trial_rows if row["training_iteration"] % EVERY == 0]
    union = {(index, ITERATIONS) for index in rows} | {(t, i) for _, t, i in sorted(written, reverse=True)[:2]}
    on_disk = _checkpoints(storage / "kept")
    assert {(t, i) for t, cs in on_disk.items() for i, _ in cs} == union
    assert keep.deleted > 0
    # Ray's bookkeeping and tunekit's readers name no deleted checkpoint.
    for result in grid:
        for checkpoint, _ in result.best_checkpoints:
            assert Path(checkpoint.path).is_dir(), checkpoint.path
        assert Path(result.checkpoint.path).is_dir()
    assert verify_checkpoint(grid.get_best_result().checkpoint).ok
    assert main(["verify", str(storage / "kept")]) == 0
    assert main(["status", str(storage / "kept")]) == 0


def test_hyperband_resumes_each_paused_trial_from_its_own_latest_checkpoint(ray_session, storage):
    """HyperBand pauses trials and resumes the promising ones; ``trial_latest=1`` keeps what they resume from."""
    keep = KeepCheckpoints(trial_latest=1)
    grid = tune.Tuner(
        tune.with_resources(ToyPBT, {"cpu": 2}),
        param_space={"h": tune.grid_search(H), "lr": 0.1},
        tune_config=tune.TuneConfig(metric="Q", mode="max", reuse_actors=True,
                                    scheduler=HyperBandScheduler(time_attr="training_iteration", max_t=ITERATIONS,
                                                                 reduction_factor=2)),
        run_config=tune.RunConfig(name="hb", storage_path=str(storage), stop={"training_iteration": ITERATIONS},
                                  checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1), verbose=0,
                                  callbacks=[keep]),
    ).fit()
    assert not grid.errors
    paused = [r for r in grid if r.metrics["training_iteration"] > 1]
    assert keep.deleted > 0 and paused
    for result in grid:
        # ToyPBT is deterministic: theta_i after n steps of gradient ascent is 0.9 * (1 - 2 lr h_i) ** n.
        n, h = result.metrics["training_iteration"], result.config["h"]
        theta = read_state(result.checkpoint)["models"]["theta"]["theta"]
        expected = [0.9 * (1 - 2 * 0.1 * h_i) ** n for h_i in h]
        assert theta.tolist() == pytest.approx(expected, rel=1e-12), (n, h)
        assert [p.name for p in Path(result.path).glob("checkpoint_*")] == [Path(result.checkpoint.path).name]


def test_a_disk_budget_holds_within_a_checkpoint_per_running_trial_and_warns_once_when_nothing_can_go(ray_session, storage):
    sizes: list[int] = []

    class Sizes(tune.Callback):  # after the policy's decision on each new checkpoint, once its deletions are done
        def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
            keep.wait()
            sizes.append(sum(f.stat().st_size for f in (storage / "budget").glob("*/checkpoint_*/*")))

    one = 20 * 1024  # a ToyPBT checkpoint is about 17 KB: room for 4 or 5 of the 24 written
    keep = KeepCheckpoints(trial_latest=100, metric="Q", mode="max", max_bytes=4 * one)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grid = tune.Tuner(
            ToyPBT, param_space={"h": tune.grid_search(H[:2]), "lr": 0.1},
            run_config=tune.RunConfig(name="budget", storage_path=str(storage), stop={"training_iteration": 12},
                                      checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1), verbose=0,
                                      callbacks=[keep, Sizes()]),
        ).fit()
    assert not grid.errors and keep.deleted > 0
    largest = max(sum(f.stat().st_size for f in c.iterdir()) for c in (storage / "budget").glob("*/checkpoint_*"))
    # The budget is applied as each checkpoint is registered; meanwhile each of the 2 trials running side by
    # side may have one more on disk (being written, or whole but not registered yet).
    assert largest <= one and sizes and max(sizes) <= keep.max_bytes + 2 * largest, sizes
    assert not [w for w in caught if "KeepCheckpoints(max_bytes" in str(w.message)]

    tiny = KeepCheckpoints(max_bytes=1)  # nothing but what resume needs: one warning, training goes on
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grid = tune.Tuner(
            ToyPBT, param_space={"h": H[0], "lr": 0.1},
            run_config=tune.RunConfig(name="tiny", storage_path=str(storage), stop={"training_iteration": 4},
                                      checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1), verbose=0,
                                      callbacks=[tiny]),
        ).fit()
    assert not grid.errors and grid[0].metrics["training_iteration"] == 4
    said = [str(w.message) for w in caught if "KeepCheckpoints(max_bytes=1)" in str(w.message)]
    assert len(said) == 1 and "training goes on over the budget" in said[0], said


def test_on_s3_each_trial_keeps_its_newest_and_the_readers_agree(ray_session, s3_bucket):
    keep = KeepCheckpoints(trial_latest=1)
    grid = tune.Tuner(
        ToyPBT, param_space={"h": tune.grid_search(H[:2]), "lr": 0.1},
        run_config=tune.RunConfig(name="s3keep", storage_path=s3_bucket.uri(), stop={"training_iteration": 4},
                                  checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1), verbose=0,
                                  callbacks=[keep]),
    ).fit()
    assert not grid.errors and keep.deleted == 2 * 3
    checkpoints = {key.rsplit("/", 2)[-2] for key in s3_bucket.keys() if "/checkpoint_" in key}
    assert checkpoints == {"checkpoint_000003"}  # each trial's newest (indices count from 0)
    assert sorted(Path(r.checkpoint.path).name for r in grid) == ["checkpoint_000003"] * 2
    assert main(["verify", s3_bucket.uri("s3keep")]) == 0


def _scored(config):
    """Reports ``config["scores"]``, one an iteration, each with a checkpoint of its own (not tunekit's)."""
    import tempfile

    for i, score in enumerate(config["scores"], start=1):
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "w.txt").write_text(f"{config['k']}:{i}")
            tune.report({"score": score}, checkpoint=tune.Checkpoint.from_directory(d))


def test_finished_trials_settle_and_the_experiments_best_stays_whoever_holds_it(ray_session, storage):
    """Five trials of 3 checkpoints, one after another; the experiment's two best: trial 3's first (a score of
    100, kept although not its newest) and trial 0's newest. A finished trial holding only its newest is
    settled (not walked again); what it holds still competes for the experiment's best."""
    scores = {k: [10.0 * i - k for i in (1, 2, 3)] for k in range(5)}
    scores[3][0] = 100.0
    keep = KeepCheckpoints(trial_latest=1, experiment_best=2, metric="score", mode="max")
    seen: list[set[tuple[int, int]]] = []

    class Finished(tune.Callback):  # after KeepCheckpoints: what the finished trials hold once it is done
        def on_trial_complete(self, iteration, trials, trial, **info):
            keep.wait()
            done = [t for t in trials if t.status == "TERMINATED" or t is trial]
            seen.append({(t.config["k"], int(p.name.split("_")[1])) for t in done
                         for p in Path(t.path).glob("checkpoint_*")})

    grid = tune.Tuner(
        tune.with_resources(_scored, {"cpu": 2}),  # one at a time: each finishes before the next starts
        param_space={"k": tune.grid_search(list(range(5))), "scores": tune.sample_from(lambda s: scores[s.config.k])},
        run_config=tune.RunConfig(name="settle", storage_path=str(storage), verbose=0, callbacks=[keep, Finished()]),
    ).fit()
    assert not grid.errors
    assert keep.settled >= 3  # every trial but 3 (two kept) settles when it finishes
    # as the run goes, not only at its end: each finished trial's newest and the best two so far, nothing more
    def expected(j):
        so_far = sorted(((scores[k][i], k, i) for k in range(j + 1) for i in range(3)), reverse=True)
        return {(k, 2) for k in range(j + 1)} | {(k, i) for _, k, i in so_far[:2]}

    assert seen == [expected(j) for j in range(5)]
    left = {(r.config["k"], int(Path(p).name.split("_")[1])) for r in grid
            for p in (Path(r.path).glob("checkpoint_*"))}
    assert left == {(k, 2) for k in range(5)} | {(3, 0)}  # each newest (index 2), and trial 3's 100
    assert keep.deleted == 5 * 3 - len(left)


def _unsaved(config):
    """Reports two results, no checkpoint (a trial a scheduler stops before its first save)."""
    for score in (1.0, 2.0):
        tune.report({"score": score})


def test_trials_that_end_without_a_checkpoint_settle(ray_session, storage):
    """A finished trial that never saved (ASHA stops most trials before their first save) is settled like
    one whose checkpoints are all kept: otherwise each later checkpoint walks every such trial again."""
    keep = KeepCheckpoints(trial_latest=1)
    grid = tune.Tuner(
        tune.with_resources(_unsaved, {"cpu": 2}),
        param_space={"k": tune.grid_search(list(range(3)))},
        run_config=tune.RunConfig(name="unsaved", storage_path=str(storage), verbose=0, callbacks=[keep]),
    ).fit()
    assert not grid.errors and keep.deleted == 0
    # each settles at the next end it sees (Ray calls on_trial_complete before it marks the trial TERMINATED);
    # the last one's end is the run's
    assert keep.settled >= 2, keep.settled


def test_a_budget_counts_each_train_checkpoint_of_a_multi_worker_trial_once(tmp_path):
    """A multi-worker trial's Tune checkpoints are pointers of a few KB; ``max_bytes`` counts the Train
    checkpoints they name, each once (two pointers may name one), freed only with its last pointer."""
    from tunekit.experiment._snapshot_model import CheckpointSummary
    from tunekit.checkpoint import write_checkpoint
    from tunekit.multiworker.trial import write_pointer
    from tunekit.storage import directory_bytes

    trial = tmp_path / "exp" / "loop_00000"
    targets = []
    for i, size in ((1, 100_000), (2, 300_000)):
        target = trial / "train" / f"checkpoint_{i}"
        write_checkpoint(target, {"blob": bytes(size)}, metadata={"iteration": i})
        targets.append(str(target))
    named = [targets[0], targets[1], targets[1]]  # the third re-points at the second's (an at-end save)
    pointers = []
    for i, target in enumerate(named):
        write_pointer(str(trial / f"checkpoint_00000{i}"), target, "loop", {}, None)
        pointers.append(str(trial / f"checkpoint_00000{i}"))
    where = {p: (None, tune.Checkpoint(p)) for p in pointers}
    by_trial = {"t": [CheckpointSummary(Path(p).name, p, i + 1, {}) for i, p in enumerate(pointers)]}
    import pyarrow.fs as pafs

    fs = pafs.LocalFileSystem()
    small = sum(directory_bytes(fs, p) for p in pointers)
    train = [directory_bytes(fs, t) for t in targets]
    policy = KeepCheckpoints(trial_latest=3, max_bytes=small + train[0] + train[1])
    policy._targets = dict(zip(pointers, named))
    assert policy._over_budget(by_trial, where, set(pointers), set(), []) == []  # all of it fits: none goes
    policy.max_bytes = small + train[1]  # the oldest pointer goes, and its Train checkpoint with it
    assert policy._over_budget(by_trial, where, set(pointers), set(), []) == pointers[:1]
    policy.max_bytes = small  # the next pointer frees no Train checkpoint (the third names it): both go
    assert policy._over_budget(by_trial, where, set(pointers), set(), []) == pointers


def test_a_train_checkpoint_goes_with_the_unregistered_older_pointers_naming_it_and_stays_for_a_newer_one(tmp_path):
    """Seen in CI: a pointer written as Tune stopped a trial for PBT, never registered, named a Train checkpoint
    ``KeepCheckpoints`` deleted, and ``verify`` found a pointer to a missing checkpoint. Such a pointer goes
    first, then the Train checkpoint; one newer than every registered pointer is being written: it stays."""
    import pyarrow.fs as pafs

    from tunekit.callbacks.retention import _delete_train_checkpoint
    from tunekit.checkpoint import write_checkpoint
    from tunekit.multiworker.trial import write_pointer

    trial = tmp_path / "exp" / "loop_00000"
    targets = [str(trial / "train" / f"checkpoint_{i}") for i in range(3)]
    for i, target in enumerate(targets):
        write_checkpoint(target, {"w": bytes(8)}, metadata={"iteration": i})
    for index, target in ((0, targets[0]), (1, targets[0]), (2, targets[1]), (3, targets[2]), (4, targets[1])):
        write_pointer(str(trial / f"checkpoint_{index:06d}"), target, "loop", {}, None)
    fs = pafs.LocalFileSystem()
    # 000000 (doomed, forgotten by Ray, deleted beside) named targets[0]; so does 000001, never registered
    _delete_train_checkpoint(fs, targets[0], str(trial), {str(trial / "checkpoint_000002"),
                                                           str(trial / "checkpoint_000003")})
    assert not Path(targets[0]).exists() and not (trial / "checkpoint_000001").exists()
    assert (trial / "checkpoint_000002").exists() and Path(targets[1]).exists()
    # 000002 doomed: its Train checkpoint is named by 000004, newer than every registered pointer (in flight)
    _delete_train_checkpoint(fs, targets[1], str(trial), {str(trial / "checkpoint_000003")})
    assert Path(targets[1]).exists() and (trial / "checkpoint_000004").exists()
    assert (trial / "checkpoint_000003").exists() and Path(targets[2]).exists()
