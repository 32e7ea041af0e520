"""Lockstep between a multi-worker trial and its workers: a checkpoint Tune asks for is one of that iteration.

Without it, a Train run's workers run ahead of Tune by up to one report, and only the checkpoints the worker
loop asks for exist. With ``train_trial(lockstep=True)`` (the default), after each report every rank waits
for Tune's decision on it: go on, or first write a checkpoint of this very iteration. Tune's
``checkpoint_frequency``, a callback's ``should_checkpoint`` and a scheduler's save all reach the trial as a
``save()`` while the report is pending (Tune's function runner holds the trial's thread in ``tune.report``
until the driver moves on), so each becomes a checkpoint of the iteration Tune saw, written by every rank
as the loop's own are (replicated part once, every rank its part, sharded state through
``torch.distributed.checkpoint``), and reaches Tune as a pointer. When the worker loop ends, its ranks wait
once more: for an at-end save (``checkpoint_at_end``) or the end.

The decisions go through a small actor of the trial's, keyed ``"<placement group>:<iteration>:<n>"``: the
ranks of one worker group share its placement group and a restarted group gets a new one, so a decision is
never taken by a group it was not meant for. The price is one round trip through Tune's driver per report
(Train's controller, which carries reports to the trial, is asked to poll every 0.1 s instead of 2 s).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DECIDE_KEY", "Decisions", "ENDED_KEY", "GROUP_KEY", "LOCKSTEP_KEYS", "SAVED_FOR_KEY",
           "START_KEYS", "TrainRun", "decisions_actor", "lockstep_trainable", "own_run",
           "release_run", "run_of_trial"]

logger = logging.getLogger(__name__)

#: Config keys handing the workers the trial's decisions actor and report queue (never reach Tune).
LOCKSTEP_KEYS = ("tunekit/decisions", "tunekit/queue")
#: Metrics keys (never reach Tune): rank 0 names the decision its ranks wait for after a report
#: (``"<placement group>:<iteration>"``), answers a save Tune asked for (the decision's key), and says that
#: the loop has ended (the end's key).
DECIDE_KEY, SAVED_FOR_KEY, ENDED_KEY = "tunekit/decide", "tunekit/saved_for", "tunekit/loop_ended"
#: Config keys through which a trial tells its workers which checkpoint Tune handed it (its own pointer, or
#: a PBT donor's), and the Train checkpoints its Train run had written before: those are older than Tune's
#: view (a PBT clone's own) or newer than it (written after the report Tune paused the trial at).
START_KEYS = ("tunekit/start_from", "tunekit/written_before")
#: Metrics key through which rank 0 tells the trial its worker group's placement group (never reaches Tune).
GROUP_KEY = "tunekit/placement_group"


@dataclass
class TrainRun:
    """A multi-worker trial's live Train run, owned by the trial's trainable instance.

    The trial's thread starts it (:meth:`begin`) and reads its reports (:meth:`take`); Tune's calls on the
    trainable (a save, the trial's end) reach the workers through it.
    """

    #: Train's controller actor and its worker groups' placement groups (what :meth:`stop` ends).
    controller: Any = None
    groups: set[str] = field(default_factory=set)
    #: Whether Tune stopped the run (its controller's death is then no error of the trial's).
    stopped: bool = False
    #: The decision the workers wait for, ``[key, n]`` (n: saves asked for at that report), else None.
    pending: list[Any] | None = None
    #: Whether the worker loop has ended (its ranks wait for an at-end save or the end).
    ended: bool = False
    #: Reports taken from the queue by a save and put back for the trial's thread.
    stash: collections.deque[Any] = field(default_factory=collections.deque)
    queue: Any = None
    thread: Any = None
    #: The :class:`Decisions` actor the workers wait on (None: no lockstep).
    decisions: Any = None
    #: Writes a pointer to a Train checkpoint: ``write_pointer(directory, train_checkpoint_path)``.
    write_pointer: Callable[[str, str], Any] | None = None
    warned: bool = False

    def begin(self, thread: Any, queue: Any, decisions: Any, write_pointer: Callable[[str, str], Any]) -> None:
        """A new Train run of the trial: nothing of an earlier one is left."""
        self.controller, self.groups, self.stopped, self.pending, self.ended = None, set(), False, None, False
        self.stash.clear()
        self.thread, self.queue, self.decisions, self.write_pointer = thread, queue, decisions, write_pointer

    def take(self) -> tuple[dict[str, Any], str | None] | None:
        """The next report (metrics, Train checkpoint path) of the run (one put back by a save first); None:
        the run is over. Notes the controller and placement group a report names."""
        item = self.stash.popleft() if self.stash else self.queue.get()
        if item is None:
            return None
        metrics, path, group, controller = item
        if controller is not None:
            self.controller = controller
        if group is not None:
            self.groups.add(group)
        return metrics, path

    def decide(self, value: str) -> None:
        """Post ``value`` ("go" or "save") for the decision the workers wait for; a "save" makes them wait for
        the next one of the same report."""
        import ray

        if self.pending is None or self.decisions is None:
            return
        ray.get(self.decisions.post.remote(f"{self.pending[0]}:{self.pending[1]}", value))
        if value == "save":
            self.pending[1] += 1
        else:
            self.pending = None

    def ask_for_checkpoint(self) -> str | None:
        """Tune asks the trial to save while its workers wait for a decision: they write a checkpoint of the
        iteration they reported and wait again. Returns the Train checkpoint's path; None when no worker waits
        (no lockstep, or a loop whose session has no ``config=config``), or when the group died meanwhile."""
        if self.pending is None or self.decisions is None:
            return None
        key = f"{self.pending[0]}:{self.pending[1]}"
        self.decide("save")
        report = self.take()
        if report is not None and report[0].get(SAVED_FOR_KEY) == key and report[1]:
            return report[1]
        # a restarted group's report, or the run's end: the trial's thread reads it
        self.stash.append(None if report is None else (*report, None, None))
        self.pending = None
        logger.warning("tunekit: the trial's workers did not write the checkpoint Tune asked for (their group "
                       "restarted or the run ended meanwhile)")
        return None

    def end(self, timeout_s: float = 60.0) -> None:
        """Tune is done with a trial whose loop has ended: its ranks, waiting for an at-end save, end; the Train
        run is given ``timeout_s`` to finish (then it is stopped like any other)."""
        if self.ended and self.pending is not None:
            try:
                self.decide("go")
            except Exception as exc:  # noqa: BLE001 - the run is stopped next anyway
                logger.debug("tunekit: could not tell the workers to end: %s", exc)
            if self.thread is not None:
                self.thread.join(timeout_s)
        self.ended, self.pending = False, None

    def stop(self) -> None:
        """Tune stops the trial: the run's controller is killed and its worker groups' placement groups
        removed (Ray Train removes them itself only when its controller ends, or, when it dies, through a
        watcher that needs Ray's State API, which a Ray without its dashboard has not)."""
        import ray

        from tunekit import _ray

        self.end()  # a loop that has ended waits for Tune's end of the trial: it ends now, its run finishes
        controller, groups = self.controller, sorted(self.groups)
        self.controller, self.groups, self.stopped = None, set(), True
        try:
            if controller is not None:
                ray.kill(controller)  # first: a controller would start a new worker group on a removed one's
            for group in groups:
                _ray.remove_placement_group(group)
        except Exception as exc:  # noqa: BLE001 - stopping must go on; say what may be left
            logger.warning("tunekit: could not stop the trial's Train run: %s", exc)


#: The Train run of each trial running in this process, by trial id: its trainable owns it and registers it
#: (:func:`own_run`), the trial's function finds it (:func:`run_of_trial`).
_LIVE: dict[str, TrainRun] = {}


def own_run(trainable: Any) -> TrainRun:
    """``trainable``'s Train run, registered under its trial id (again after a reset to another trial)."""
    run = trainable.__dict__.setdefault("_train_run", TrainRun())
    _LIVE.pop(trainable.__dict__.get("_train_run_of", ""), None)
    trainable.__dict__["_train_run_of"] = trainable.trial_id
    _LIVE[trainable.trial_id] = run
    return run


def release_run(trainable: Any) -> None:
    """Tune stops ``trainable``'s trial: its run is stopped and no longer registered."""
    run = trainable.__dict__.get("_train_run")
    if run is not None:
        run.stop()
    _LIVE.pop(trainable.__dict__.pop("_train_run_of", ""), None)


def run_of_trial(trial_id: str) -> TrainRun:
    """The Train run the trainable of ``trial_id`` owns in this process (a new one when none is registered: a
    trial function called by another function, whose Train run nothing stops but its own end)."""
    return _LIVE.get(trial_id) or TrainRun()


class Decisions:
    """The trial's decisions, each posted once under its key and read by every rank (a Ray async actor)."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}
        self._events: dict[str, Any] = {}

    def _event(self, key: str) -> Any:
        import asyncio

        return self._events.setdefault(key, asyncio.Event())

    async def wait(self, key: str) -> str:
        await self._event(key).wait()
        return self._values[key]

    async def post(self, key: str, value: str) -> None:
        self._values[key] = value
        self._event(key).set()


def decisions_actor() -> Any:
    """A :class:`Decisions` actor for one Train run (it lives as long as the trial's process)."""
    import ray

    return ray.remote(num_cpus=0)(Decisions).remote()


def lockstep_trainable(trial: Callable[[dict[str, Any]], None], name: str, mixin: type,
                       resources: dict[str, Any]) -> type:
    """The Tune trainable of a lockstep multi-worker trial: a class (so that Tune accepts
    ``checkpoint_frequency`` and ``checkpoint_at_end``) running ``trial`` as tunekit's function trainables
    do, whose saves are the workers' checkpoints of the iteration Tune saw (``mixin`` owns the run)."""
    from tunekit.trial.function import function_trainable
    from tunekit.trial.kind import TrainableKind

    def _elsewhere_writer(self: Any) -> Callable[[str], Any] | None:
        run = own_run(self)
        path = run.ask_for_checkpoint()
        if path is None or run.write_pointer is None:
            return None
        return lambda directory: run.write_pointer(directory, path)

    kind = TrainableKind(train_fn=trial, multiworker=True, resources=resources)
    return type(name, (mixin, function_trainable(trial, name=name)),
                {"_elsewhere_writer": _elsewhere_writer, "tunekit_trainable": kind,
                 "__module__": getattr(trial, "__module__", __name__)})
