"""Flatten Tune results into rows and rows into Arrow tables (shared by the logger and the readers).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import pyarrow as pa

__all__ = ["JOURNAL", "RESULTS_DIR", "flatten_result", "format_bytes", "format_table", "rows_to_table"]

#: Where :class:`tunekit.callbacks.ParquetLogger` writes, inside the experiment directory.
RESULTS_DIR = "tunekit_results"
#: The end of the name of a session's journal there (``.part-<session>-journal.jsonl``): the rows it secured
#: and has not yet written as Parquet, one JSON object a line.
JOURNAL = "journal.jsonl"


def flatten_result(result: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"config": {"lr": 0.1}}`` -> ``{"config/lr": 0.1}``; lists become JSON text.

    >>> flatten_result({"loss": 1.0, "config": {"lr": 0.1, "net": {"width": 8}}})
    {'loss': 1.0, 'config/lr': 0.1, 'config/net/width': 8}
    """
    out: dict[str, Any] = {}
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten_result(value, name + "/"))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(value, default=repr)
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = repr(value)
    return out


def _column(values: list[Any]) -> pa.Array:
    kinds = {type(v) for v in values if v is not None}
    if kinds <= {bool}:
        return pa.array(values, type=pa.bool_())
    if kinds <= {int} and all(v is None or -(2**63) <= v < 2**63 for v in values):
        return pa.array(values, type=pa.int64())
    if kinds <= {int, float}:
        return pa.array([None if v is None else float(v) for v in values], type=pa.float64())
    return pa.array([None if v is None else (v if isinstance(v, str) else json.dumps(v)) for v in values], type=pa.string())


def rows_to_table(rows: Iterable[dict[str, Any]]) -> pa.Table:
    """An Arrow table of rows that may have different keys and mixed types per key.

    Missing keys become nulls; ints mixed with floats become floats; anything
    mixed with text becomes text.
    """
    rows = list(rows)
    names: dict[str, None] = {}
    for row in rows:
        for key in row:
            names.setdefault(key, None)
    return pa.table({name: _column([row.get(name) for row in rows]) for name in names})


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain-text table: left-aligned columns two spaces apart, a rule under the headers.

    >>> print(format_table(["a", "bb"], [["1", "2"]]))
    a  bb
    -  --
    1  2
    """
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def format_bytes(n: float) -> str:
    """``n`` bytes for people: ``512 B``, ``85.0 KB``, ``1.2 GB`` (powers of 1000)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")
