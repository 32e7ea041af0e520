"""Checkpoint every running trial and stop gracefully when the machine is about to go."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ray.tune.experiment import Trial
from ray.tune.result import SHOULD_CHECKPOINT
from typing_extensions import override

from tunekit._checks import positive_number
from tunekit.errors import ConfigError, ConfigTypeError
from tunekit.callbacks.record import TunekitCallback

__all__ = ["CheckpointOnPreemption"]

logger = logging.getLogger(__name__)


class CheckpointOnPreemption(TunekitCallback):
    """On SIGTERM, a predicate or a notice file: checkpoint all running trials, then stop.

    Once triggered, every running trial checkpoints at its next result; when
    each trial that was running has checkpointed (or ended), the callback asks
    Tune to stop gracefully (the same path as Ctrl+C: Tune writes the
    experiment state and ``fit()`` returns). ``Tuner.restore(path, trainable)``
    then continues every unfinished trial from that checkpoint, so no reported
    iteration is lost; iterations reported after the checkpoint and before the
    stop are run again.

    Grace period: the time from the notice to the stop is one training
    iteration plus one checkpoint save plus one experiment-state snapshot
    (seconds for small models; size the iteration so this fits inside the
    provider's notice, e.g. 30 s on GCP, 2 minutes on AWS spot).

    Args:
        signals: Signals of the driver that trigger it (default SIGTERM).
            Handlers are installed when the experiment starts, in the main
            thread, and the previous handlers are restored when it ends.
        predicate: Called at most every ``poll_interval_s``; truthy triggers.
        notice_file: Triggers when this path exists (as spot-instance agents
            write one).
        poll_interval_s: How often predicate and notice file are checked.
    """

    def __init__(
        self,
        *,
        signals: tuple[int, ...] = (signal.SIGTERM,),
        predicate: Callable[[], bool] | None = None,
        notice_file: str | os.PathLike[str] | None = None,
        poll_interval_s: float = 1.0,
    ) -> None:
        valid = {s.value for s in signal.Signals}
        for sig in signals:
            if int(sig) not in valid or int(sig) in (signal.SIGKILL, signal.SIGSTOP):
                raise ConfigError(f"CheckpointOnPreemption(signals={signals!r}): {sig!r} cannot be caught")
        if predicate is not None and not callable(predicate):
            raise ConfigTypeError(f"CheckpointOnPreemption(predicate={predicate!r}): must be callable")
        self.signals = tuple(int(s) for s in signals)
        self.predicate = predicate
        self.notice_file = Path(notice_file) if notice_file is not None else None
        self.poll_interval_s = positive_number("CheckpointOnPreemption", "poll_interval_s", poll_interval_s)
        self.triggered_by: str | None = None
        self._pending: set[str] | None = None
        self._last_poll = float("-inf")
        self._previous: dict[int, Any] = {}
        self._stop_sent = False

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_previous": {}, "triggered_by": None, "_pending": None, "_stop_sent": False}

    # -- triggering -----------------------------------------------------------
    def trigger(self, reason: str) -> None:
        """Start the checkpoint-and-stop sequence (idempotent)."""
        if self.triggered_by is None:
            self.triggered_by = reason
            logger.warning("tunekit: preemption notice (%s): checkpointing running trials, then stopping", reason)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.trigger(signal.Signals(signum).name)

    @override
    def setup(self, **info: Any) -> None:
        super().setup(**info)
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._on_signal)

    @override
    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        super().on_experiment_end(trials, **info)

    @override
    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if self.triggered_by is None:
            now = time.monotonic()
            if now - self._last_poll >= self.poll_interval_s:
                self._last_poll = now
                if self.notice_file is not None and self.notice_file.exists():
                    self.trigger(f"notice file {self.notice_file}")
                elif self.predicate is not None and self.predicate():
                    self.trigger("predicate")
        if self.triggered_by is not None:
            if self._pending is None:
                self._pending = {t.trial_id for t in trials if t.status == Trial.RUNNING}
            live = {t.trial_id for t in trials if t.status == Trial.RUNNING}
            self._pending &= live
            if not self._pending:
                self._request_stop()

    # -- checkpointing --------------------------------------------------------
    @override
    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any) -> None:
        super().on_trial_result(iteration, trials, trial, result, **info)
        if self.triggered_by is not None and (self._pending is None or trial.trial_id in self._pending):
            result[SHOULD_CHECKPOINT] = True

    @override
    def on_checkpoint(self, iteration: int, trials: list[Trial], trial: Trial, checkpoint: Any, **info: Any) -> None:
        if self.triggered_by is not None and self._pending is not None:
            self._pending.discard(trial.trial_id)

    def _request_stop(self) -> None:
        if not self._stop_sent:
            self._stop_sent = True
            # Tune's own graceful stop (as Ctrl+C): it snapshots the experiment state.
            os.kill(os.getpid(), signal.SIGUSR1)
