"""Multi-worker trials (tunekit.multiworker): DDP and FSDP2 Ray Train loops inside Tune, two real gloo
workers on CPU; kills mid-epoch and inside a checkpoint write; every rank's part verified; resharding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import torch
from ray import tune

from tests.support.faults import flip_byte
from tests.tunekit.multiworker_loops import loop
from tunekit.checkpoint._manifest import verify_directory
from tunekit.checkpoint import verify_checkpoint, write_checkpoint
from tunekit.cli import main
from tunekit.multiworker import train_trial

CONFIG = {"seed": 3, "lr": 0.05, "epochs": 4, "steps": 3}


def _fake_two_rank_checkpoint(path: Path) -> Path:
    path.mkdir()
    (path / "ranks.json").write_text(json.dumps({"world_size": 2, "sharded": True}))
    write_checkpoint(path, {"counters": {"iteration": 1}}, metadata={"iteration": 1})
    for rank in (0, 1):
        (path / f"rank-{rank}").mkdir()
        (path / f"rank-{rank}" / f"__{rank}_0.distcp").write_bytes(bytes(range(256)) * 4)
        write_checkpoint(path / f"rank-{rank}", {"rng": rank}, metadata={"rank": rank})
    return path


def test_a_checkpoint_verifies_only_when_every_rank_part_does(tmp_path):
    ckpt = _fake_two_rank_checkpoint(tmp_path / "ckpt")
    assert verify_checkpoint(str(ckpt)).status == "good"
    # each rank may check only its share; a rank outside the checkpoint's world checks none
    assert verify_directory(pafs.LocalFileSystem(), str(ckpt), "c", ranks=[0]).ok
    flip_byte(pafs.LocalFileSystem(), str(ckpt / "rank-1"), "__1_0.distcp")
    report = verify_checkpoint(str(ckpt))
    assert report.status == "corrupt" and report.problems == ["rank-1/: __1_0.distcp: XXH3-128 differs from manifest"]
    assert verify_directory(pafs.LocalFileSystem(), str(ckpt), "c", ranks=[0]).ok
    for f in (ckpt / "rank-1").iterdir():
        f.unlink()
    (ckpt / "rank-1").rmdir()
    report = verify_checkpoint(str(ckpt))
    assert report.status == "incomplete"
    assert report.problems == ["rank-1/: missing (the checkpoint was written by 2 workers)"]


def test_verify_names_a_tune_checkpoint_whose_train_checkpoint_is_gone(tmp_path, capsys):
    """A multi-worker trial's Tune checkpoints point at its Train checkpoints; one whose target was deleted
    (Ray Train's ``num_to_keep``, a hand) is what a PBT clone or a resume cannot start from: damage."""
    import shutil

    from tunekit import verify_experiment
    from tunekit.multiworker.trial import write_pointer, train_checkpoint_of

    trial = tmp_path / "exp" / "loop_abc_00000"
    (trial / "train").mkdir(parents=True)
    (trial / "params.json").write_text("{}")
    for i in (1, 2):
        target = _fake_two_rank_checkpoint(trial / "train" / f"checkpoint_2026-11-26_0{i}")
        write_pointer(str(trial / f"checkpoint_00000{i - 1}"), str(target), "loop", {}, None)
    assert train_checkpoint_of(str(trial / "checkpoint_000001")) == str(target)
    assert verify_experiment(str(tmp_path / "exp")).ok
    shutil.rmtree(target)
    check = verify_experiment(str(tmp_path / "exp"))
    assert [(c.checkpoint, c.status, c.iteration) for c in check.checks if c.bad] == [
        ("checkpoint_000001", "incomplete", 1)]
    assert f"points at the multi-worker checkpoint {target}, which is missing" in check.checks[1].problems[0]
    assert main(["verify", str(tmp_path / "exp")]) == 1
    assert "checkpoint_000001" in capsys.readouterr().out


def test_check_and_a_session_outside_a_train_worker_say_what_is_wrong():
    from tunekit import TrainingState
    from tunekit.commands.check import as_trainable_class
    from tunekit.errors import ConfigError
    from tunekit.multiworker import WorkerSession

    with pytest.raises(ConfigError, match=r"'m:trial': a multi-worker trial made with train_trial\(lockstep=False\)"):
        as_trainable_class(train_trial(loop, lockstep=False), "m:trial")
    from tunekit.trainables.ddp import tune_ddp  # (runs a lockstep=False train_trial inside itself)

    with pytest.raises(ConfigError, match=r"'tunekit.trainables.ddp:tune_ddp': a multi-worker trial made with"):
        as_trainable_class(tune_ddp, "tunekit.trainables.ddp:tune_ddp")
    with pytest.raises(ConfigError, match=r"WorkerSession\(\): not inside a Ray Train worker"):
        WorkerSession(TrainingState(models={"m": torch.nn.Linear(2, 2)}))
    with pytest.raises(ConfigError, match=r"WorkerSession\(background='no'\): expected True or False"):
        WorkerSession(TrainingState(models={"m": torch.nn.Linear(2, 2)}), background="no")


def test_check_resumes_a_multi_worker_trial_in_a_new_process_bit_exactly(capsys):
    """``tunekit check`` on a 2-worker FSDP2 trial: each run a Ray of its own; run C saves after 2 iterations
    and a new process restores every rank's part and shard; metrics and every rank's saved part and shard
    bytes equal the uninterrupted run's. (Left out of the state, a rank's data position makes it FAIL: a
    difference in the loss after the resume; run by hand, 64 s.)"""
    config = {**CONFIG, "mode": "fsdp", "steps": 2, "every": 100, "report_restored": False}
    assert main(["check", "tests.tunekit.multiworker_loops:checked", "--config", json.dumps(config)]) == 0
    assert capsys.readouterr().out.startswith("PASS tests.tunekit.multiworker_loops:checked: 4 iterations")


def _grid(mode: str, storage: Path, tmp_path: Path, faults: dict[str, list[dict]], workers: int = 2,
          device: str = "cpu") -> dict[str, tune.Result]:
    """One Tune run, a trial per case, one at a time (each trial's 2 Train workers take the 2 CPUs)."""
    cases = []
    for name, kills in faults.items():
        (tmp_path / name).mkdir()
        kills = [{**kill, "marker": str(tmp_path / f"{name}-{i}.killed")} for i, kill in enumerate(kills)]
        cases.append({"name": name, "out": str(tmp_path / name), "faults": kills})
    trainable = tune.with_resources(train_trial(loop, workers=workers, cpus_per_worker=0.9, max_failures=3,
                                                use_gpu=device == "cuda"), {"cpu": 0.1})
    grid = tune.Tuner(
        trainable,
        param_space={**CONFIG, "mode": mode, "device": device, "case": tune.grid_search(cases)},
        tune_config=tune.TuneConfig(max_concurrent_trials=1),
        run_config=tune.RunConfig(name=mode, storage_path=str(storage), verbose=0),
    ).fit()
    assert not grid.errors, grid.errors
    return {r.config["case"]["name"]: r for r in grid}


def _final(tmp_path: Path, name: str) -> dict[str, torch.Tensor]:
    return torch.load(tmp_path / name / "final.pt", weights_only=True)


def _checkpoints(result: tune.Result) -> list[Path]:
    return sorted(p for p in (Path(result.path) / "train").glob("checkpoint_*") if p.is_dir())


def _killed_twice_finishes_bit_exact(mode: str, storage: Path, tmp_path: Path, workers: int = 2,
                                     device: str = "cpu") -> tuple[dict[str, torch.Tensor], list[Path]]:
    """The last rank dies mid-epoch in iteration 2, then inside its write of iteration 3 (its shard written,
    its manifest not): each time Train restarts every worker from the newest registered checkpoint. The
    final weights equal a clean trial's; every checkpoint of that trial holds every rank's part and verifies.
    Returns the clean trial's final weights and checkpoints."""
    last = workers - 1
    results = _grid(mode, storage, tmp_path, {
        "clean": [],
        "faulty": [{"rank": last, "iteration": 2, "step": 1}, {"rank": last, "iteration": 3, "phase": "manifest"}],
    }, workers=workers, device=device)
    assert sorted(p.name for p in tmp_path.glob("*.killed")) == ["faulty-0.killed", "faulty-1.killed"]
    faulty = results["faulty"].metrics
    assert faulty["iteration"] == CONFIG["epochs"]
    assert faulty["restored_from_iteration"] >= 1, faulty  # from a checkpoint, never from scratch
    clean, killed = _final(tmp_path, "clean"), _final(tmp_path, "faulty")
    assert clean.keys() == killed.keys()
    assert all(torch.equal(clean[k], killed[k]) for k in clean), f"{mode} on {device}: final weights differ"
    # The part rank 0 uploaded before the kill inside rank 1's write was removed by the trial's next save.
    assert all(verify_checkpoint(str(c)).ok for c in _checkpoints(results["faulty"])), _checkpoints(results["faulty"])
    checkpoints = _checkpoints(results["clean"])
    assert len(checkpoints) == CONFIG["epochs"]
    for ckpt in checkpoints:
        assert verify_checkpoint(str(ckpt)).ok
        assert sorted(p.name for p in ckpt.glob("rank-*")) == [f"rank-{r}" for r in range(workers)]
        shards = sorted(p.name for p in ckpt.glob("rank-*/*.distcp"))
        assert shards == ([f"__{r}_0.distcp" for r in range(workers)] if mode == "fsdp" else [])
    return clean, checkpoints


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_killed_mid_epoch_and_inside_a_write_finishes_bit_exact(mode, fresh_ray, storage, tmp_path, capsys):
    clean, checkpoints = _killed_twice_finishes_bit_exact(mode, storage, tmp_path)
    if mode == "fsdp":
        _reshards_and_falls_back(storage / mode, checkpoints, clean, tmp_path, capsys)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (NCCL)")
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_on_a_gpu_with_nccl_killed_mid_epoch_and_inside_a_write_finishes_bit_exact(mode, fresh_ray, storage,
                                                                                    tmp_path):
    """The same faults on one GPU worker (NCCL; one GPU holds one NCCL rank): model, optimizer and the CUDA
    RNG stream on the device; the checkpoint then restores on 2 CPU workers (gloo), resharded, bit-equal."""
    clean, checkpoints = _killed_twice_finishes_bit_exact(mode, storage, tmp_path, workers=1, device="cuda")
    if mode == "fsdp":  # written on a GPU by 1 rank, restored on CPUs by 2
        on_two = _restore(checkpoints[-1], 2, tmp_path / "on-two.pt")
        assert on_two["iteration"] == CONFIG["epochs"]
        assert all(torch.equal(on_two["weights"][k], clean[k]) for k in clean)


def _train(workers: int, run: Path, **config: Any) -> Any:
    """The FSDP loop in a plain Ray Train run of ``workers`` workers (no Tune)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    return TorchTrainer(loop, train_loop_config={**CONFIG, "mode": "fsdp", **config},
                        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 0.9}),
                        torch_config=TorchConfig(backend="gloo"),
                        run_config=RunConfig(name=run.name, storage_path=str(run.parent))).fit()


def _restore(checkpoint: Path, workers: int, dump: Path) -> dict:
    """Restore ``checkpoint`` in a Train run of ``workers`` workers; the whole state it restored."""
    _train(workers, dump.with_suffix(""), dump_restored=str(dump), resume_from=str(checkpoint))
    return torch.load(dump, weights_only=True)


def _reads_offline(experiment: Path, newest: Path, final: dict, tmp_path: Path) -> None:
    """The FSDP2 checkpoint read on this one CPU process, no Ray Train: the full state, the best model through
    its Tune pointer, and as a plain DCP directory that torch's own dcp_to_torch_save reads."""
    from torch import nn
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from tunekit.analysis import load_best_model
    from tunekit.checkpoint.loading import export_dcp, read_full_state

    full = read_full_state(str(newest))
    assert all(torch.equal(full["models"]["model"][k], final[k]) for k in final)
    assert full["optimizers"]["opt"]["state"] and full["counters"]["iteration"] == CONFIG["epochs"]
    model = load_best_model(str(experiment), nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)),
                            metric="iteration", mode="max")
    assert all(torch.equal(model.state_dict()[k], final[k]) for k in final)
    dcp_to_torch_save(export_dcp(str(newest), tmp_path / "dcp"), tmp_path / "full.pt")
    exported = torch.load(tmp_path / "full.pt", weights_only=True)
    assert all(torch.equal(exported["models"]["model"][k], final[k]) for k in final)


def _reshards_and_falls_back(experiment: Path, checkpoints: list[Path], final: dict, tmp_path: Path, capsys) -> None:
    from tunekit.checkpoint.loading import read_full_state

    _reads_offline(experiment, checkpoints[-1], final, tmp_path)
    # written by 2 workers, restored by 1 (resharded, the full state equal), which trains two more epochs and
    # writes a checkpoint of 1 worker after each
    (tmp_path / "one").mkdir()
    by_one = Path(_train(1, tmp_path / "one-run", epochs=CONFIG["epochs"] + 2, resume_from=str(checkpoints[-1]),
                         out=str(tmp_path / "one"), dump_restored=str(tmp_path / "on-one.pt"),
                         train_after_dump=True).checkpoint.path)
    on_one = torch.load(tmp_path / "on-one.pt", weights_only=True)
    assert on_one["iteration"] == CONFIG["epochs"]
    assert all(torch.equal(on_one["weights"][k], final[k]) for k in final)
    older = max(p for p in by_one.parent.glob("checkpoint_*") if p.is_dir() and p != by_one)
    for written in (by_one, older):
        assert json.loads((written / "ranks.json").read_text())["world_size"] == 1 and verify_checkpoint(str(written)).ok
    # one flipped shard: `tunekit verify` names it; a restore falls back to the newest checkpoint whose every
    # shard verifies, on every rank: by 2 workers, from the newest of the 1-worker run (flipped) to the one
    # before it, resharded the other way
    flip_byte(pafs.LocalFileSystem(), str(checkpoints[-1] / "rank-1"), "__1_0.distcp")
    assert main(["verify", str(experiment)]) == 1
    out = capsys.readouterr().out
    assert f"{checkpoints[-1].name}" in out and "rank-1/: __1_0.distcp: XXH3-128 differs from manifest" in out
    flip_byte(pafs.LocalFileSystem(), str(by_one / "rank-0"), "__0_0.distcp")
    on_two = _restore(by_one, 2, tmp_path / "on-two.pt")
    assert on_two["iteration"] == CONFIG["epochs"] + 1
    expected = read_full_state(str(older))["models"]["model"]
    assert expected.keys() == on_two["weights"].keys()
    assert all(torch.equal(on_two["weights"][k], expected[k]) for k in expected)


def test_tune_decides_the_checkpoints_of_a_multi_worker_trial_each_of_the_iteration_it_saw(fresh_ray, storage,
                                                                                             tmp_path, s3_bucket,
                                                                                             capsys):
    """The loop asks for no checkpoint; Tune's ``checkpoint_frequency=2``, ``checkpoint_at_end`` and a callback's
    ``should_checkpoint`` at iteration 3 each get a checkpoint of that very iteration from every rank (lockstep:
    the workers wait for Tune's decision on each report), and the at-end one holds the final weights. The
    experiment copied to S3 and from there to another local directory verifies in both places, its pointers
    naming the copy's own Train checkpoints, and a Train run restored from the copy has the final weights."""
    from tunekit.checkpoint._manifest import read_metadata
    from tunekit.multiworker.trial import train_checkpoint_of
    from tunekit.storage import resolve_storage

    class AtThree(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            if result["training_iteration"] == 3:
                result["should_checkpoint"] = True

    trainable = tune.with_resources(train_trial(loop, workers=2, cpus_per_worker=0.9, max_failures=0), {"cpu": 0.1})
    grid = tune.Tuner(
        trainable,
        param_space={**CONFIG, "mode": "fsdp", "epochs": 5, "every": 100, "out": str(tmp_path)},
        run_config=tune.RunConfig(name="lockstep", storage_path=str(storage), verbose=0, callbacks=[AtThree()],
                                  checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2,
                                                                          checkpoint_at_end=True)),
    ).fit()
    assert not grid.errors, grid.errors
    result = grid[0]
    assert result.metrics["iteration"] == 5
    pointers = sorted(Path(result.path).glob("checkpoint_0*"))
    targets = [train_checkpoint_of(str(p)) for p in pointers]
    iterations = [read_metadata(resolve_storage(t))["iteration"] for t in targets]
    assert iterations == [2, 3, 4, 5]  # each of the iteration Tune saw, none other (the loop asked for none)
    assert [read_metadata(resolve_storage(str(p)))["iteration"] for p in pointers] == iterations
    assert sorted(map(str, _checkpoints(result))) == sorted(targets)
    assert all(verify_checkpoint(t).ok for t in targets)
    copy = _copied_through_s3(Path(result.path).parent, s3_bucket, tmp_path / "copy", capsys)
    copied = train_checkpoint_of(str(copy / Path(result.path).name / pointers[-1].name))
    assert copied == str(copy / Path(targets[-1]).relative_to(Path(result.path).parent))
    at_end = _restore(Path(copied), 2, tmp_path / "at-end.pt")
    final = _final(tmp_path, "")
    assert at_end["iteration"] == 5 and all(torch.equal(at_end["weights"][k], final[k]) for k in final)


def _copied_through_s3(experiment: Path, s3_bucket, local: Path, capsys) -> Path:
    """``experiment`` copied to the S3 bucket and from there to ``local``, verified in each place."""
    from tunekit.storage import resolve_storage

    remote = resolve_storage(s3_bucket.uri("copied", experiment.name))
    pafs.copy_files(str(experiment), remote.path, source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=remote.filesystem)
    pafs.copy_files(remote.path, str(local), source_filesystem=remote.filesystem,
                    destination_filesystem=pafs.LocalFileSystem())
    for where in (remote.uri, str(local)):
        assert main(["verify", where]) == 0, capsys.readouterr().out
        assert " 0 incomplete, 0 corrupt" in capsys.readouterr().out
    return local


def _closing_after_each_stage(monkeypatch) -> None:
    """torch 2.11's DefaultStager, which closes itself at the end of each stage (pytorch/pytorch#183413; the
    second async_save with it raised ``KeyError: <class 'type'>`` on an H100): this torch made to do so."""
    from torch.distributed.checkpoint.staging import DefaultStager

    stage = DefaultStager._stage

    def stage_then_close(self, state_dict, **kwargs):
        try:
            return stage(self, state_dict, **kwargs)
        finally:
            self._state_dict_stager.close()

    monkeypatch.setattr(DefaultStager, "_stage", stage_then_close)


@pytest.mark.parametrize("torch_stager", ["reusable", "closes after each stage (torch 2.11)"])
def test_a_background_save_writes_the_state_of_its_copy_while_training_changes_it(tmp_path, torch_stager,
                                                                                  monkeypatch):
    """One rank (a gloo group of one, in this process): the save's copy is taken, training changes every
    weight and the optimizer's moments, then the write runs; the checkpoint holds the state at the copy.
    Three saves, each through the stager the one before left (as a WorkerSession keeps it, made before the
    first save: on torch 2.11 a check that staged the kept stager closed it, and the first save failed)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from tunekit import TrainingState
    from tunekit.multiworker._parts import load_parts, shard_stager, stage_parts
    from tunekit.trial.state import StateBuffers

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        def build() -> TrainingState:
            torch.manual_seed(0)
            model = fully_shard(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)))
            opt = torch.optim.AdamW(model.parameters(), lr=0.1)
            return TrainingState(models={"model": model}, optimizers={"opt": opt})

        def step(state: TrainingState) -> None:
            state.models["model"](torch.randn(2, 8)).pow(2).sum().backward()
            state.optimizers["opt"].step()

        if torch_stager != "reusable":
            _closing_after_each_stage(monkeypatch)
        state, stager, group = build(), shard_stager(), dist.new_group(backend="gloo")  # as WorkerSession does
        for save in range(1, 4):
            step(state)
            before = {k: v.full_tensor().clone() for k, v in state.models["model"].state_dict().items()}
            moments = state.optimizers["opt"].state_dict()["state"][0]["exp_avg"].full_tensor().clone()
            kept, stager = stager, shard_stager(stager)
            assert (stager is kept) == (torch_stager == "reusable")
            write = stage_parts(state, str(tmp_path / f"ckpt{save}"), rank=0, world_size=1, sharded=True,
                                metadata={"iteration": save}, buffers=StateBuffers(), process_group=group,
                                stager=stager)
            step(state)  # training goes on before the write
            assert not torch.equal(state.models["model"].state_dict()["0.weight"].full_tensor(), before["0.weight"])
            write()
            assert verify_checkpoint(str(tmp_path / f"ckpt{save}")).ok
            fresh = build()
            load_parts(fresh, str(tmp_path / f"ckpt{save}"), rank=0, world_size=1, written_by=1, sharded=True)
            after = {k: v.full_tensor() for k, v in fresh.models["model"].state_dict().items()}
            assert all(torch.equal(after[k], before[k]) for k in before)
            assert torch.equal(fresh.optimizers["opt"].state_dict()["state"][0]["exp_avg"].full_tensor(), moments)
    finally:
        dist.destroy_process_group()


def _pointer_experiment(exp: Path, *, relative: bool = True, iterations: int = 3) -> Path:
    """A multi-worker trial's directory as tunekit.multiworker leaves it: ``iterations`` Train checkpoints of two
    ranks each (``train/``), a Tune checkpoint (pointer) for each, result rows naming them."""
    from tunekit.multiworker.trial import write_pointer

    trial = exp / "loop_abc_00000"
    (trial / "train").mkdir(parents=True)
    (trial / "params.json").write_text("{}")
    rows = []
    for i in range(1, iterations + 1):
        target = _fake_two_rank_checkpoint(trial / "train" / f"checkpoint_2026-11-26_0{i}")
        write_checkpoint(target, {"counters": {"iteration": i}}, metadata={"iteration": i})
        write_pointer(str(trial / f"checkpoint_00000{i - 1}"), str(target), "loop", {}, None,
                      trial_path=str(trial) if relative else None)
        rows.append({"training_iteration": i, "step": i, "trial_id": "abc_00000",
                     "checkpoint_dir_name": f"checkpoint_00000{i - 1}"})
    (trial / "result.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return trial


def test_a_flipped_shard_is_never_named_best_and_gc_keeps_the_newest_good_pair(tmp_path, capsys):
    """A Tune checkpoint of a multi-worker trial is what its Train checkpoint is: a flipped byte in a shard of
    the newest makes its pointer damaged too in every reader; `gc --trial-latest 1` keeps the newest good
    pointer and the Train checkpoint it points at (nothing good is left to fall back to otherwise)."""
    from tunekit.analysis import best_checkpoint

    exp = tmp_path / "exp"
    trial = _pointer_experiment(exp)
    newest = trial / "train" / "checkpoint_2026-11-26_03"
    flip_byte(pafs.LocalFileSystem(), str(newest / "rank-1"), "__1_0.distcp")

    assert main(["status", str(exp), "--metric", "step", "--mode", "max"]) == 2
    out = capsys.readouterr().out
    best_line = next(line for line in out.splitlines() if line.startswith("best checkpoint"))
    assert "checkpoint_000001" in best_line and "checkpoint_000002" not in best_line, out
    assert main(["status", str(exp), "--metric", "step", "--mode", "max", "--json"]) == 2
    shown = json.loads(capsys.readouterr().out)
    assert "checkpoint_000002" not in json.dumps(shown.get("best") or shown.get("best_checkpoint"))
    assert best_checkpoint(str(exp), metric="step", mode="max").endswith("checkpoint_000001")
    assert main(["verify", str(exp)]) == 1
    out = capsys.readouterr().out
    pointer_line = next(line for line in out.splitlines() if "checkpoint_000002" in line)
    assert "points at train/checkpoint_2026-11-26_03, which is corrupt" in pointer_line, out

    assert main(["gc", str(exp), "--trial-latest", "1", "--yes"]) == 0
    capsys.readouterr()
    left = sorted(p.name for p in trial.iterdir() if p.name.startswith("checkpoint_")) + \
        sorted(f"train/{p.name}" for p in (trial / "train").iterdir())
    assert "checkpoint_000001" in left and "train/checkpoint_2026-11-26_02" in left, left
    assert verify_checkpoint(str(trial / "train" / "checkpoint_2026-11-26_02")).ok


@pytest.mark.parametrize("relative", [True, False], ids=["relative", "absolute (before 2026-12-01)"])
def test_a_moved_experiment_keeps_its_pointers(tmp_path, capsys, relative):
    """Renamed (or copied elsewhere): every pointer finds its Train checkpoint in the experiment's new place,
    written relative or, by an older tunekit, absolute; one whose target is gone there is damage."""
    import shutil

    from tunekit.multiworker.trial import train_checkpoint_of

    _pointer_experiment(tmp_path / "exp", relative=relative)
    moved = tmp_path / "moved"
    shutil.move(str(tmp_path / "exp"), str(moved))
    trial = moved / "loop_abc_00000"
    assert main(["verify", str(moved)]) == 0
    assert "3 good" in capsys.readouterr().out.replace("6 good", "3 good")
    assert train_checkpoint_of(str(trial / "checkpoint_000002")) == str(trial / "train" / "checkpoint_2026-11-26_03")
    shutil.rmtree(trial / "train" / "checkpoint_2026-11-26_03")
    assert main(["verify", str(moved)]) == 1
    assert "checkpoint_2026-11-26_03, which is missing" in capsys.readouterr().out


def test_an_interrupted_shard_write_is_not_damage_and_gc_leftovers_removes_it(tmp_path, capsys):
    """A rank killed inside its write leaves a Train checkpoint with a rank's part and no manifest over all,
    which no Tune checkpoint points at: interrupted, not damage; `gc --leftovers` removes it."""
    exp = tmp_path / "exp"
    trial = _pointer_experiment(exp, iterations=2)
    import shutil

    cut = trial / "train" / "checkpoint_2026-11-26_09"
    (cut / "rank-0").mkdir(parents=True)
    write_checkpoint(cut / "rank-0", {"rng": 0}, metadata={"rank": 0})
    half = trial / "train" / "checkpoint_2026-11-26_08"  # rank 0's parts uploaded, rank 1 killed in its write
    half.mkdir()
    (half / "ranks.json").write_text(json.dumps({"world_size": 2, "sharded": True}))
    write_checkpoint(half, {"counters": {"iteration": 3}}, metadata={"iteration": 3})  # (over rank 0's files)
    shutil.copytree(trial / "train" / "checkpoint_2026-11-26_02" / "rank-0", half / "rank-0")
    assert main(["verify", str(exp)]) == 0
    out = capsys.readouterr().out
    for name in ("_08", "_09"):
        assert "interrupted: a write that never completed" in next(l for l in out.splitlines() if name in l), out
    assert main(["status", str(exp)]) == 0
    capsys.readouterr()
    assert main(["gc", str(exp), "--leftovers", "--yes"]) == 0
    capsys.readouterr()
    assert not cut.exists() and not half.exists() and (trial / "train" / "checkpoint_2026-11-26_02").exists()


def test_more_workers_than_the_cluster_has_are_refused_in_one_line(ray_session, storage):
    """8 workers on a 2-CPU Ray would wait forever for Train's worker group: refused at once, at
    train_trial(...) and when a trial's config asks for them."""
    from tunekit.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        train_trial(loop, workers=8)
    said = str(refused.value)
    assert "\n" not in said and "8 workers need 8 CPUs at once; the Ray cluster has 2 CPUs" in said, said
    trainable = tune.with_resources(train_trial(loop, workers=1, cpus_per_worker=0.9), {"cpu": 0.1})
    grid = tune.Tuner(trainable, param_space={**CONFIG, "mode": "ddp", "workers": 8},
                      run_config=tune.RunConfig(name="too-many", storage_path=str(storage), verbose=0)).fit()
    assert len(grid.errors) == 1
    assert "the trial's config)(workers=8): 8 workers need 7.2 CPUs at once" in str(grid.errors[0])
