"""Checkpoint every N iterations of each trial.
"""

from __future__ import annotations

from typing import Any

from ray.tune.experiment import Trial
from ray.tune.result import SHOULD_CHECKPOINT, TRAINING_ITERATION
from typing_extensions import override

from tunekit._checks import integer_at_least
from tunekit.callbacks.record import TunekitCallback

ITERATIONS_SINCE_RESTORE = "iterations_since_restore"  # autofilled by Trainable.train

__all__ = ["CheckpointByStepsTaken"]


class CheckpointByStepsTaken(TunekitCallback):
    """Request a checkpoint when a trial has taken N iterations since its last one.

    Counting starts at iteration 0, so with N=5 a trial checkpoints after
    iterations 5, 10, 15, ... A trial restored from a checkpoint at iteration
    r (failure retry, experiment resume, PBT exploit; recognised by
    ``iterations_since_restore == 1`` in its first result after) counts from
    r: it checkpoints after r+N, r+2N, ... State is keyed by trial id and
    kept across experiment resume (``get_state``/``set_state``).
    """

    def __init__(self, iterations_per_checkpoint: int) -> None:
        integer_at_least("CheckpointByStepsTaken", "iterations_per_checkpoint", iterations_per_checkpoint)
        self.steps_per_checkpoint = iterations_per_checkpoint
        self._last: dict[str, int] = {}

    @override
    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        super().on_trial_result(iteration, trials, trial, result, **info)
        current = int(result[TRAINING_ITERATION])
        if result.get(ITERATIONS_SINCE_RESTORE) == 1:
            # First result after a start or restore (retry, resume, PBT exploit):
            # count from the iteration the trial was restored at.
            self._last[trial.trial_id] = current - 1
        last = self._last.get(trial.trial_id, 0)
        if current - last >= self.steps_per_checkpoint:
            result[SHOULD_CHECKPOINT] = True
            self._last[trial.trial_id] = current

    @override
    def get_state(self) -> dict[str, Any] | None:
        return {"last": dict(self._last)}

    @override
    def set_state(self, state: dict[str, Any]) -> None:
        self._last = dict(state.get("last", {}))
