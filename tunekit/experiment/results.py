"""Read a trial's ``result.json`` (one JSON object per line) safely, deduplicated.

A trial restored from a checkpoint runs the iterations after it again, so its
``result.json`` holds them twice. :func:`dedupe_lineage` keeps the lineage that
went on: when an iteration number repeats, the rows it supersedes are dropped.

Example:
    >>> rows = [{"training_iteration": i} for i in (1, 2, 3, 2, 3, 4)]
    >>> [r["training_iteration"] for r in dedupe_lineage(rows)]
    [1, 2, 3, 4]
"""

from __future__ import annotations

import posixpath
from typing import Any

from tunekit.storage._files import loads, read_text

__all__ = [
    "dedupe_lineage", "exploits_by_trial", "format_ranges", "lost_iterations", "missing_iterations",
    "parse_result_lines", "restore_clones", "result_file_problems", "rows_lost"
]

def parse_result_lines(text: str) -> tuple[list[dict[str, Any]], int]:
    """Rows of a ``result.json``; a torn or damaged line is skipped and counted.

    Returns:
        The rows, and how many lines could not be read.
    """
    rows, bad = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            row = loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


def dedupe_lineage(rows: list[dict[str, Any]], key: str = "training_iteration") -> list[dict[str, Any]]:
    """Keep each iteration once: the row of the lineage that went on."""
    kept: list[dict[str, Any]] = []
    for row in rows:
        it = row.get(key)
        if isinstance(it, (int, float)):
            while kept and isinstance(kept[-1].get(key), (int, float)) and kept[-1][key] >= it:
                kept.pop()
        kept.append(row)
    return kept


def missing_iterations(iterations: Any) -> list[int]:
    """Iterations in 1..max that have no row: rows Ray's ``result.json`` lost.

    Ray's JSON logger can restart a resumed trial's ``result.json`` from a copy
    on storage that lacks rows the driver had not yet synced, and the next
    sync replaces the complete file with it. ``ParquetLogger`` keeps them.

    >>> missing_iterations([3, 4, 6])
    [1, 2, 5]
    """
    seen = {int(i) for i in iterations if isinstance(i, (int, float)) and i == i}
    return [i for i in range(1, max(seen, default=0) + 1) if i not in seen]


def lost_iterations(
    iterations: Any,
    *,
    clones: Any = (),
    continued: bool = False,
) -> list[int]:
    """Iterations a trial ran whose rows are missing: gaps its lineage does not explain.

    A trial's rows skip iterations it never ran: after a PBT exploit it goes
    on from the donor's checkpoint (iteration ``s``, so its next row is
    ``s + 1``), and a warm start that continues a checkpoint (``continued``,
    as ``tunekit resume --extend`` does) starts after it. Each exploit of the
    trial in ``clones``, ``(its iteration t, the donor checkpoint's iteration s)``,
    explains the iterations ``t+1..s`` it jumped over, where its rows go on at
    ``s + 1`` or later; its own rows up to ``t`` are still owed. Ray records ``t``
    before it counts the result that made the exploit, so the row just before the
    jump may be ``t + 1`` (that result's own). An exploit whose
    ``t`` is not known (``None``: one only the rows record, :func:`restore_clones`)
    explains a whole gap that ends at ``s + 1``. What nothing explains is lost.

    >>> lost_iterations([1, 2, 3, 7, 8], clones=[(3, 6)])
    []
    >>> lost_iterations([1, 2, 7, 8], clones=[(3, 6)])
    [3]
    >>> lost_iterations([1, 2, 7, 8], clones=[(1, 6)])  # (the exploit made at result 2, recorded at 1)
    []
    >>> lost_iterations([1, 7, 8], clones=[(1, 6)])
    []
    >>> lost_iterations([1, 2, 3, 7, 8], clones=[(1, 6)])  # (3 came after it: not the exploit's result)
    [4, 5, 6]
    >>> lost_iterations([1, 2, 5], clones=[(4, 4)])  # (synchronous PBT: the donor at the trial's iteration)
    [3, 4]
    >>> lost_iterations([1, 2, 7, 8], clones=[(None, 6)])
    []
    >>> lost_iterations([1, 2, 3, 7, 8])
    [4, 5, 6]
    >>> lost_iterations([13, 14], continued=True)
    []
    """
    ordered = sorted({int(i) for i in iterations if isinstance(i, (int, float)) and i == i})
    known = [(int(t), int(s)) for t, s in clones if t is not None]
    unknown = [int(s) for t, s in clones if t is None]
    lost: list[int] = []
    previous = 0
    for k, it in enumerate(ordered):
        if it > previous + 1 and not (k == 0 and continued):
            gap = set(range(previous + 1, it))
            here = [(t, s) for t, s in known if previous - 1 <= t < it and s + 1 <= it]
            for t, s in here:
                known.remove((t, s))
                gap -= set(range(t + 1, s + 1))
            if not here and it - 1 in unknown:
                unknown.remove(it - 1)
                gap = set()
            lost.extend(sorted(gap))
        previous = it
    return lost


def restore_clones(rows: Any, own: str) -> list[tuple[None, int]]:
    """The exploits a trial's rows record themselves: ``(None, iteration - 1)`` for each row
    ``(iteration, restored_from)`` whose checkpoint was another trial's (tunekit's trainables report
    :data:`~tunekit._keys.RESTORED_FROM_KEY`); the trial's own iteration at the exploit is not in its rows (None). They
    explain jumps as :func:`lost_iterations`' ``clones`` do, where Ray's ``pbt_global.txt`` may lack the line
    of an exploit (a driver or worker killed around it).

    >>> restore_clones([(5, "t_b"), (3, "t_a"), (9, None)], own="t_a")
    [(None, 4)]
    """
    out = []
    for iteration, origin in rows:
        if isinstance(origin, str) and origin and origin != own and isinstance(iteration, (int, float)) \
                and iteration == iteration:
            out.append((None, int(iteration) - 1))
    return out


def exploits_by_trial(exploits: Any) -> dict[str, list[tuple[int, int]]]:
    """The experiment's exploits (each with ``target``, ``iteration``, ``source_iteration``, as
    :func:`tunekit.schedule.pbt.read_exploits` gives them) grouped by the trial that went on from a donor:
    ``(its iteration, the donor checkpoint's iteration)``, :func:`lost_iterations`' ``clones``."""
    grouped: dict[str, list[tuple[int, int]]] = {}
    for e in exploits:
        grouped.setdefault(e.target, []).append((e.iteration, e.source_iteration))
    return grouped


def rows_lost(iterations: list[Any], restored_from: list[Any], *, own: str, exploits: list[tuple[int, int]],
              continued: bool) -> list[int]:
    """One trial's lost rows (:func:`lost_iterations`): the jumps in its ``iterations`` that neither the
    experiment's record of its exploits (``exploits``, from :func:`exploits_by_trial`) nor the restores its
    rows record (``restored_from`` beside each iteration: :func:`restore_clones`) explain.

    >>> rows_lost([1, 2, 5, 9], [None, None, "t_b", None], own="t_a", exploits=[], continued=False)
    [6, 7, 8]
    """
    if iterations == list(range(1, len(iterations) + 1)):  # (every row from the first on: none lost)
        return []
    clones = [*exploits, *restore_clones(zip(iterations, restored_from), own)]
    return lost_iterations(iterations, clones=clones, continued=continued)


def format_ranges(numbers: list[int]) -> str:
    """Sorted integers as ranges.

    >>> format_ranges([1, 2, 3, 7])
    '1-3, 7'
    """
    runs: list[list[int]] = []
    for n in numbers:
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def result_file_problems(experiment: Any, trials: list[Any]) -> list[str]:
    """Damaged lines in the trials' ``result.json`` files (``experiment``: a :class:`~tunekit.storage.Storage`),
    one line per file (what ``status`` calls damage)."""
    out = []
    for trial in trials:
        text = read_text(experiment.filesystem, posixpath.join(trial.location.path, "result.json")) or ""
        _, bad = parse_result_lines(text)
        if bad:
            out.append(f"{trial.name}/result.json: {bad} damaged line(s)")
    return out
