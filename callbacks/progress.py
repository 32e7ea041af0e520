"""A compact progress printer for long sweeps."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from ray.tune.experiment import Trial
from typing_extensions import override

from tunekit._checks import is_number, number_at_least
from tunekit._keys import INTERVAL_KEY
from tunekit.schedule.interval import describe_intervals
from tunekit.errors import ConfigError
from tunekit.callbacks.record import TunekitCallback

__all__ = ["ProgressPrinter", "TRIAL_LINES_UP_TO", "error_line"]


#: Up to this many trials in a sweep, each trial's end is a line of its own; beyond it the ends are counted in the
#: status lines (a sweep of thousands of short trials would otherwise print a line per trial).
TRIAL_LINES_UP_TO = 100


class ProgressPrinter(TunekitCallback):
    """Print one status line at most every ``interval_s`` seconds, and each trial's end in a sweep of at most
    :data:`TRIAL_LINES_UP_TO` trials (beyond it, the status line's counts by state say how many ended). Each
    failed trial is a line of its own, whatever the sweep's size, and again at the end of the run."""

    def __init__(self, metric: str, *, interval_s: float = 5.0, stream: TextIO | None = None) -> None:
        if not isinstance(metric, str) or not metric:
            raise ConfigError(f"ProgressPrinter(metric={metric!r}): must be a non-empty string")
        number_at_least("ProgressPrinter", "interval_s", interval_s)
        self.metric = metric
        self.interval_s = float(interval_s)
        self.stream = stream
        self._start = time.monotonic()
        self._last_print = float("-inf")
        self._latest: dict[str, dict[str, Any]] = {}
        self._failed: dict[str, str] = {}
        self._intervals: dict[str, float] = {}  # CheckpointAutopilot's choice per trial

    def _recorded_kwargs(self) -> dict[str, Any]:
        return {"metric": self.metric, "interval_s": self.interval_s}

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks into the experiment state; a stream is not state.
        return {**self.__dict__, "stream": None}

    def _print(self, line: str) -> None:
        print(f"[{time.monotonic() - self._start:6.1f}s] {line}", file=self.stream or sys.stdout, flush=True)

    @override
    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any) -> None:
        super().on_trial_result(iteration, trials, trial, result, **info)
        for seen in (self._latest.get(trial.trial_id, {}), result):  # a later callback may add it to its result
            if is_number(seen.get(INTERVAL_KEY)):
                self._intervals[trial.trial_id] = seen[INTERVAL_KEY]
        self._latest[trial.trial_id] = result
        now = time.monotonic()
        if now - self._last_print < self.interval_s:
            return
        self._last_print = now
        values = [r.get(self.metric) for r in self._latest.values() if isinstance(r.get(self.metric), (int, float))]
        best = f"best {self.metric}={max(values):.4f}" if values else f"no {self.metric} yet"
        states: dict[str, int] = {}
        for t in trials:
            states[t.status] = states.get(t.status, 0) + 1
        counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items()))
        iters = sum(int(r.get("training_iteration", 0)) for r in self._latest.values())
        every = describe_intervals(list(self._intervals.values()))
        self._print(f"{len(trials)} trials ({counts}); {iters} iterations; {best}"
                    + (f"; checkpoints {every}" if every else ""))

    @override
    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        super().on_trial_complete(iteration, trials, trial, **info)
        if len(trials) > TRIAL_LINES_UP_TO:
            return
        result = trial.last_result or {}
        value = result.get(self.metric)
        shown = f"{value:.4f}" if isinstance(value, (int, float)) else "n/a"
        self._print(f"trial {trial.trial_id} done after {result.get('training_iteration', 0)} iterations, {self.metric}={shown}")

    @override
    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        super().on_trial_error(iteration, trials, trial, **info)
        reason = error_line(trial)
        self._failed[trial.trial_id] = reason
        self._print(f"trial {trial.trial_id} failed: {reason}")

    @override
    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        """The failed trials again, one line each, after Ray's own output."""
        for trial_id, reason in sorted(self._failed.items()):
            self._print(f"failed: {trial_id}: {reason}")
        super().on_experiment_end(trials, **info)


def error_line(trial: Trial) -> str:
    """A failed trial's error as one line: the exception's own line from its ``error.txt``."""
    from tunekit.experiment.snapshot import error_message

    text = None
    path = getattr(trial, "error_file", None)
    try:
        if path:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
    except OSError:
        text = None
    return error_message(text) or (path or "see its error.txt")
