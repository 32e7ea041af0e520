"""Helpers of the trainable contract suite: run trainables in real Ray actors."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import signal
import threading
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import ray
from ray import tune

from tests.support.faults import flip_byte
from tunekit import function_trainable
from tunekit.trial._checkpointer import BACKGROUND_MIN_BYTES
from tunekit.checkpoint._trial_dir import await_write
from tunekit.trainables import DigitsTrainable, train_digits


def make_actor(cls: type, config: dict[str, Any], storage: Path, trial: str):
    """A trainable in its own Ray actor (its own worker process), with Tune storage."""
    from tunekit._ray import storage_context

    context = storage_context(str(storage), "exp", trial)
    gpus = 1 if config.get("accelerator") == "gpu" else 0  # (a test of the GPU path asks for one)
    return ray.remote(num_cpus=1, num_gpus=gpus)(cls).remote(config=config, storage=context)


def run_actor(cls, config, storage, trial, iterations, restore_from=None):
    """Train ``iterations`` iterations (after restoring), save, kill the actor."""
    actor = make_actor(cls, config, storage, trial)
    try:
        if restore_from is not None:
            ray.get(actor.restore.remote(restore_from))
        return _train_then_save(actor, iterations)
    finally:
        end_actor(actor)


def _train_then_save(actor, iterations):
    results = [ray.get(actor.train.remote()) for _ in range(iterations)]
    return results, ray.get(actor.save.remote())


def run_actor_saving_midway(cls, config, storage, trial, iterations, midway):
    """Train ``iterations`` iterations in one worker, saving after ``midway`` of them and at the end, as Tune's
    periodic checkpoints do; the results, the midway checkpoint and the final one."""
    actor = make_actor(cls, config, storage, trial)
    try:
        first, half = _train_then_save(actor, midway)
        rest, saved = _train_then_save(actor, iterations - midway)
    finally:
        end_actor(actor)
    return first + rest, half, saved


def end_actor(actor) -> None:
    """End a trial's worker as Tune does: ``stop`` (the checkpoint write in flight completes), then kill it.

    A bare ``ray.kill`` right after ``save`` is a worker killed inside a two-phase write.
    """
    try:
        ray.get(actor.stop.remote())
    finally:
        ray.kill(actor)


def weights_digest(models_state: dict[str, Any]) -> str:
    digest = hashlib.sha256()
    for name in sorted(models_state):
        for key, tensor in models_state[name].items():
            digest.update(key.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def checkpoint_iterations(trial_dir: Path) -> list[int]:
    """Iterations of the tunekit checkpoints on disk in a trial directory."""
    return sorted(
        json.loads((d / "tunekit.json").read_text())["iteration"] for d in trial_dir.glob("checkpoint_*")
    )


class KillActorOnce(tune.Callback):
    """Kill a trial's worker (ray.kill of its actor) once it has reported iteration ``at``.

    The kill waits for a controller step at which the trial is RUNNING on a live actor, and
    blocks until Ray sees the actor dead. A worker that dies while Tune is pausing its trial or
    handing its actor to another trial is counted twice by Ray 2.5x's controller (the actor's
    error and the task's error), and the second count errors the trial whatever
    ``max_failures`` says; that is Ray's race (README, "Retries"), not the
    mid-training death these tests are about.
    """

    def __init__(self, at: int) -> None:
        self.at, self.killed, self.armed = at, False, None

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if not self.killed and self.armed is None and result["training_iteration"] >= self.at:
            self.armed = trial

    def on_step_begin(self, iteration, trials, **info):
        trial = self.armed
        if self.killed or trial is None or trial.status != "RUNNING":
            return
        actor = trial.temporary_state.ray_actor
        if actor is None:
            return
        self.killed = True
        ray.kill(actor, no_restart=True)
        ray.wait([actor.__ray_ready__.remote()], timeout=30)  # returns once the death is known


def die_once(config: dict[str, Any], upcoming: int) -> None:
    """SIGKILL this worker process as it starts iteration ``config["die_at"]``, once per ``config["die_marker"]``.

    The death a preempted or OOM-killed worker meets: in the middle of a
    training step, with Ray's train task in flight. (A kill sent from the
    driver cannot be aimed as well: with reused actors it can land while Tune
    pauses a trial or hands its worker to another one, a Ray race, README
    "Retries".)

    With ``config["die_in_write"]`` set to a phase of a checkpoint write ("state": in the middle
    of writing ``state.pt``; "manifest": every file written, the manifest not yet), the worker
    dies instead inside a checkpoint write from iteration ``die_at`` on, on the helper thread
    of a two-phase save: it holds the write at that phase until the trial's next training step
    has started (Tune has registered the checkpoint being written, and ``num_to_keep`` deleted
    the one before), then SIGKILLs itself, so the death meets Ray's train task in flight as
    above. A write after which no step comes within :data:`_NEXT_STEP_S` (a pause, a stop) is let through.
    ``config["die_after_step"] = False``: die at that phase at once (a write that is not in the
    background, as on S3, where the save itself is Ray's task in flight).
    """
    marker, at = config.get("die_marker"), config.get("die_at")
    if not marker:
        return
    _stepping.set()
    _upcoming[0] = upcoming
    if upcoming != at:
        return
    phase = config.get("die_in_write")
    if phase:
        import tunekit.checkpoint._faults as faults
        from tunekit.trial._saving import drain_writes

        # An earlier checkpoint's write may still be in flight (its helper thread runs at a lower
        # priority: on a loaded machine it can lag iterations behind); it completes first, so the
        # hook below catches only writes from iteration ``at`` on (a CI run killed the first write).
        drain_writes()

        wait_for_step = config.get("die_after_step", True)

        def hook(reached: str) -> None:
            if reached != phase or _saves[1] == _saves[0] or _upcoming[0] < at:
                # Not the phase, this write was let through already, or the worker now runs a trial
                # before ``at`` (a reused actor: the hook stays in the process; a CI run killed the
                # first write of the next trial it ran, which no test here means to do).
                return
            _saves[1] = _saves[0]
            if os.path.exists(marker):  # (died once already: no write waits for a step any more)
                return
            if (not wait_for_step or _stepping.wait(timeout=_NEXT_STEP_S)) and _first_death(marker):
                os.kill(os.getpid(), signal.SIGKILL)

        faults.hook = hook
        return
    if _first_death(marker):
        os.kill(os.getpid(), signal.SIGKILL)


#: Seconds a held write waits for the trial's next step before it is let through (a write before a pause or
#: the trial's end): long enough for a loaded machine, where a CI run's next step came after the 1 s once used.
_NEXT_STEP_S = 20.0
#: Set when a training step starts, cleared when a save starts (see :func:`die_once`).
_stepping = threading.Event()
#: [saves started, the save whose write the hook has seen]: one wait per write.
_saves = [0, -1]
#: The iteration this worker's trial started last (a reused worker runs another trial from 1).
_upcoming = [0]


def saving() -> None:
    """Note that a save started: a write killed by :func:`die_once` waits for the next step.

    The writes of earlier saves complete first (a two-phase save waits for them anyway, before its
    snapshot): a write whose helper thread lags a step or more behind meets the hook while the
    counters still name its own save, and the steps that came after it already count. A CI run
    otherwise held the lagging first write for a step that its waiting second save kept from
    coming, let it through after :data:`_NEXT_STEP_S`, and killed the third.
    """
    from tunekit.trial._saving import drain_writes

    drain_writes()
    _stepping.clear()
    _saves[0] += 1


def _first_death(marker: str) -> bool:
    """True the first time it is asked for ``marker`` (in any process): the marker file is created."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False  # died once already (this is the retry, or another trial)
    return True


class DyingDigits(DigitsTrainable):
    """``DigitsTrainable`` that dies once as configured (see :func:`die_once`).

    Its saves are two-phase although its state is small (``background_saves_min_bytes = 0``): the deaths
    are aimed at a write in flight on the helper thread.
    """

    background_saves_min_bytes = 0

    def train_iteration(self):
        die_once(self.config, self.state.counters.iteration + 1)
        return super().train_iteration()

    def save(self, checkpoint_dir=None):
        saving()
        return super().save(checkpoint_dir)


def dying_train_digits(config: dict[str, Any]) -> None:
    """``train_digits`` that dies once as configured (see :func:`die_once`)."""
    import tunekit.trainables.function_api as api

    steps = api.train_steps

    def train_steps(state, n):
        die_once(config, state.counters.iteration + 1)
        return steps(state, n)

    api.train_steps = train_steps
    try:
        train_digits(config)
    finally:
        api.train_steps = steps


class DyingTrainDigits(function_trainable(dying_train_digits, name="DyingTrainDigits")):
    """``train_digits`` as a function trainable that dies once as configured (see :func:`die_once`); two-phase
    saves, as :class:`DyingDigits`."""

    background_saves_min_bytes = 0

    def save(self, checkpoint_dir=None):
        saving()
        return super().save(checkpoint_dir)


class SmallDyingDigits(DyingDigits):
    """:class:`DyingDigits` with the default ``background_saves_min_bytes``: its small state is written before
    ``save`` returns, so a death inside the write is a death inside Ray's save task."""

    background_saves_min_bytes = BACKGROUND_MIN_BYTES


class SmallDyingTrainDigits(DyingTrainDigits):
    """:class:`DyingTrainDigits` written before ``save`` returns, as :class:`SmallDyingDigits`."""

    background_saves_min_bytes = BACKGROUND_MIN_BYTES


class DamageAndKill(tune.Callback):
    """At iteration ``at``: damage the trial's newest ``damage`` checkpoints, then kill its worker."""

    def __init__(self, at: int, damage: int = 1) -> None:
        self.at, self.damage, self.damaged = at, damage, []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if self.damaged or result["training_iteration"] != self.at:
            return
        fs, trial_dir = trial.storage.storage_filesystem, trial.storage.trial_fs_path
        found = fs.get_file_info(pafs.FileSelector(trial_dir))
        names = sorted(i.base_name for i in found if i.base_name.startswith("checkpoint_"))
        for name in names[-self.damage :]:
            if isinstance(fs, pafs.LocalFileSystem):  # a two-phase write may be in flight: damage what it wrote
                await_write(posixpath.join(trial_dir, name))
            flip_byte(fs, posixpath.join(trial_dir, name))
            self.damaged.append(name)
        ray.kill(trial.temporary_state.ray_actor)


def worker_logs_mention(text: str) -> bool:
    """True if any Ray worker log of this session contains ``text``."""
    logs = Path(ray._private.worker.global_worker.node.get_logs_dir_path())
    return any(text in p.read_text(errors="replace") for p in logs.glob("worker-*"))
