"""Argument checks shared by tunekit, its callbacks and trainables.

Each raises :class:`tunekit.ConfigError` (a ``ValueError``) whose one-line
message repeats the call: ``CheckpointByStepsTaken(iterations_per_checkpoint=0):
must be an integer >= 1``.
"""

from __future__ import annotations

import math
from typing import Any

from tunekit.errors import ConfigError

__all__ = [
    "SCOPES", "UsageError", "as_number", "check_mode", "check_scope", "integer_at_least", "is_number",
    "number_at_least", "positive_number"
]


class UsageError(Exception):
    """A command line used wrongly (``--metric`` without ``--mode``, say): its message is the whole line the
    command prints before it exits 2."""


#: How a trial's series of a metric is reduced to one value when trials are ranked
#: (``"avg"``, Ray's word, is taken for ``"mean"``).
SCOPES = ("last", "max", "min", "mean")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float (bools excluded)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def as_number(value: Any) -> float | None:
    """``value`` as a float if it :func:`is_number`, else None."""
    return float(value) if is_number(value) else None


def integer_at_least(call: str, name: str, value: Any, low: int = 1, *, allow_none: bool = False) -> Any:
    """``value`` if it is an integer >= ``low`` (or None when allowed); else ConfigError.

    >>> integer_at_least("f", "n", 0)
    Traceback (most recent call last):
    tunekit.errors.ConfigError: f(n=0): must be an integer >= 1
    """
    if value is None and allow_none:
        return value
    if not _is_int(value) or value < low:
        raise ConfigError(f"{call}({name}={value!r}): must be an integer >= {low}{' or None' if allow_none else ''}")
    return value


def number_at_least(call: str, name: str, value: Any, low: float = 0.0) -> float:
    """``value`` as a float if it is a finite number >= ``low``; else ConfigError."""
    if not is_number(value) or value < low:
        raise ConfigError(f"{call}({name}={value!r}): must be a number >= {low:g}")
    return float(value)


def positive_number(call: str, name: str, value: Any, *, allow_zero: bool = False) -> float:
    """``value`` as a float if it is a finite number > 0 (>= 0 with ``allow_zero``); else ConfigError."""
    if not is_number(value) or not (value >= 0 if allow_zero else value > 0):
        raise ConfigError(f"{call}({name}={value!r}): must be a finite number {'>= 0' if allow_zero else '> 0'}")
    return float(value)


def check_mode(call: str, mode: Any) -> str:
    """``mode`` if it is ``"max"`` or ``"min"``; else ConfigError.

    >>> check_mode("best_trial", "best")
    Traceback (most recent call last):
    tunekit.errors.ConfigError: best_trial(mode='best'): expected 'max' or 'min'
    """
    if mode not in ("max", "min"):
        raise ConfigError(f"{call}(mode={mode!r}): expected 'max' or 'min'")
    return str(mode)


def check_scope(call: str, scope: Any) -> str:
    """``scope`` as one of :data:`SCOPES` (``"avg"`` is ``"mean"``); else ConfigError."""
    if scope == "avg":
        return "mean"
    if scope not in SCOPES:
        raise ConfigError(f"{call}(scope={scope!r}): expected 'last', 'max', 'min' or 'mean'")
    return str(scope)
