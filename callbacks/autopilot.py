"""Checkpoint each trial at the interval chosen from its measured save cost and the failures seen.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ray.tune.experiment import Trial
from ray.tune.result import SHOULD_CHECKPOINT
from typing_extensions import override

from tunekit._checks import is_number, positive_number
from tunekit.callbacks.record import TunekitCallback
from tunekit.errors import ConfigError
from tunekit._keys import INTERVAL_KEY, SAVE_BLOCKED_KEY, SAVE_WRITE_KEY
from tunekit.schedule.interval import MtbfEstimate, choose_interval, parse_duration

__all__ = ["CheckpointAutopilot"]

#: How many of a trial's latest saves its cost estimate is the mean of. A save through the page cache blocks
#: for anything from a fraction to several times its mean, depending on writeback: a mean over several saves
#: is what Daly's formula and the overhead bound need; a moving average would follow one fast save.
_WINDOW = 8


def _mean(values: deque[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass
class _TrialClock:
    costs: deque[float] = field(default_factory=lambda: deque(maxlen=_WINDOW))  # what saves blocked for
    writes: deque[float] = field(default_factory=lambda: deque(maxlen=_WINDOW))  # how long their writes took
    since_s: float = 0.0  # training time since the trial's last checkpoint
    interval_s: float | None = None


class CheckpointAutopilot(TunekitCallback):
    """Checkpoint each trial every ``T`` seconds of training, ``T`` chosen and re-chosen as it runs.

    ``T`` is Daly's optimum (:func:`tunekit.schedule.interval.daly_interval`) for the trial's measured save cost
    ``C`` (what ``save()`` blocks training for: tunekit's trainables report it as
    ``tunekit/save_blocked_s``) and the mean time between failures ``M`` estimated from the failures
    seen in this experiment (every trial's retries and errors over all trials' training time, a
    Gamma-Poisson update from the prior ``mtbf``: :class:`tunekit.schedule.interval.MtbfEstimate`). ``T`` is
    never shorter than what keeps checkpoints within ``max_overhead`` of training time (``C /
    max_overhead``), nor than the trial's checkpoint write (``tunekit/save_write_s``: a checkpoint is
    never asked for while one is being written), and stays in ``[min_interval_s, max_interval_s]``.
    A trial's first result asks for a checkpoint (to measure ``C``); each result carries the chosen ``T``
    as ``tunekit/checkpoint_interval_s``. It only ever asks for a checkpoint (``should_checkpoint``),
    so it composes with ``CheckpointConfig`` and the other policies (Tune saves an iteration once).

    Args:
        mtbf: The prior mean time between failures: seconds or ``"6h"``, ``"30min"``; None (default):
            no prior, only the overhead bound applies until a failure is seen.
        max_overhead: The fraction of training time checkpoints may cost (None: no bound).
        min_interval_s: The shortest interval.
        max_interval_s: The longest (None: no limit; with neither an MTBF nor an overhead bound
            there is nothing to choose from, so give one).
    """

    def __init__(self, mtbf: float | str | None = None, *, max_overhead: float | None = 0.05,
                 min_interval_s: float = 0.0, max_interval_s: float | None = None) -> None:
        call = "CheckpointAutopilot"
        self.mtbf_prior_s = parse_duration(mtbf, call, "mtbf") if mtbf is not None else None
        if max_overhead is not None and not (is_number(max_overhead) and 0 < max_overhead <= 1):
            raise ConfigError(f"{call}(max_overhead={max_overhead!r}): must be a fraction in (0, 1], or None")
        self.max_overhead = max_overhead
        self.min_interval_s = positive_number(call, "min_interval_s", min_interval_s, allow_zero=True)
        self.max_interval_s = math.inf if max_interval_s is None else positive_number(call, "max_interval_s",
                                                                                        max_interval_s)
        if self.min_interval_s > self.max_interval_s:
            raise ConfigError(f"{call}(min_interval_s={min_interval_s!r}, max_interval_s={max_interval_s!r}): "
                              "the minimum exceeds the maximum")
        if mtbf is None and max_overhead is None and max_interval_s is None:
            raise ConfigError(f"{call}(): with no mtbf and max_overhead=None, give max_interval_s")
        self.mtbf = MtbfEstimate(self.mtbf_prior_s)
        self._trials: dict[str, _TrialClock] = {}

    def _recorded_kwargs(self) -> dict[str, Any] | None:
        return {"mtbf": self.mtbf_prior_s, "max_overhead": self.max_overhead, "min_interval_s": self.min_interval_s,
                "max_interval_s": None if math.isinf(self.max_interval_s) else self.max_interval_s}

    @override
    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any],
                        **info: Any) -> None:
        super().on_trial_result(iteration, trials, trial, result, **info)
        clock = self._trials.setdefault(trial.trial_id, _TrialClock())
        took = result.get("time_this_iter_s")
        took = float(took) if is_number(took) else 0.0
        self.mtbf.observe(seconds=took)
        if result.get("iterations_since_restore") == 1:  # (re)started from a checkpoint, or from scratch
            clock.since_s = 0.0
        clock.since_s += took
        for key, values in ((SAVE_BLOCKED_KEY, clock.costs), (SAVE_WRITE_KEY, clock.writes)):
            if is_number(result.get(key)):
                values.append(float(result[key]))
        cost_s = _mean(clock.costs)
        if cost_s is None:  # no save measured yet: one now, to measure it
            result[SHOULD_CHECKPOINT], clock.since_s = True, 0.0
            return
        clock.interval_s = choose_interval(cost_s=cost_s, mtbf_s=self.mtbf.mtbf_s, write_s=_mean(clock.writes) or 0.0,
                                           max_overhead=self.max_overhead, min_interval_s=self.min_interval_s,
                                           max_interval_s=self.max_interval_s)
        result[INTERVAL_KEY] = clock.interval_s
        if clock.since_s >= clock.interval_s:
            result[SHOULD_CHECKPOINT], clock.since_s = True, 0.0

    @override
    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.mtbf.observe(failures=1)  # a worker died or the trial raised: Tune retries it

    @override
    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        super().on_trial_error(iteration, trials, trial, **info)
        self.mtbf.observe(failures=1)

    def get_state(self) -> dict[str, Any]:
        """What it learned of failures survives an experiment resume."""
        return {"seconds": self.mtbf.seconds, "failures": self.mtbf.failures}

    def set_state(self, state: dict[str, Any]) -> None:
        self.mtbf.seconds, self.mtbf.failures = float(state["seconds"]), int(state["failures"])
