"""The checkpoint interval, chosen from what a save costs and how often trials fail (Young, Daly).

A pure module (no Ray, no torch): the formulas, the expected-runtime model they come from, and the
estimate of the mean time between failures that :class:`tunekit.callbacks.CheckpointAutopilot` and
``benchmarks/interval.py`` both use.

* Young (1974): ``T = sqrt(2 C M)``, with ``C`` the cost of one checkpoint (the time training is
  blocked) and ``M`` the mean time between failures.
* Daly (2006), the higher-order optimum: ``T = sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C``
  for ``C < 2M``, else ``T = M``. His example: ``M`` = 24 h, ``C`` = 5 min gives 117 min.
* Daly's expected wall time for ``W`` of work at interval ``T`` with restart cost ``R``:
  ``M e^(R/M) (e^((T + C)/M) - 1) W / T``.
* ``M`` is estimated with a Gamma-Poisson update: failures arrive at rate ``1/M``; the rate's prior is
  ``Gamma(shape a0, rate b0)`` with ``a0 = 1`` and ``b0 = M0`` for a user's prior ``M0`` (the weight of
  one failure seen after ``M0`` of training), or no prior at all (``a0 = b0 = 0``). After ``k`` failures
  in ``t`` seconds of training, the posterior is ``Gamma(a0 + k, b0 + t)`` and ``M`` is estimated as
  ``(b0 + t) / (a0 + k)``, the inverse of the posterior mean rate; with no prior and no failure yet it is
  unknown (None), and only the overhead bound applies.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tunekit.errors import ConfigError

__all__ = [
    "MtbfEstimate", "choose_interval", "daly_interval", "describe_intervals", "expected_runtime", "format_duration",
    "parse_duration", "trial_intervals", "young_interval"
]



def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum ``sqrt(2 C M)``.

    >>> round(young_interval(5 * 60, 24 * 3600) / 60)
    120
    """
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (``M`` when ``C >= 2M``).

    >>> round(daly_interval(5 * 60, 24 * 3600) / 60)
    117
    """
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - cost_s


def expected_runtime(work_s: float, interval_s: float, cost_s: float, mtbf_s: float | None,
                     restart_s: float = 0.0) -> float:
    """Daly's expected wall time to finish ``work_s`` of training checkpointing every ``interval_s``
    (``mtbf_s=None``: no failures, only the checkpoints' cost)."""
    if mtbf_s is None or math.isinf(mtbf_s):
        return work_s * (1.0 + cost_s / interval_s)
    m = mtbf_s
    return m * math.exp(restart_s / m) * math.expm1((interval_s + cost_s) / m) * work_s / interval_s


@dataclass
class MtbfEstimate:
    """The mean time between failures, from a prior and the failures seen (Gamma-Poisson, module doc).

    >>> m = MtbfEstimate(prior_s=3600.0)
    >>> m.observe(seconds=1800.0, failures=2)
    >>> round(m.mtbf_s)
    1800
    """

    prior_s: float | None = None
    seconds: float = 0.0
    failures: int = 0

    def observe(self, *, seconds: float = 0.0, failures: int = 0) -> None:
        """Add ``seconds`` of training exposure and ``failures`` seen in it."""
        self.seconds += max(0.0, float(seconds))
        self.failures += int(failures)

    @property
    def mtbf_s(self) -> float | None:
        shape = (1.0 if self.prior_s else 0.0) + self.failures
        rate = (self.prior_s or 0.0) + self.seconds
        return rate / shape if shape > 0 else None


def choose_interval(*, cost_s: float, mtbf_s: float | None, write_s: float = 0.0, max_overhead: float | None = 0.05,
                    min_interval_s: float = 0.0, max_interval_s: float = math.inf) -> float:
    """The checkpoint interval: Daly's optimum for ``cost_s`` and ``mtbf_s`` (none without an MTBF), no
    shorter than what keeps checkpoints within ``max_overhead`` of training time (``cost_s / max_overhead``)
    nor than the write of a checkpoint (``write_s``: a new one is never asked for while one is written),
    clamped to ``[min_interval_s, max_interval_s]``.

    >>> choose_interval(cost_s=0.5, mtbf_s=None, max_overhead=0.05)
    10.0
    """
    daly = daly_interval(cost_s, mtbf_s) if mtbf_s is not None else 0.0
    bound = cost_s / max_overhead if max_overhead else 0.0
    if mtbf_s is None and not max_overhead:
        bound = max_interval_s  # nothing to decide from: as rarely as allowed
    return min(max(daly, bound, write_s, min_interval_s), max_interval_s)


_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: float | str, call: str, name: str) -> float:
    """Seconds from ``3600``, ``"90s"``, ``"15min"``, ``"6h"`` or ``"2d"`` (ConfigError: ``call(name=value)``)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and math.isfinite(value):
        return float(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|m|min|h|d)\s*", value) if isinstance(value, str) else None
    if match is None or float(match[1]) <= 0:
        raise ConfigError(f"{call}({name}={value!r}): expected a positive duration: seconds, or e.g. '90s', '15min', '6h', '2d'")
    return float(match[1]) * _UNITS[match[2]]


def format_duration(seconds: float) -> str:
    """A duration as people read it: ``"0.8s"``, ``"42s"``, ``"12.5min"``, ``"3.2h"``, ``"inf"``.

    >>> format_duration(750.0)
    '12.5min'
    """
    if not math.isfinite(seconds):
        return "inf"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:.3g}{unit}"
    return f"{seconds:.2g}s" if seconds < 10 else f"{seconds:.0f}s"


def describe_intervals(values: list[float]) -> str | None:
    """The intervals the trials checkpoint at, for a status line: ``"every 42s"`` or ``"every 8.1s-42s
    (median 20s)"``; None when no trial has one.

    >>> describe_intervals([8.1, 42.0, 20.0])
    'every 8.1s-42s (median 20s)'
    """
    finite = sorted(v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0)
    if not finite:
        return None
    low, high, median = finite[0], finite[-1], finite[len(finite) // 2]
    if format_duration(low) == format_duration(high):
        return f"every {format_duration(low)}"
    return f"every {format_duration(low)}-{format_duration(high)} (median {format_duration(median)})"


def trial_intervals(chosen: Mapping[str, Any]) -> tuple[dict[str, str], str] | None:
    """The readers' column and line for the intervals the autopilot chose (``chosen``: each trial's
    last :data:`~tunekit._keys.INTERVAL_KEY`, None where it has none): each trial's interval as shown (``"-"`` where none)
    and :func:`describe_intervals` of them all; None when the autopilot did not run.

    >>> trial_intervals({"a": 8.0, "b": None})
    ({'a': '8s', 'b': '-'}, 'every 8s')
    """
    described = describe_intervals([v for v in chosen.values() if v is not None])
    if described is None:
        return None
    return {k: "-" if v is None else format_duration(v) for k, v in chosen.items()}, described
