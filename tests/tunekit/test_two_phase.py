"""Two-phase saves: what a restore meets while a checkpoint is written, or after its writer was killed.

Real processes: a writer process stages and writes a checkpoint the way a
trial's helper thread does (``stage_checkpoint``, ``keep_newest_complete``,
``commit_checkpoint``) and is held inside the write; the test reads, waits,
times out, or SIGKILLs it. The end-to-end kills (inside a trial's background
write, with ``num_to_keep=1`` and PBT) are in ``tests/trainables``.
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

import pyarrow.fs as pafs
import pytest
import torch

from tunekit import CheckpointError, read_state, verify_checkpoint, write_checkpoint
from tunekit.checkpoint._announced import INDEX_FILE
from tunekit._keys import SAVE_WRITE_KEY
from tunekit.checkpoint._trial_dir import leftovers
from tunekit.trial.state import StateBuffers, TrainingState
from tunekit.checkpoint._durability import Durability
from tunekit.trial._restoring import local_request, prepare_restore
from tunekit.checkpoint._pins import is_pinned, pin_checkpoint
from tunekit.checkpoint._trial_dir import await_write

WRITER = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import tunekit.checkpoint._faults as faults
    import tunekit.checkpoint._directory as checkpoint
    from tunekit.trial._saving import Durability, commit_checkpoint
    from tunekit.checkpoint._announced import announce
    from tunekit.checkpoint._trial_dir import keep_newest_complete, stage_checkpoint

    final, hold_at, go = sys.argv[1], sys.argv[2], sys.argv[3]

    def hold(phase):
        if phase == hold_at:
            open(go + ".held", "w").close()  # tell the test where the writer is
            while not os.path.exists(go):
                time.sleep(0.01)

    staging = stage_checkpoint(final)
    keep_newest_complete(final)
    announce(final)  # as save_in_place does before Tune registers it
    faults.hook = hold
    state = {"w": torch.arange(1000, dtype=torch.float32)}
    commit_checkpoint(staging, final, lambda d: checkpoint.write_checkpoint(d, state, metadata={"iteration": 4},
                                                                            durable=False),
                      Durability())
    """
)


@pytest.fixture
def trial_dir(tmp_path) -> Path:
    """A trial directory with one complete checkpoint (iteration 2) and Ray's trial files."""
    trial = tmp_path / "exp" / "trial_0"
    write_checkpoint(trial / "checkpoint_000000", {"w": torch.zeros(1000)}, metadata={"iteration": 2})
    (trial / "result.json").write_text(json.dumps({"training_iteration": 2}) + "\n")
    return trial


def _start_writer(trial: Path, hold_at: str) -> tuple[subprocess.Popen, Path]:
    go = trial.parent / f"go-{hold_at}"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(trial / "checkpoint_000001"), hold_at, str(go)])
    deadline = time.monotonic() + 600  # only keeps a broken run from hanging; nothing asserts on time
    while not Path(str(go) + ".held").exists():
        assert proc.poll() is None, "the writer process ended early"
        assert time.monotonic() < deadline, "the writer never reached its hold point"
        time.sleep(0.02)
    return proc, go


def test_restore_waits_for_a_checkpoint_still_being_written(trial_dir):
    writer, go = _start_writer(trial_dir, "manifest")  # every file written, manifest not yet
    final = trial_dir / "checkpoint_000001"
    try:
        assert os.listdir(final) == [] and any(name.startswith(".checkpoint_000001.partial-")
                                               for name in os.listdir(trial_dir))  # announced, being written
        with pytest.raises(CheckpointError, match=r"checkpoint .*checkpoint_000001 is still being written \(by process"):
            await_write(str(final), timeout=0.2)
        threading.Timer(0.5, go.touch).start()
        started = time.monotonic()
        request = local_request(str(final))  # what a restore (or a PBT exploit of this donor) calls first
        waited = time.monotonic() - started
    finally:
        go.touch()
        writer.wait(timeout=60)
    assert request is not None and waited > 0.3
    assert verify_checkpoint(str(final)).ok and read_state(str(final))["w"][999] == 999
    # Once the new checkpoint is whole, the kept copy of the older one is gone; nothing else is left over.
    assert leftovers(pafs.LocalFileSystem(), str(trial_dir)) == []


def test_a_pbt_pin_of_a_checkpoint_still_being_written_waits_for_it(trial_dir):
    """The scheduler pins the donor's checkpoint as soon as the donor's save returned: with two-phase
    saves, before the directory exists. The pin waits for the write instead of finding nothing."""
    writer, go = _start_writer(trial_dir, "manifest")
    final = trial_dir / "checkpoint_000001"
    try:
        assert os.listdir(final) == []  # announced, not written yet
        threading.Timer(0.5, go.touch).start()
        pin = pin_checkpoint(pafs.LocalFileSystem(), str(final), 4)
    finally:
        go.touch()
        writer.wait(timeout=60)
    assert pin is not None and is_pinned(pin), "nothing was pinned"
    assert read_state(pin)["w"][999] == 999  # the donor's new state, whole
    shutil.rmtree(final)  # what Ray's num_to_keep may do next: the pin holds the state on
    assert verify_checkpoint(pin).ok


@pytest.mark.parametrize("phase", ["state", "manifest"])
def test_a_writer_killed_mid_write_leaves_a_complete_checkpoint_to_restore(trial_dir, phase, capsys, monkeypatch):
    from tunekit.cli import main

    writer, go = _start_writer(trial_dir, phase)
    # What Tune's num_to_keep=1 does once the new checkpoint is announced: delete the older one.
    shutil.rmtree(trial_dir / "checkpoint_000000")
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=60)
    found = dict(leftovers(pafs.LocalFileSystem(), str(trial_dir)))
    assert found == {".checkpoint_000000.kept": "kept", next(n for n in found if ".partial-" in n): "interrupted"}
    # `tunekit verify` says what the kill left: the interrupted write, and the complete kept copy.
    assert main(["verify", str(trial_dir.parent)]) == 1
    out = capsys.readouterr().out
    assert ".checkpoint_000000.kept  iter     2  good" in out
    assert "interrupted: an interrupted checkpoint write" in out
    assert "checkpoint_000001  iter     -  incomplete: directory is empty: announced" in out
    # Restoring what Tune registered last (the interrupted one) does not wait for a dead writer
    # (with next to no time to wait, a live one would fail the restore with "still being written"):
    # it falls back at once to the newest complete checkpoint, the kept copy.
    monkeypatch.setenv("TUNEKIT_CHECKPOINT_WAIT_S", "0.001")
    result, temps = prepare_restore(str(trial_dir / "checkpoint_000001"))
    assert Path(result.checkpoint.path).name == ".checkpoint_000000.kept" and not temps
    assert result.metrics["training_iteration"] == 2
    assert torch.equal(read_state(result.checkpoint.path)["w"], torch.zeros(1000))


def test_state_buffers_are_a_snapshot_and_are_reused():
    model = torch.nn.Linear(64, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = TrainingState(models={"model": model}, optimizers={"sgd": optimizer})
    buffers = StateBuffers()
    first = state.state_dict(into=buffers)
    before = first["models"]["model"]["weight"].clone()
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on: the snapshot must not move
    assert torch.equal(first["models"]["model"]["weight"], before)
    assert first["models"]["model"]["weight"].data_ptr() != model.weight.data_ptr()
    pointer, nbytes = first["models"]["model"]["weight"].data_ptr(), buffers.nbytes
    second = state.state_dict(into=buffers)
    assert second["models"]["model"]["weight"].data_ptr() == pointer and buffers.nbytes == nbytes  # reused
    assert torch.equal(second["models"]["model"]["weight"], model.weight.detach())
    assert nbytes >= sum(p.numel() * 4 for p in model.parameters())
    # The snapshot saves and restores like the live state.
    assert set(second) == set(state.state_dict()) and second["counters"] == state.state_dict()["counters"]


@pytest.mark.skipif(not hasattr(os, "getpriority") or sys.platform != "linux", reason="per-thread priorities: Linux")
def test_a_write_its_save_waits_for_runs_at_trainings_priority_others_below_it():
    """A background write runs below training's CPU priority; one its save waits for (a trial's last, every
    save under Ray's PBT) does not: training waits for it, so a lower priority only lengthens the wait."""
    from tunekit.trial._saving import BackgroundSaves

    def priority_of_write(urgent: bool) -> int:
        saves, seen, written = BackgroundSaves(), [], threading.Event()
        saves.urgent = urgent
        saves.submit("target", lambda: (seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())),
                                        written.set()))
        written.wait()  # (not ``saves.wait()`` first: a write waited for is raised to the waiter's priority)
        saves.wait()
        return seen[0]

    training = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert priority_of_write(urgent=False) > training
    assert priority_of_write(urgent=True) == training
    assert priority_of_write(urgent=False) > training  # the next write that is not waited for: below again


_NICE_15 = textwrap.dedent("""
    import os, threading
    from concurrent.futures import ThreadPoolExecutor
    import tunekit.trial._saving as saving
    from tunekit.checkpoint._priority import lend_priority, submit_below
    def nice():
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 15)  # as Ray starts its workers
    def write(urgent):  # (what it runs at before anyone waits for it: then it is raised, see below)
        saves, seen, written = saving.BackgroundSaves(), [], threading.Event()
        saves.urgent = urgent
        saves.submit("target", lambda: (seen.append(nice()), written.set()))
        written.wait()
        saves.wait()
        return seen[0]
    import tunekit.checkpoint._durability as durable
    seen, synced = [], threading.Event()
    durable.fsync_paths = lambda paths: (seen.append(nice()), synced.set())
    durability = saving.Durability()
    durability.sync(os.getcwd())
    synced.wait()
    durability.wait()
    # Waited for: a job runs at the waiter's priority (lowering a nice may need privilege: then it stays)
    def may_lower():
        out = []
        def probe():
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 15)
                out.append(True)
            except OSError:
                out.append(False)
        t = threading.Thread(target=probe); t.start(); t.join()
        return out[0]
    pool, started, go, lent = ThreadPoolExecutor(1), threading.Event(), threading.Event(), []
    running = submit_below(pool, lambda: (started.set(), go.wait(), lent.append(nice())))
    queued = submit_below(pool, lambda: lent.append(nice()))
    started.wait()
    lend_priority(running)
    lend_priority(queued)
    go.set()
    queued.result()
    print(write(False), write(True), seen[0], *lent, may_lower())
""")


@pytest.mark.skipif(not hasattr(os, "getpriority") or sys.platform != "linux", reason="per-thread priorities: Linux")
def test_background_writes_run_below_a_ray_workers_priority_and_at_it_when_waited_for(tmp_path):
    """Ray starts its workers at nice 15: a background write and fsync run below that (once they ran at an absolute
    nice 10, above training), a write its save waits for at it; a job the caller waits for (running, or not yet
    started) is raised to the caller's priority."""
    done = subprocess.run([sys.executable, "-c", _NICE_15], capture_output=True, text=True, check=True, cwd=tmp_path)
    background, urgent, fsync, running, queued, may_lower = done.stdout.split()
    assert (int(background), int(urgent), int(fsync)) == (19, 15, 19)
    assert (int(running), int(queued)) == ((15, 15) if may_lower == "True" else (19, 19))


def test_a_small_state_is_written_before_save_returns_a_large_one_on_the_helper_thread(tmp_path, monkeypatch):
    """Below ``background_saves_min_bytes`` of tensors a save writes in place on the training thread (no kept
    copy, no announced directory): whole when ``save`` returns. At 0 the same trainable saves two-phase."""
    import tunekit.checkpoint._faults as faults
    from tunekit import _ray
    from tunekit.trainables import DigitsTrainable

    class TwoPhase(DigitsTrainable):
        background_saves_min_bytes = 0

    threads: list[str] = []
    monkeypatch.setattr(faults, "hook", lambda phase: threads.append(threading.current_thread().name))
    for cls, name in ((DigitsTrainable, "small"), (TwoPhase, "two-phase")):
        threads.clear()
        trainable = cls(config={"hidden_size": 8, "steps_per_iteration": 2},
                        storage=_ray.offline_storage(str(tmp_path), name))
        try:
            for _ in range(2):
                trainable.train()
                saved = trainable.save()
            trial = Path(saved.checkpoint.path).parent
            if cls is DigitsTrainable:
                assert verify_checkpoint(saved.checkpoint.path).ok  # whole at once: nothing in flight
                assert set(threads) == {threading.current_thread().name}, threads
                # Only the checkpoints: no index record (nothing is announced before it is whole), no leftovers.
                assert sorted(p.name for p in trial.iterdir()) == ["checkpoint_000000", "checkpoint_000001"]
                assert sorted(p.name for p in Path(saved.checkpoint.path).iterdir()) == [
                    "manifest.json", "state.pt", "tunekit.json"]
                assert SAVE_WRITE_KEY not in trainable.train()  # no write of its own to report: the driver's cue
            else:
                assert threads and all(t.startswith("tunekit-save") for t in threads), threads
                assert (trial / INDEX_FILE).read_text() == "1"  # announced before its write: the index is recorded
                assert SAVE_WRITE_KEY in trainable.train()
        finally:
            trainable.stop()
        assert verify_checkpoint(saved.checkpoint.path).ok


def test_the_size_that_decides_counts_the_optimizers_state():
    from tunekit.trial._checkpointer import _smaller_than

    model = torch.nn.Linear(10, 10)  # 110 floats: 440 bytes
    state = TrainingState(models={"m": model}, optimizers={"adam": torch.optim.Adam(model.parameters())})
    assert _smaller_than(state, 441) and not _smaller_than(state, 440)
    model(torch.ones(1, 10)).sum().backward()
    state.optimizers["adam"].step()  # two moments of every parameter, and a step count each
    assert not _smaller_than(state, 1320) and _smaller_than(state, 1320 + 2 * 4 + 1)


def test_a_small_checkpoint_reaches_the_disk_with_one_syncfs_or_else_with_fsyncs(tmp_path, monkeypatch):
    import ctypes
    import errno

    import tunekit.checkpoint._durability as durable

    directory = write_checkpoint(tmp_path / "ckpt", {"w": torch.ones(4)}, durable=False)
    fsynced: list[list[Path]] = []
    real_fsync = durable.fsync_paths
    monkeypatch.setattr(durable, "fsync_paths", lambda paths: (fsynced.append(paths), real_fsync(paths)))
    if durable._SYNCFS is not None:  # Linux: one call, no per-path fsync
        durability = Durability()
        durability.sync(directory, whole_filesystem=True)
        durability.wait()
        assert fsynced == []

    def refusing(code):
        def syncfs(fd):
            ctypes.set_errno(code)
            return -1
        return syncfs

    monkeypatch.setattr(durable, "_SYNCFS", refusing(errno.ENOSYS))  # a filesystem (or libc) without it
    durability = Durability()
    durability.sync(directory, whole_filesystem=True)
    durability.wait()
    assert sorted(p.name for p in fsynced[0]) == sorted(["manifest.json", "state.pt", "tunekit.json", "ckpt",
                                                         tmp_path.name])
    monkeypatch.setattr(durable, "_SYNCFS", refusing(errno.EIO))  # the disk failed: the waiter hears of it
    durability.sync(directory, whole_filesystem=True)
    with pytest.raises(OSError, match="Input/output error"):
        durability.wait()


def test_the_trial_directory_scan_types_each_name_alike_on_a_local_disk_and_through_pyarrow(tmp_path):
    """One scan types every checkpoint name (files, other directories and a missing directory: nothing); a live
    writer's staging directory is "writing", a dead one's "interrupted"; the highest index counts every kind."""
    from tunekit.checkpoint._announced import highest_index
    from tunekit.checkpoint._trial_dir import LOCAL, scan, stage_checkpoint, writer_id

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    host = writer_id().rsplit("-", 1)[0]
    for name in ("checkpoint_000001", "checkpoint_000003", ".checkpoint_000002.kept", ".checkpoint_000005.pin-ab12",
                 ".checkpoint_000000.damaged", f".checkpoint_000004.partial-{host}-{dead}-x1y2", "train", "sub_dir"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint_000009").write_text("a file, not a checkpoint")
    live = Path(stage_checkpoint(str(tmp_path / "checkpoint_000006")))
    expected = {("checkpoint_000001", "checkpoint", 1), ("checkpoint_000003", "checkpoint", 3),
                (".checkpoint_000002.kept", "kept", 2), (".checkpoint_000005.pin-ab12", "pinned", 5),
                (".checkpoint_000000.damaged", "damaged", 0), (live.name, "writing", 6),
                (f".checkpoint_000004.partial-{host}-{dead}-x1y2", "interrupted", 4)}
    for fs in (LOCAL, pafs.SubTreeFileSystem("/", pafs.LocalFileSystem())):
        where = str(tmp_path) if fs is LOCAL else str(tmp_path).lstrip("/")
        found = scan(fs, where)
        assert {(e.name, e.kind, e.index) for e in found} == (expected if fs is LOCAL else
                                                              {(n, "interrupted" if k == "writing" else k, i)
                                                               for n, k, i in expected})  # remote: cannot tell
        assert {e.checkpoint for e in found} == {f"checkpoint_{i:06d}" for _, _, i in expected}
    assert [e.writer for e in scan(LOCAL, str(tmp_path), ("writing",))] == [(host, os.getpid())]
    assert sorted(e.kind for e in scan(LOCAL, str(tmp_path), ("staging",))) == ["staging", "staging"]
    assert scan(LOCAL, str(tmp_path / "missing")) == [] and highest_index(str(tmp_path)) == 6


def test_tidy_after_a_whole_checkpoint_leaves_the_newer_kept_copy_and_live_writes(tmp_path, capsys):
    """After checkpoint 4 is whole: older kept copies, copies a killed worker left half made and a dead writer's
    staging directory go; checkpoints, a kept copy not older, a pin, a damaged copy and a live write stay.
    ``tunekit verify`` names a half-made copy as an interrupted write, not as damage."""
    from tunekit.checkpoint._trial_dir import LOCAL, scan, stage_checkpoint, tidy, writer_id
    from tunekit.cli import main

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    trial = tmp_path / "exp" / "trial_0"
    stay = ["checkpoint_000004", ".checkpoint_000004.kept", ".checkpoint_000001.pin-ab12", ".checkpoint_000000.damaged"]
    go = [".checkpoint_000002.kept", ".checkpoint_000003.keeping-k1x2", ".checkpoint_000005.standin-s3y4",
          f".checkpoint_000005.partial-{writer_id().rsplit('-', 1)[0]}-{dead}-x1y2"]
    for name in stay + go:
        (trial / name).mkdir(parents=True)
    live = Path(stage_checkpoint(str(trial / "checkpoint_000006")))
    assert {e.name for e in scan(LOCAL, str(trial), ("temporary",))} == set(go[1:3])
    (tmp_path / "exp" / "experiment_state-2026-12-07_00-00-00.json").write_text("{}")
    main(["verify", str(tmp_path / "exp")])
    out = capsys.readouterr().out
    assert ".checkpoint_000003.keeping-k1x2" in out and "a hard-linked copy left half made" in out, out
    tidy(str(trial), 4)
    assert sorted(p.name for p in trial.iterdir()) == sorted(stay + [live.name])
