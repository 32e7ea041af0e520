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
from typing import Any

__all__ = ["DECIDE_KEY", "Decisions", "ENDED_KEY", "GROUP_KEY", "LOCKSTEP_KEYS", "RUN", "SAVED_FOR_KEY", "START_KEYS",
           "ask_for_checkpoint", "decide", "decisions_actor", "end_run", "lockstep_trainable", "take"]

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

#: This process's live Train run: its controller and worker groups' placement groups, its report queue, and
#: in lockstep the decision its workers wait for (``pending``: [key, n]) and whether that is the loop's end.
RUN: dict[str, Any] = {"controller": None, "groups": set(), "stopped": False, "pending": None, "ended": False,
                       "stash": collections.deque()}


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


def decide(value: str) -> None:
    """Post ``value`` ("go" or "save") for the decision the workers wait for; a "save" makes them wait for
    the next one of the same report."""
    import ray

    pending, actor = RUN.get("pending"), RUN.get("decisions")
    if pending is None or actor is None:
        return
    ray.get(actor.post.remote(f"{pending[0]}:{pending[1]}", value))
    if value == "save":
        pending[1] += 1
    else:
        RUN["pending"] = None


def take() -> Any:
    """The next item of the trial's report queue (one put back by a save first)."""
    stash = RUN["stash"]
    return stash.popleft() if stash else RUN["queue"].get()


def ask_for_checkpoint() -> str | None:
    """Tune asks the trial to save while its workers wait for a decision: they write a checkpoint of the
    iteration they reported and wait again. Returns the Train checkpoint's path; None when no worker waits
    (no lockstep, or a loop whose session has no ``config=config``), or when the group died meanwhile."""
    pending = RUN.get("pending")
    if pending is None or RUN.get("decisions") is None:
        return None
    key = f"{pending[0]}:{pending[1]}"
    decide("save")
    item = take()
    if item is not None:
        metrics, path, group, controller = item
        if controller is not None:
            RUN["controller"] = controller
        if group is not None:
            RUN["groups"].add(group)
        if metrics.get(SAVED_FOR_KEY) == key and path:
            return path
    RUN["stash"].append(item)  # a restarted group's report, or the run's end: the trial's thread reads it
    RUN["pending"] = None
    logger.warning("tunekit: the trial's workers did not write the checkpoint Tune asked for (their group "
                   "restarted or the run ended meanwhile)")
    return None


def end_run(timeout_s: float = 60.0) -> None:
    """Tune is done with a trial whose loop has ended: its ranks, waiting for an at-end save, end; the Train
    run is given ``timeout_s`` to finish (then it is stopped like any other)."""
    if RUN.get("ended") and RUN.get("pending") is not None:
        try:
            decide("go")
        except Exception as exc:  # noqa: BLE001 - the run is stopped next anyway
            logger.debug("tunekit: could not tell the workers to end: %s", exc)
        thread = RUN.get("thread")
        if thread is not None:
            thread.join(timeout_s)
    RUN.update(ended=False, pending=None)


def lockstep_trainable(trial: Callable[[dict[str, Any]], None], name: str, mixin: type,
                       resources: dict[str, Any]) -> type:
    """The Tune trainable of a lockstep multi-worker trial: a class (so that Tune accepts
    ``checkpoint_frequency`` and ``checkpoint_at_end``) running ``trial`` as tunekit's function trainables
    do, whose saves are the workers' checkpoints of the iteration Tune saw."""
    from tunekit.trial.function import function_trainable
    from tunekit.trial.kind import TrainableKind

    base = function_trainable(trial, name=name)

    def _elsewhere_writer(self: Any) -> Callable[[str], Any] | None:
        from tunekit.multiworker._lockstep import RUN as run  # (the worker's own: this class travels by value)
        from tunekit.multiworker._pointer import write_pointer

        path = ask_for_checkpoint()
        if path is None:
            return None
        return lambda directory: write_pointer(directory, path, run.get("name", name), run.get("config", {}),
                                               run.get("fs"), trial_path=run.get("trial_path"))

    kind = TrainableKind(train_fn=trial, multiworker=True, resources=resources)
    return type(name, (mixin, base), {"_elsewhere_writer": _elsewhere_writer, "tunekit_trainable": kind,
                                      "__module__": getattr(trial, "__module__", __name__)})
