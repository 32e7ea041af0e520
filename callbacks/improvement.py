"""Checkpoint when a trial's best value of a metric improves.
"""

from __future__ import annotations

from typing import Any, Literal

from ray.tune.experiment import Trial
from ray.tune.result import SHOULD_CHECKPOINT
from typing_extensions import override

from tunekit._checks import positive_number
from tunekit.errors import ConfigError
from tunekit.callbacks.record import TunekitCallback

__all__ = ["CheckpointOnImprovement"]


class CheckpointOnImprovement(TunekitCallback):
    """Request a checkpoint whenever ``metric`` beats the trial's best by more than ``min_delta``.

    The first reported value is an improvement (over nothing). A result
    without ``metric`` is ignored. Bests are kept per trial id and across
    experiment resume. After a restore to an earlier checkpoint the best stays
    what it was: a restored trial checkpoints again only when it beats it.
    """

    def __init__(self, metric: str, mode: Literal["min", "max"] = "max", min_delta: float = 0.0) -> None:
        if not isinstance(metric, str) or not metric:
            raise ConfigError(f"CheckpointOnImprovement(metric={metric!r}): must be a non-empty string")
        if mode not in ("min", "max"):
            raise ConfigError(f"CheckpointOnImprovement(mode={mode!r}): must be 'min' or 'max'")
        self.metric = metric
        self.mode = mode
        self.min_delta = positive_number("CheckpointOnImprovement", "min_delta", min_delta, allow_zero=True)
        self._best: dict[str, float] = {}

    @override
    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any) -> None:
        super().on_trial_result(iteration, trials, trial, result, **info)
        value = result.get(self.metric)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            return
        best = self._best.get(trial.trial_id)
        sign = 1.0 if self.mode == "max" else -1.0
        if best is None or sign * (value - best) > self.min_delta:
            self._best[trial.trial_id] = float(value)
            result[SHOULD_CHECKPOINT] = True

    @override
    def get_state(self) -> dict[str, Any] | None:
        return {"best": dict(self._best)}

    @override
    def set_state(self, state: dict[str, Any]) -> None:
        self._best = dict(state.get("best", {}))
