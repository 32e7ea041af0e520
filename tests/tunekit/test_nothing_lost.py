"""Nothing lost when a worker dies inside a checkpoint write: the three ways a trial lost its checkpoints
under real kills, each closed, proven with real processes and real SIGKILLs.

1. Ray's checkpoint index lags after a killed write: a new worker was handed an index a checkpoint had been
   announced under, Ray registered one path twice and deleted it, and the save that had replaced it failed.
   Now an announced checkpoint exists from the moment it is announced (an empty directory the commit
   renames onto), and an index is never announced twice (``claim_index``).
2. With actor reuse, a worker handed to a new trial waited in ``reset`` for the previous trial's write; a kill
   there reached Tune twice and errored the new trial. ``reset`` no longer waits.
3. A PBT clone's pin was removed once read, while Ray still named it as the clone's checkpoint. It now lives
   until the clone has a complete checkpoint of its own, and a fallback goes to it, not to the clone's
   checkpoints from before the exploit.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import torch

from tunekit import read_metadata, read_state, verify_checkpoint, write_checkpoint
from tunekit.trial._restoring import prepare_restore, remove_temps
from tunekit.checkpoint._announced import INDEX_FILE, announce, claim_index
from tunekit.checkpoint._pins import PIN_RECORD, pin_checkpoint
from tunekit.trial._saving import Durability, commit_checkpoint
from tunekit.checkpoint._trial_dir import stage_checkpoint, writer_id


def test_an_index_is_never_announced_twice(tmp_path):
    trial = tmp_path / "trial"
    (trial / "checkpoint_000003").mkdir(parents=True)
    (trial / ".checkpoint_000005.partial-host-1-abc").mkdir()  # an interrupted write of index 5
    assert claim_index(str(trial), 2) == 6  # Ray's lagging counter says 2
    shutil.rmtree(trial / ".checkpoint_000005.partial-host-1-abc")  # tidied away after the next commit
    shutil.rmtree(trial / "checkpoint_000003")  # deleted by num_to_keep
    assert claim_index(str(trial), 4) == 7  # the record of what was claimed outlives both
    assert claim_index(str(trial), 10) == 10  # Ray's counter ahead: it is followed
    assert (trial / INDEX_FILE).read_text() == "10"


def test_a_checkpoint_written_before_its_save_returns_takes_an_unused_index_without_a_record(tmp_path):
    """Nothing is announced before it is whole: the names in the directory are the record."""
    trial = tmp_path / "trial"
    (trial / "checkpoint_000003").mkdir(parents=True)  # complete, never registered: Ray's counter says 2
    (trial / ".checkpoint_000004.partial-host-1-abc").mkdir()  # its writer was killed
    assert claim_index(str(trial), 2, record=False) == 5
    assert not (trial / INDEX_FILE).exists()
    (trial / INDEX_FILE).write_text("9")  # two-phase saves of the trial claimed up to 9: still honoured
    assert claim_index(str(trial), 2, record=False) == 10 and (trial / INDEX_FILE).read_text() == "9"
    assert claim_index(str(tmp_path / "new"), 0, record=False) == 0 and not (tmp_path / "new").exists()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _interrupted(final: Path) -> None:
    """What a two-phase save leaves when its worker is SIGKILLed inside the write: the announced empty
    directory and the staging directory of a writer that is gone."""
    announce(str(final))
    host = writer_id().rsplit("-", 1)[0]
    (final.parent / f".{final.name}.partial-{host}-{_dead_pid()}-x1").mkdir()


TRAINER = textwrap.dedent(
    """
    import json, os, sys, time
    import tunekit.checkpoint._faults as faults
    import tunekit.checkpoint._directory as checkpoint
    from tunekit import _ray
    from tunekit.trial._saving import drain_writes
    from tunekit.trainables import DigitsTrainable

    root, index, restore, go = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    storage = _ray.offline_storage(root, "trial")  # no Ray needed in this process
    storage.current_checkpoint_index = index  # what the driver hands a new worker
    DigitsTrainable.background_saves_min_bytes = 0  # two-phase saves, although the state is small
    trainable = DigitsTrainable(config={"hidden_size": 8, "steps_per_iteration": 2}, storage=storage)
    if restore:
        trainable.restore(restore)
    trainable.train()
    saved = trainable.save()
    drain_writes()
    print(json.dumps({"first": saved.checkpoint.path, "iteration": trainable.iteration}), flush=True)
    if go:
        def hold(phase):  # inside the next write, every file but the manifest written: stop here
            if phase == "manifest":
                open(go, "w").close()
                time.sleep(3600)
        faults.hook = hold
        trainable.train()
        print(json.dumps({"announced": trainable.save().checkpoint.path}), flush=True)
        time.sleep(3600)
    """
)


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 600  # only keeps a broken run from hanging; nothing asserts on time
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the worker never reached the write"
        time.sleep(0.02)


def test_a_worker_killed_inside_a_write_then_handed_a_lagging_index_never_reuses_it(tmp_path):
    """Mechanism 1, with a real worker process SIGKILLed inside its two-phase write."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    go = tmp_path / "held"
    worker = subprocess.Popen([sys.executable, "-c", TRAINER, str(tmp_path), "-1", "", str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _wait_for(go, worker)
    finally:
        worker.send_signal(signal.SIGKILL)
        out, _ = worker.communicate(timeout=60)
    first = json.loads(out.splitlines()[0])["first"]
    trial = Path(first).parent
    announced = trial / "checkpoint_000001"
    assert announced.is_dir() and os.listdir(announced) == []  # announced: it exists, empty, never completed

    # The next worker is handed Ray's counter as if the registration of checkpoint_000001 had been lost
    # (index 0: its next save would be checkpoint_000001 again), and restores what Ray registered last.
    again = subprocess.run([sys.executable, "-c", TRAINER, str(tmp_path), "0", str(announced), ""],
                           capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    result = json.loads(again.stdout.splitlines()[-1])
    assert result["iteration"] == 2  # went on from iteration 1 (the newest complete checkpoint), not afresh
    assert Path(result["first"]).name == "checkpoint_000002"  # never the announced checkpoint_000001 again
    assert verify_checkpoint(result["first"]).ok and verify_checkpoint(first).ok
    assert read_state(result["first"])["counters"]["iteration"] == 2


def _reports_after_a_lost_registration(config):
    """A function trial whose directory holds ``checkpoint_000000`` from an earlier worker whose report Tune
    never registered (Ray's counter still says -1): it reports two checkpoints of its own through tunekit."""
    from ray import tune

    from tunekit import _ray

    trial = Path(tune.get_context().get_storage().trial_fs_path)
    earlier = trial / "checkpoint_000000"
    earlier.mkdir(parents=True, exist_ok=True)
    (earlier / "written-by").write_text("the earlier worker")
    for step in (1, 2):
        own = trial.parent / f"report-{trial.name}-{step}"
        own.mkdir(exist_ok=True)
        (own / "written-by").write_text(f"step {step}")
        _ray.report_with_checkpoint({"step": step}, str(own))


def test_a_reported_checkpoint_never_goes_into_a_directory_an_earlier_worker_wrote(ray_session, tmp_path):
    """Multi-worker trials report their pointers through Ray's ``tune.report``, which persists into
    ``checkpoint_<Ray's counter>``; a lagging counter (seen in CI: a donor's pointer written twice as
    ``checkpoint_000001``) must not make it write into, and over, a checkpoint directory already there."""
    from ray import tune

    grid = tune.Tuner(_reports_after_a_lost_registration,
                      run_config=tune.RunConfig(storage_path=str(tmp_path), name="lag", verbose=0)).fit()
    assert not grid.errors, grid.errors
    trial = Path(grid[0].path)
    assert (trial / "checkpoint_000000" / "written-by").read_text() == "the earlier worker"
    assert sorted(p.name for p in trial.glob("checkpoint_0*")) == ["checkpoint_000000", "checkpoint_000001",
                                                                     "checkpoint_000002"]
    assert Path(grid[0].checkpoint.path).name == "checkpoint_000002"
    assert (Path(grid[0].checkpoint.path) / "written-by").read_text() == "step 2"
    assert [p.name for p in trial.glob("checkpoint_000001/*")] == ["written-by"]


def test_a_worker_handed_to_a_new_trial_does_not_wait_for_the_previous_trials_write(tmp_path, caplog, monkeypatch):
    """Mechanism 2: ``reset`` (actor reuse) returns while the previous trial's write is still in flight;
    that write completes afterwards, and its failure is logged for that trial, never raised to the new one."""
    monkeypatch.chdir(os.getcwd())  # a Trainable moves into its trial's working directory: come back after
    import tunekit.checkpoint._faults as faults
    from tunekit import _ray
    from tunekit.trial._saving import drain_writes
    from tunekit.trainables import DigitsTrainable

    monkeypatch.setattr(DigitsTrainable, "background_saves_min_bytes", 0)  # two-phase, although small
    config = {"hidden_size": 8, "steps_per_iteration": 2}
    release, failing = threading.Event(), threading.Event()

    def hold(phase: str) -> None:
        if phase == "manifest":
            release.wait(600)
            if failing.is_set():
                raise OSError("the disk went away")

    storage = _ray.offline_storage(str(tmp_path), "a")
    trainable = DigitsTrainable(config=config, storage=storage)
    faults.hook = hold
    try:
        trainable.train()
        saved = trainable.save()  # announced; its write is held inside
        assert trainable.reset({**config, "lr": 0.2}, storage=_ray.offline_storage(str(tmp_path), "b"))
        assert not release.is_set(), "reset waited for the previous trial's write"
        release.set()
        drain_writes()
        assert verify_checkpoint(saved.checkpoint.path).ok  # the previous trial's checkpoint completed

        release.clear()
        failing.set()
        trainable.train()
        doomed = trainable.save()
        assert trainable.reset({**config, "lr": 0.3}, storage=_ray.offline_storage(str(tmp_path), "c"))
        release.set()
        drain_writes()
        failing.clear()
        trainable.train()
        later = trainable.save()  # the new trial's save: the old write's failure is not raised here
        drain_writes()
        assert verify_checkpoint(later.checkpoint.path).ok
        assert not verify_checkpoint(doomed.checkpoint.path).ok
        assert "the disk went away" in caplog.text
    finally:
        faults.hook = None
        release.set()
        trainable.stop()


def test_a_pbt_clone_killed_before_its_next_checkpoint_completes_goes_on_from_the_donors_state(tmp_path):
    """Mechanism 3: the pin the clone restored from stays until the clone has a complete checkpoint of its
    own; a kill before that restores from the pin, never from the clone's checkpoints before the exploit."""
    fs = pafs.LocalFileSystem()
    donor, clone = tmp_path / "exp" / "donor", tmp_path / "exp" / "clone"
    write_checkpoint(donor / "checkpoint_000004", {"w": torch.ones(8)}, metadata={"iteration": 4})
    write_checkpoint(clone / "checkpoint_000001", {"w": torch.zeros(8)}, metadata={"iteration": 2})
    pin = pin_checkpoint(fs, str(donor / "checkpoint_000004"), 4)
    assert pin is not None

    result, temps = prepare_restore(pin, trial_dir=str(clone))  # the exploit: the clone reads the pin
    assert torch.equal(read_state(result.checkpoint.path)["w"], torch.ones(8))
    remove_temps(temps)  # the state is loaded
    assert os.path.isdir(pin), "the pin went while Ray still names it as the clone's checkpoint"
    shutil.rmtree(donor / "checkpoint_000004")  # the donor's num_to_keep moves on; the pin holds the state

    # The clone's next save is announced, then its worker is killed inside the write.
    index = claim_index(str(clone), 2)
    _interrupted(clone / f"checkpoint_{index:06d}")
    # Restoring Ray's newest registered checkpoint for the clone: the donor's state, not the clone's own
    # checkpoint from before the exploit.
    result, temps = prepare_restore(str(clone / f"checkpoint_{index:06d}"), trial_dir=str(clone))
    assert torch.equal(read_state(result.checkpoint.path)["w"], torch.ones(8))
    assert result.metrics["training_iteration"] == 4
    remove_temps(temps)

    # Once a checkpoint of the clone newer than the exploit is complete, the pin goes.
    newer = str(clone / f"checkpoint_{claim_index(str(clone), 0):06d}")
    commit_checkpoint(stage_checkpoint(newer), newer,
                      lambda d: write_checkpoint(d, {"w": torch.ones(8) * 2}, metadata={"iteration": 5}), Durability())
    assert not os.path.exists(pin) and (clone / PIN_RECORD).exists()  # kept, marked released
    # Ray names the pin until the driver registers that checkpoint; killed first, it asks for the pin: the
    # clone goes on from its own checkpoint after the exploit, not from the donor's others, and no error.
    write_checkpoint(donor / "checkpoint_000006", {"w": torch.ones(8) * 7}, metadata={"iteration": 6})
    result, temps = prepare_restore(pin, trial_dir=str(clone))
    assert result.checkpoint.path == newer and result.metrics["training_iteration"] == 5
    assert torch.equal(read_state(result.checkpoint.path)["w"], torch.ones(8) * 2)
    remove_temps(temps)
    assert not os.path.exists(pin)  # (a restore of a gone pin adopts nothing)


def test_an_announced_checkpoint_whose_writer_died_is_missing_for_a_restore(tmp_path):
    """A trial whose first write died starts afresh; a later one falls back to its newest complete one."""
    trial = tmp_path / "exp" / "trial"
    _interrupted(trial / f"checkpoint_{claim_index(str(trial), 0):06d}")
    result, _ = prepare_restore(str(trial / "checkpoint_000000"), trial_dir=str(trial))
    assert result is None  # its first write never completed: afresh, as without a checkpoint
    write_checkpoint(trial / "checkpoint_000001", {"w": torch.ones(3)}, metadata={"iteration": 3})
    _interrupted(trial / f"checkpoint_{claim_index(str(trial), 0):06d}")
    report = verify_checkpoint(str(trial / "checkpoint_000002"))
    assert report.status == "incomplete" and "announced" in report.problems[0]
    result, _ = prepare_restore(str(trial / "checkpoint_000002"), trial_dir=str(trial))
    assert Path(result.checkpoint.path).name == "checkpoint_000001"
    # What Ray registered and asked for now holds the state the trial goes on from: it exists and verifies.
    assert verify_checkpoint(str(trial / "checkpoint_000002")).ok
    assert read_metadata(str(trial / "checkpoint_000002"))["iteration"] == 3


def test_a_checkpoint_ray_is_deleting_is_left_to_ray_and_a_dead_writers_announcement_is_dropped(tmp_path):
    """Seen in CI: Ray's ``num_to_keep`` was deleting a registered checkpoint (pyarrow removes its files, then
    the directory) when the trial's next write completed; that commit took the emptied directory for an
    announcement nobody registered, removed it first, and Ray logged its failed deletion with a traceback.
    Only an empty directory beside its dead writer's staging directory is removed."""
    trial = tmp_path / "trial"
    being_deleted = trial / "checkpoint_000000"
    write_checkpoint(being_deleted, {"w": torch.zeros(4)}, metadata={"iteration": 1})
    for child in list(being_deleted.iterdir()):  # Ray's deletion, half done: the files gone, the directory not
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    _interrupted(trial / "checkpoint_000001")  # never registered: its worker was SIGKILLed inside the write
    final = str(trial / "checkpoint_000002")
    commit_checkpoint(stage_checkpoint(final), final,
                      lambda d: write_checkpoint(d, {"w": torch.ones(4)}, metadata={"iteration": 2}), Durability())
    assert sorted(os.listdir(trial)) == ["checkpoint_000000", "checkpoint_000002"]
    pafs.LocalFileSystem().delete_dir(str(being_deleted))  # Ray's deletion completes: it finds its directory
    assert verify_checkpoint(final).ok


@pytest.mark.parametrize("kind", ["class", "function"])
def test_a_clone_saved_before_it_reported_says_whose_state_it_holds_when_restored_from_that_save(kind, tmp_path):
    """Seen in the chaos injector's ``driver`` scenario (rows 12-13 "lost"): a PBT clone's first result names
    the donor (``tunekit/restored_from``); a driver killed before that row was kept, then the clone restored
    from its own checkpoint saved just after the exploit, must name the donor again, or the jump in its
    iterations reads as rows lost. A retry from a checkpoint saved once the donor was reported names itself."""
    from tunekit import _ray
    from tunekit._keys import RESTORED_FROM_KEY
    from tunekit.trainables import DigitsTrainable, TrainDigits

    cls = DigitsTrainable if kind == "class" else TrainDigits
    config = {"hidden_size": 8, "steps_per_iteration": 2, "seed": 1}

    def worker(trial):
        return cls(config=config, storage=_ray.offline_storage(str(tmp_path), trial))

    donor = worker("donor")
    try:
        for _ in range(3):
            donor.train()
        donated = donor.save()
    finally:
        donor.stop()
    clone = worker("clone")
    try:
        clone.train()
        clone.restore(donated)  # the exploit
        saved = clone.save()  # PBT saves the clone before it reports (its worker is killed then)
    finally:
        clone.stop()
    again = worker("clone")  # the retry, from the clone's own checkpoint
    try:
        again.restore(saved)
        assert again.train()[RESTORED_FROM_KEY] == "donor"
        reported = again.save()  # the donor is in a result now: this one is the clone's own state
    finally:
        again.stop()
    last = worker("clone")
    try:
        last.restore(reported)
        assert last.train()[RESTORED_FROM_KEY] == "clone"
    finally:
        last.stop()


@pytest.mark.parametrize("kind", ["class", "function"])
def test_a_save_right_after_an_in_place_clone_is_registered_at_the_state_it_holds(kind, tmp_path):
    """At a perturbation tunekit's scheduler hands the clone to the trial's worker before Tune's frequency save
    for the same result: that save holds the donor's state, so Ray must register it under the donor's
    iteration, and a restore from a checkpoint registered at another iteration than its state's goes on at the
    state's. Else a resumed clone counts from its old iteration on a state ahead of it and trains past its stop."""
    from ray.train._internal.checkpoint_manager import _TrainingResult

    from tunekit import _ray
    from tunekit.trainables import DigitsTrainable, TrainDigits

    cls = DigitsTrainable if kind == "class" else TrainDigits
    config = {"hidden_size": 8, "steps_per_iteration": 2, "seed": 1}

    def worker(trial):
        return cls(config=dict(config), storage=_ray.offline_storage(str(tmp_path), trial))

    donor = worker("donor")
    try:
        for _ in range(5):
            donor.train()
        donated = donor.save()
    finally:
        donor.stop()
    assert donated.metrics["training_iteration"] == 5
    clone = worker("clone")
    try:
        for _ in range(2):
            clone.train()
        clone.tunekit_clone(dict(config, seed=2), donated, _ray.offline_storage(str(tmp_path), "clone"))
        saved = clone.save()  # Tune's frequency save at the result the exploit was decided on
    finally:
        clone.stop()
    if kind == "function":  # the training function has not run since the reset: nothing to register
        assert saved.checkpoint is None
    else:
        assert read_metadata(saved.checkpoint.path)["iteration"] == 5
        assert saved.metrics["training_iteration"] == 5

    # A checkpoint registered at iteration 2 whose state is at 5 (what a tunekit before this fix registered):
    drifted = _TrainingResult(checkpoint=donated.checkpoint, metrics={**donated.metrics, "training_iteration": 2})
    again = worker("again")
    try:
        again.restore(drifted)
        assert again.train()["training_iteration"] == 6
        again.save()
    finally:
        again.stop()
    assert read_metadata(str(tmp_path / "check" / "again" / "checkpoint_000000"))["iteration"] == 6


def test_a_pbt_clones_pin_on_s3_stays_until_the_clone_has_a_newer_checkpoint(ray_session, s3_bucket):
    """On S3 as on local disk: the donor's pin a clone restored from stays while Ray may name it as the clone's
    checkpoint; the clone's next complete checkpoint releases it; a restore of the pin after that (a driver
    killed before it registered that checkpoint) takes the clone's own checkpoint since, not the donor's state."""
    from ray.train._internal.checkpoint_manager import _TrainingResult

    from tunekit import _ray
    from tunekit.trainables import DigitsTrainable

    config = {"hidden_size": 8, "steps_per_iteration": 2, "seed": 1}
    base = s3_bucket.uri("runs")

    def worker(trial):
        return DigitsTrainable(config=dict(config), storage=_ray.storage_context(base, "exp", trial, validate=True))

    donor = worker("donor")
    try:
        for _ in range(3):
            donor.train()
        donated = donor.save()
    finally:
        donor.stop()
    fs = donated.checkpoint.filesystem
    pin = pin_checkpoint(fs, donated.checkpoint.path, 3)
    assert pin is not None
    pinned = _TrainingResult(checkpoint=type(donated.checkpoint)(pin, filesystem=fs), metrics=donated.metrics)

    exists = lambda path: fs.get_file_info(path).type == pafs.FileType.Directory  # noqa: E731
    clone = worker("clone")
    try:
        clone.train()
        clone.restore(pinned)  # the exploit
        assert exists(pin)  # read, and kept: Ray names it as the clone's checkpoint until the next one
        clone.train()
        saved = clone.save()  # the clone's own checkpoint, iteration 4
        assert not exists(pin)  # released once that checkpoint is whole
    finally:
        clone.stop()
    again = worker("clone")  # Ray still named the pin (its driver never registered the save above)
    try:
        again.restore(pinned)
        assert again.iteration == 4 and again.state.counters.iteration == 4
        assert read_metadata(saved.checkpoint)["iteration"] == 4
    finally:
        again.stop()


def test_a_trials_first_save_on_s3_aborts_the_uploads_a_killed_worker_left_in_its_checkpoints(ray_session,
                                                                                              s3_bucket):
    """A worker killed inside an upload leaves that multipart upload open. The trial's next worker aborts those in
    the trial's own checkpoint directories at its first save, and leaves a pin's and a multi-worker run's alone."""
    from tunekit import _ray
    from tunekit.trainables import DigitsTrainable

    client = s3_bucket.server.client()

    def open_upload(key: str) -> None:
        upload = client.create_multipart_upload(Bucket=s3_bucket.name, Key=key)["UploadId"]
        client.upload_part(Bucket=s3_bucket.name, Key=key, UploadId=upload, PartNumber=1, Body=b"\0" * 1024)

    def still_open() -> set[str]:
        return {u["Key"] for u in client.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads", [])}

    killed = "runs/exp/t/checkpoint_000002/state.pt"
    others = {"runs/exp/t/.checkpoint_000001.pin-0a1b2c3d4e5f/state.pt", "runs/exp/t/train/checkpoint_000000/x.pt",
              "runs/exp/other/checkpoint_000002/state.pt"}
    for key in [killed, *others]:
        open_upload(key)
    worker = DigitsTrainable(config={"hidden_size": 8, "steps_per_iteration": 2, "seed": 1},
                             storage=_ray.storage_context(s3_bucket.uri("runs"), "exp", "t", validate=True))
    try:
        worker.train()
        assert still_open() == {killed, *others}  # (training alone touches no upload)
        saved = worker.save()
        assert still_open() == others
        open_upload(killed)  # only the first save looks: one listing a trial, not one a save
        worker.train()
        worker.save()
        assert still_open() == {killed, *others}
    finally:
        worker.stop()
    assert verify_checkpoint(saved.checkpoint).ok


_GATES: dict[str, Any] = {}


def _gated_digits(config: dict[str, Any]) -> None:
    """``train_digits``, recording its thread: a worker of ``config["gated"]`` waits before making its session,
    any other trains one iteration and ends once told to."""
    from tunekit.trainables import train_digits

    _GATES.setdefault("threads", []).append(threading.current_thread())
    if config.get("gated"):
        _GATES["registered"].set()
        _GATES["release"].wait()
        return train_digits(config)
    try:
        train_digits({**config, "max_iterations": 1})
    finally:
        _GATES["may_end"].wait()


def test_a_stopped_workers_thread_that_ends_late_leaves_a_new_worker_of_its_trial_id_whole(tmp_path):
    """Two workers of one trial id in one process (a trial restarted there): the stopped one's training thread
    ending after the new one's began must not unregister the new one, whose session would then be no one's and
    whose saves would hold no state."""
    from tunekit import _ray, function_trainable

    cls = function_trainable(_gated_digits, name="GatedDigits")
    config = {"hidden_size": 8, "steps_per_iteration": 1, "seed": 1}
    _GATES.clear()
    _GATES.update(registered=threading.Event(), release=threading.Event(), may_end=threading.Event())
    old = cls(config=config, storage=_ray.offline_storage(str(tmp_path), "t"))
    old.train()
    old.stop()  # its training thread is told to end; it ends in its own time
    new = cls(config={**config, "gated": True}, storage=_ray.offline_storage(str(tmp_path), "t"))
    try:
        first = threading.Thread(target=new.train)
        first.start()
        assert _GATES["registered"].wait(timeout=600)  # the new worker's thread is registered, no session yet
        _GATES["may_end"].set()
        _GATES["threads"][0].join()  # the stopped worker's thread has ended
        _GATES["release"].set()
        first.join()
        saved = new.save()
        assert saved.checkpoint is not None
        assert read_metadata(saved.checkpoint.path)["iteration"] == 1
    finally:
        _GATES["release"].set()
        _GATES["may_end"].set()
        new.stop()
