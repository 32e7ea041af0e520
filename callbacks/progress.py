"""A compact progress printer for long sweeps."""

from __future__ import annotations

import sys
import time
from collections import Counter
from operator import attrgetter
from typing import Any, TextIO

from ray.tune.experiment import Trial
from typing_extensions import override

from tunekit._checks import as_number, is_number, number_at_least
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
    failed trial is a line of its own, whatever the sweep's size, and again at the end of the run.

    The status line names the best ``metric`` of the trials' latest results by ``mode`` (``"max"`` or ``"min"``);
    without a mode it names the highest, and says so. A line costs a pass over the trials still going on: an
    ended trial's result is folded into the counts when it ends."""

    def __init__(self, metric: str, *, mode: str | None = None, interval_s: float = 5.0,
                 stream: TextIO | None = None) -> None:
        if not isinstance(metric, str) or not metric:
            raise ConfigError(f"ProgressPrinter(metric={metric!r}): must be a non-empty string")
        if mode not in (None, "max", "min"):
            raise ConfigError(f"ProgressPrinter(mode={mode!r}): must be 'max', 'min' or None (the {metric} shown is "
                              "then the highest)")
        number_at_least("ProgressPrinter", "interval_s", interval_s)
        self.metric = metric
        self.mode = mode
        self.interval_s = float(interval_s)
        self.stream = stream
        self._start = time.monotonic()
        self._last_print = float("-inf")
        self._intervals: dict[str, float] = {}  # CheckpointAutopilot's choice per trial
        self._failed: dict[str, str] = {}
        self._reset_counts()

    def _reset_counts(self) -> None:
        #: The trials still going on: their latest result. An ended trial is folded into ``_ended`` (its
        #: metric and iteration), so a status line is a pass over the trials going on, not over every trial.
        self._latest: dict[str, dict[str, Any]] = {}
        self._ended: dict[str, tuple[float | None, int]] = {}
        self._ended_best: float | None = None
        self._ended_iterations = 0

    def _recorded_kwargs(self) -> dict[str, Any]:
        return {"metric": self.metric, "mode": self.mode, "interval_s": self.interval_s}

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks into the experiment state; a stream is not state.
        return {**self.__dict__, "stream": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "_ended" not in state:  # (pickled before the ended trials were folded: their results counted anew)
            self.mode = state.get("mode")
            self._reset_counts()
            self._latest = dict(state.get("_latest") or {})

    def _better(self, a: float | None, b: float | None) -> float | None:
        if a is None or b is None:
            return b if a is None else a
        return min(a, b) if self.mode == "min" else max(a, b)

    def _value(self, result: dict[str, Any]) -> float | None:
        return as_number(result.get(self.metric))  # (a NaN or an infinity is never named the best)

    def _print(self, line: str) -> None:
        print(f"[{time.monotonic() - self._start:6.1f}s] {line}", file=self.stream or sys.stdout, flush=True)

    @override
    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any) -> None:
        super().on_trial_result(iteration, trials, trial, result, **info)
        self._note_interval(trial.trial_id, result)
        if trial.trial_id in self._ended:  # (a result after its end: counted as going on again)
            value, done = self._ended.pop(trial.trial_id)
            self._ended_iterations -= done
            if value is not None and value == self._ended_best:  # (the best left: found again among the rest)
                self._ended_best = None
                for value, _ in self._ended.values():
                    self._ended_best = self._better(self._ended_best, value)
        self._latest[trial.trial_id] = result
        now = time.monotonic()
        if now - self._last_print < self.interval_s:
            return
        self._last_print = now
        best = self._ended_best
        for going in self._latest.values():
            best = self._better(best, self._value(going))
        word = "best" if self.mode else "highest"  # (which is best is not known without a mode)
        shown = f"{word} {self.metric}={best:.4f}" if best is not None else f"no {self.metric} yet"
        counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(Counter(map(attrgetter("status"), trials)).items()))
        iters = self._ended_iterations + sum(int(r.get("training_iteration", 0)) for r in self._latest.values())
        every = describe_intervals(list(self._intervals.values()))
        self._print(f"{len(trials)} trials ({counts}); {iters} iterations; {shown}"
                    + (f"; checkpoints {every}" if every else ""))

    def _note_interval(self, trial_id: str, result: dict[str, Any]) -> None:
        for seen in (self._latest.get(trial_id, {}), result):  # a later callback may add it to its result
            if is_number(seen.get(INTERVAL_KEY)):
                self._intervals[trial_id] = seen[INTERVAL_KEY]

    def _fold(self, trial: Trial) -> None:
        """An ended trial's latest result folded into the counts of the ended ones."""
        result = self._latest.pop(trial.trial_id, None)
        if result is None:
            return
        self._note_interval(trial.trial_id, result)
        value, done = self._value(result), int(result.get("training_iteration", 0))
        self._ended[trial.trial_id] = (value, done)
        self._ended_best = self._better(self._ended_best, value)
        self._ended_iterations += done

    @override
    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        super().on_trial_complete(iteration, trials, trial, **info)
        self._fold(trial)
        if len(trials) > TRIAL_LINES_UP_TO:
            return
        result = trial.last_result or {}
        value = result.get(self.metric)
        shown = f"{value:.4f}" if isinstance(value, (int, float)) else "n/a"
        self._print(f"trial {trial.trial_id} done after {result.get('training_iteration', 0)} iterations, {self.metric}={shown}")

    @override
    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        super().on_trial_error(iteration, trials, trial, **info)
        self._fold(trial)
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
