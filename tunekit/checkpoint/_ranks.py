"""Multi-worker checkpoints on storage: one directory, each rank's part beside the replicated state.

Implementation tier, no torch and no Ray (the readers use it). A checkpoint written by ``N`` Ray Train
workers (:mod:`tunekit.multiworker`) holds, in one directory::

    state.pt, tunekit.json, manifest.json   the replicated state (written once, by rank 0)
    ranks.json                              {"world_size": N, "sharded": ...}: listed in that manifest
    rank-0/ ... rank-<N-1>/                 each rank's own part, a tunekit checkpoint of its own:
                                            its RNG streams and data position (state.pt) and, for
                                            sharded state, its torch.distributed.checkpoint shard
                                            (``__<r>_0.distcp``; rank 0 also holds ``.metadata``)

It is complete only when the replicated part and every rank's part verify: a missing or damaged rank
makes the whole checkpoint damaged (:func:`rank_problems`, called by ``verify_directory``).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow.fs as pafs

__all__ = ["RANKS_FILE", "rank_dir", "rank_problems", "ranks_bytes", "read_ranks"]

#: The file that makes a checkpoint a multi-worker one (listed in the replicated part's manifest).
RANKS_FILE = "ranks.json"


def rank_dir(rank: int) -> str:
    """The directory of rank ``rank``'s part: ``rank-<rank>``."""
    return f"rank-{rank}"


def ranks_bytes(world_size: int, *, sharded: bool) -> bytes:
    """The content of :data:`RANKS_FILE` for a checkpoint of ``world_size`` workers."""
    return json.dumps({"world_size": int(world_size), "sharded": bool(sharded)}, sort_keys=True).encode()


def read_ranks(fs: pafs.FileSystem, path: str) -> dict[str, Any]:
    """The parsed :data:`RANKS_FILE` of the checkpoint at ``path`` (ValueError: missing or malformed)."""
    try:
        with fs.open_input_stream(posixpath.join(path, RANKS_FILE)) as stream:
            layout = json.loads(stream.read())
    except FileNotFoundError:
        raise ValueError(f"no {RANKS_FILE}") from None
    if not isinstance(layout, dict) or not isinstance(layout.get("world_size"), int) or layout["world_size"] < 1:
        raise ValueError(f"{RANKS_FILE}: expected {{'world_size': N >= 1, 'sharded': bool}}")
    return layout


def rank_problems(fs: pafs.FileSystem, path: str, shown: str, verify: Callable[..., Any],
                  ranks: Iterable[int] | None = None) -> tuple[bool, list[str]]:
    """Verify every rank's part (or those in ``ranks``): ``(any part incomplete, problems)``, each problem
    naming its rank (``rank-1/: missing (the checkpoint was written by 2 workers)``)."""
    try:
        world = read_ranks(fs, path)["world_size"]
    except (ValueError, OSError) as exc:
        return False, [str(exc)]
    chosen = range(world) if ranks is None else [r for r in ranks if 0 <= r < world]
    incomplete, problems = False, []
    for rank in chosen:
        name = rank_dir(rank)
        report = verify(fs, posixpath.join(path, name), posixpath.join(shown, name))
        if report.ok:
            continue
        incomplete = incomplete or report.status == "incomplete"
        what = "; ".join(report.problems) if report.problems else report.status
        if what.startswith("directory is missing"):
            what = f"missing (the checkpoint was written by {world} workers)"
        problems.append(f"{name}/: {what}")
    return incomplete, problems
