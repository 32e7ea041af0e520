"""Checkpoint each trial at most once per interval of wall time.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ray.tune.experiment import Trial
from ray.tune.result import SHOULD_CHECKPOINT
from typing_extensions import override

from tunekit._checks import positive_number
from tunekit.callbacks.record import TunekitCallback

ITERATIONS_SINCE_RESTORE = "iterations_since_restore"  # autofilled by Trainable.train

__all__ = ["CheckpointByTime"]


class CheckpointByTime(TunekitCallback):
    """Request a checkpoint when ``seconds`` of wall time passed since the trial's last one.

    A trial's clock starts at its first result (after a restore: at its first
    result after the restore), so its first callback checkpoint comes with the
    first result at least ``seconds`` later; at most one callback checkpoint
    per trial per interval. Clocks are not carried across experiment resume:
    they restart there.
    """

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = positive_number("CheckpointByTime", "seconds", seconds)
        self._clock = clock
        self._since: dict[str, float] = {}

    @override
    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any) -> None:
        super().on_trial_result(iteration, trials, trial, result, **info)
        now = self._clock()
        if result.get(ITERATIONS_SINCE_RESTORE) == 1:  # (re)started: restart its clock
            self._since.pop(trial.trial_id, None)
        start = self._since.setdefault(trial.trial_id, now)
        if now - start >= self.seconds:
            result[SHOULD_CHECKPOINT] = True
            self._since[trial.trial_id] = now

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_since": {}}
