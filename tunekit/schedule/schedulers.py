"""Schedulers that keep every worker busy when trials are shorter than a worker's start.

With ``reuse_actors=True`` Ray Tune hands the worker of a trial that ends to
the trial its scheduler chooses to run next. Ray's FIFO choice (ASHA's too) is
the first waiting trial, and that is the one whose own worker is already
starting on the free CPU: Tune stops that start ("Removing ORIGINAL ACTOR" in
its debug log) and the next waiting trial's worker starts in its place. When
every trial ends before a worker has started (1-3 s), the sweep runs on one
worker to its end, every other CPU starting workers that never train. Seen on
this project's benchmark (400 and 2,000 trials of 4 short iterations, 2 CPUs):
one worker trained all 1,600 steps of a sweep while five processes started and
were stopped, a sweep 1.5x its length on two workers; for the plain trainable
and tunekit's alike, in 2 of 12 sweeps of 2,000 trials (2 of 3 in an earlier run).

The schedulers here choose the waiting trial that asked for a worker *last*
(the newest one; Tune asks in trial order and the first ones get the CPUs), so a
worker that comes free goes to a trial whose start has not begun and the
starting workers go on starting. Nothing else changes: which trials run, their
configs, stopping and early stopping are Ray's. Trials start in another order
within Tune's window of waiting trials (a few more than the CPUs).

    from tunekit.schedule.schedulers import FIFOKeepWorkersBusy

    tune.Tuner(trainable, tune_config=tune.TuneConfig(
        num_samples=2000, reuse_actors=True, scheduler=FIFOKeepWorkersBusy()), ...)

``ASHAKeepWorkersBusy`` takes ``ASHAScheduler``'s arguments; ``KeepWorkersBusy``
goes first in the bases of any other scheduler whose waiting trials are
interchangeable. (``pbt_setup``'s PBT scheduler does the same for PBT, with
paused trials to weigh.) Tested in ``tests/tunekit/test_schedulers.py``.
"""

from __future__ import annotations

from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

__all__ = ["ASHAKeepWorkersBusy", "FIFOKeepWorkersBusy", "KeepWorkersBusy"]


class KeepWorkersBusy:
    """Mixin (first base): of the waiting trials, the newest is chosen to run (see the module docstring)."""

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        trials = tune_controller.get_trials()
        if type(self)._runs_first_waiting():  # FIFO, ASHA: whenever a trial waits, the base would run one
            for trial in reversed(trials):  # the waiting trials are the newest ones: a short walk
                if trial.status == Trial.PENDING:
                    return trial
            return super().choose_trial_to_run(tune_controller)  # type: ignore[misc]
        first = super().choose_trial_to_run(tune_controller)  # type: ignore[misc]
        if first is None or first.status != Trial.PENDING:
            return first
        for trial in reversed(trials):
            if trial.status == Trial.PENDING:
                return trial
        return first

    @classmethod
    def _runs_first_waiting(cls) -> bool:
        """Whether the base's choice is Ray's FIFO one (the first waiting trial, else the first paused one):
        then the base's walk over every trial is skipped whenever a trial waits."""
        chosen = vars(cls).get("_fifo_choice")
        if chosen is None:
            after = cls.__mro__[cls.__mro__.index(KeepWorkersBusy) + 1:]
            base = next((c for c in after if "choose_trial_to_run" in vars(c)), None)
            chosen = base is not None and vars(base)["choose_trial_to_run"] is vars(FIFOScheduler)["choose_trial_to_run"]
            cls._fifo_choice = chosen
        return chosen


class FIFOKeepWorkersBusy(KeepWorkersBusy, FIFOScheduler):
    """Ray's default scheduler (``FIFOScheduler``), each free worker handed to a trial not already starting one."""


class ASHAKeepWorkersBusy(KeepWorkersBusy, ASHAScheduler):
    """``ASHAScheduler`` (same arguments), each free worker handed to a trial not already starting one."""
