"""Argument checks shared by the callbacks (messages repeat the call)."""

from __future__ import annotations

from typing import Any


def positive_number(call: str, name: str, value: Any, *, allow_zero: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and (value >= 0 if allow_zero else value > 0)
    if not ok or value != value or value == float("inf"):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{call}({name}={value!r}): must be a finite number {bound}")
    return float(value)
