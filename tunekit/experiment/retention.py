"""Which checkpoints a retention policy keeps: the one planner of ``tunekit gc`` and the ``KeepCheckpoints`` callback.

:func:`plan` is a pure function of the trials' checkpoints, the policy and what the caller knows is still
needed (the callback: what the scheduler may restore and what is being written). It keeps the union of the
selections (as Determined's GC policy: ``experiment_best``, ``trial_best`` by ``metric`` in ``mode``,
``trial_latest``), each unfinished trial's newest (what a retry or ``tunekit resume`` restores) and what is
needed. The caller says which checkpoints count (whole ones for the callback, ones that verify for ``gc``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Sequence

from tunekit.experiment._snapshot_model import CheckpointSummary, ranked
from tunekit.errors import ConfigError

__all__ = ["Plan", "Policy", "TrialCheckpoints", "newest_first", "plan", "selected"]


def _count(call: str, name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{call}({name}={value!r}): expected a whole number >= 0")
    return value


@dataclass(frozen=True)
class Policy:
    """A checked retention policy; a selection left ``None`` keeps nothing by itself."""

    experiment_best: int | None = None
    trial_best: int | None = None
    trial_latest: int | None = None
    metric: str | None = None
    mode: Literal["max", "min"] | None = None

    @classmethod
    def checked(cls, call: str, *, experiment_best: Any = None, trial_best: Any = None, trial_latest: Any = None,
                metric: Any = None, mode: Any = None, flags: bool = False) -> Policy:
        """The policy, or one :class:`ConfigError` line naming the bad argument (``flags``: CLI spelling)."""
        policy = cls(_count(call, "experiment_best", experiment_best), _count(call, "trial_best", trial_best),
                     _count(call, "trial_latest", trial_latest), metric, mode)
        if mode is not None and mode not in ("max", "min"):
            raise ConfigError(f"{call}(mode={mode!r}): expected 'max' or 'min'")
        if metric is not None and (not isinstance(metric, str) or not metric):
            raise ConfigError(f"{call}(metric={metric!r}): expected a metric name")
        if (policy.experiment_best or policy.trial_best) and (not metric or mode is None):
            raise ConfigError("--experiment-best and --trial-best rank by a metric: give --metric M and --mode max|min"
                              if flags else f"{call}: experiment_best and trial_best rank by a metric: "
                              "give metric= and mode='max'|'min'")
        return policy

    @property
    def selects(self) -> bool:
        """Whether any selection was given (else the policy keeps everything)."""
        return (self.experiment_best, self.trial_best, self.trial_latest) != (None, None, None)

    @property
    def ranks(self) -> bool:
        return bool(self.metric and self.mode)


def newest_first(checkpoints: Sequence[CheckpointSummary]) -> list[CheckpointSummary]:
    """By iteration, then name, newest first (an unknown iteration counts as 0)."""
    return sorted(checkpoints, key=lambda c: (c.iteration or 0, c.name), reverse=True)


def selected(trials: Mapping[str, Sequence[CheckpointSummary]], policy: Policy) -> set[str]:
    """URIs of the checkpoints the policy's selections keep, ``trials`` mapping a trial to its checkpoints (an
    ``experiment_best`` tie goes to the trial first in ``trials``)."""
    keep: set[str] = set()
    if policy.experiment_best and policy.ranks:
        everything = [c for cs in trials.values() for c in cs]
        keep |= {c.uri for c in ranked(everything, policy.metric, policy.mode)[:policy.experiment_best]}
    for checkpoints in trials.values():
        if policy.trial_latest:
            keep |= {c.uri for c in newest_first(checkpoints)[:policy.trial_latest]}
        if policy.trial_best and policy.ranks:
            keep |= {c.uri for c in ranked(list(checkpoints), policy.metric, policy.mode)[:policy.trial_best]}
    return keep


@dataclass(frozen=True)
class TrialCheckpoints:
    """One trial as retention sees it: the checkpoints that count, and whether it may still go on."""

    checkpoints: Sequence[CheckpointSummary]
    #: An unfinished trial's newest checkpoint is what a retry or a resume restores: always kept.
    finished: bool = True


@dataclass(frozen=True)
class Plan:
    """What :func:`plan` keeps: ``needed`` (never deleted, even over a size budget) within ``keep``."""

    keep: frozenset[str]
    needed: frozenset[str]


def plan(trials: Mapping[str, TrialCheckpoints], policy: Policy, needed: Iterable[str] = ()) -> Plan:
    """The checkpoints (by URI) to keep of ``trials``: the policy's selections, each unfinished trial's newest,
    and ``needed``. Every checkpoint of ``trials`` not in ``keep`` may be deleted."""
    must = set(needed)
    for trial in trials.values():
        if not trial.finished and trial.checkpoints:
            must.add(newest_first(trial.checkpoints)[0].uri)
    chosen = selected({tid: t.checkpoints for tid, t in trials.items()}, policy) if policy.selects else \
        {c.uri for t in trials.values() for c in t.checkpoints}
    return Plan(frozenset(chosen | must), frozenset(must))
