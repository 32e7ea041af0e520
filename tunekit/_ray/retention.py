"""Ray's checkpoint bookkeeping as tunekit's retention policy reads and trims it.

Part of :mod:`tunekit._ray` (the one place Ray's private names are used; see
its docstring for the list). Private names here: the trial checkpoint
manager's ``_checkpoint_results`` and ``_latest_checkpoint_result``;
``PopulationBasedTraining._trial_state[trial].last_checkpoint`` (the donor
checkpoint an exploit may pick); the ``TuneController`` attribute
``_scheduler_alg``, found from the frame that calls ``Callback.setup`` (no
public API hands a callback the scheduler). Ray Train V2's run snapshot
(``CHECKPOINT_MANAGER_SNAPSHOT_FILENAME``, whose entries name checkpoints by
``checkpoint_dir_name``): a run started again refuses to start when one is gone.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["calling_scheduler", "drop_vanished_checkpoints", "forget_checkpoints", "registered_checkpoints",
           "replace_checkpoint", "scheduler_checkpoints", "set_aside_stale_train_snapshot"]


def registered_checkpoints(trial: Any) -> list[tuple[Any, dict[str, Any]]]:
    """``(tune.Checkpoint, metrics)`` of every checkpoint Ray keeps for ``trial`` (its ``num_to_keep`` applied).
    The metrics are Ray's own dict (not copied: read them, never change them)."""
    manager = trial.run_metadata.checkpoint_manager
    return [(r.checkpoint, r.metrics or {}) for r in manager._checkpoint_results if r.checkpoint is not None]


def forget_checkpoints(trial: Any, paths: set[str]) -> None:
    """Drop the checkpoints at ``paths`` from Ray's bookkeeping of ``trial`` (deleted by tunekit).

    A trial whose latest checkpoint is among them gets the newest one left,
    or none: ``Result.checkpoint`` never names a deleted checkpoint.
    """
    manager = trial.run_metadata.checkpoint_manager
    manager._checkpoint_results = [r for r in manager._checkpoint_results
                                   if r.checkpoint is None or r.checkpoint.path not in paths]
    latest = manager._latest_checkpoint_result
    if latest is not None and latest.checkpoint is not None and latest.checkpoint.path in paths:
        left = [r for r in manager._checkpoint_results if r.checkpoint is not None]
        newest = max(left, key=lambda r: (r.metrics or {}).get("training_iteration") or 0, default=None)
        manager._latest_checkpoint_result = newest
    trial.invalidate_json_state()
    trial.run_metadata.invalidate_cache()


def drop_vanished_checkpoints(trial: Any) -> list[str]:
    """Drop from Ray's bookkeeping of ``trial`` the checkpoints gone from storage; their paths are returned.

    After a killed driver Ray's index is the one in its last experiment state, written every few seconds:
    checkpoints ``num_to_keep`` (or ``KeepCheckpoints``) deleted after it are still named there, and the next
    checkpoint registered makes Ray delete one of them again, which fails (``FileNotFoundError``) and errors
    the trial. The latest checkpoint stays named (the trial is restored from it, or from what stands in for
    it: :func:`tunekit.trial._restoring.prepare_restore`); out of the list Ray deletes from, it is never deleted.
    """
    manager = trial.run_metadata.checkpoint_manager
    named = [r for r in manager._checkpoint_results if r.checkpoint is not None]
    if not named:
        return []
    import pyarrow.fs as pafs

    by_fs: dict[int, tuple[Any, list[Any]]] = {}
    for r in named:
        by_fs.setdefault(id(r.checkpoint.filesystem), (r.checkpoint.filesystem, []))[1].append(r)
    gone = set()
    for fs, results in by_fs.values():
        infos = fs.get_file_info([r.checkpoint.path for r in results])
        gone |= {r.checkpoint.path for r, info in zip(results, infos) if info.type == pafs.FileType.NotFound}
    if gone:
        manager._checkpoint_results = [r for r in manager._checkpoint_results
                                       if r.checkpoint is None or r.checkpoint.path not in gone]
        trial.invalidate_json_state()
        trial.run_metadata.invalidate_cache()
    return sorted(gone)


def replace_checkpoint(trial: Any, old: str, checkpoint: Any, metrics: dict[str, Any]) -> None:
    """In Ray's bookkeeping of ``trial``, the checkpoint registered at path ``old`` becomes ``checkpoint``
    (a ``tune.Checkpoint``, with ``metrics``): ``Result.checkpoint`` names it if ``old`` was the latest."""
    from ray.train._internal.checkpoint_manager import _TrainingResult

    manager = trial.run_metadata.checkpoint_manager
    result = _TrainingResult(checkpoint=checkpoint, metrics=dict(metrics))
    manager._checkpoint_results = [result if r.checkpoint is not None and r.checkpoint.path == old else r
                                   for r in manager._checkpoint_results]
    latest = manager._latest_checkpoint_result
    if latest is not None and latest.checkpoint is not None and latest.checkpoint.path == old:
        manager._latest_checkpoint_result = result
    trial.invalidate_json_state()
    trial.run_metadata.invalidate_cache()


def calling_scheduler(depth: int = 12) -> Any:
    """The trial scheduler of the ``TuneController`` that is setting up its callbacks (None if not found)."""
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return None
        scheduler = getattr(frame.f_locals.get("self"), "_scheduler_alg", None)
        if scheduler is not None:
            return scheduler
        frame = frame.f_back
    return None


def scheduler_checkpoints(scheduler: Any) -> set[str]:
    """Paths of the checkpoints ``scheduler`` may still hand a trial (PBT: each trial's donor checkpoint)."""
    states = getattr(scheduler, "_trial_state", None)
    if not isinstance(states, dict):
        return set()
    out = set()
    for state in states.values():
        # A Checkpoint; a save still in flight (_FutureTrainingResult) becomes its trial's newest checkpoint.
        path = getattr(getattr(state, "last_checkpoint", None), "path", None)
        if isinstance(path, str):
            out.add(path)
    return out


def set_aside_stale_train_snapshot(filesystem: Any, run_dir: str) -> list[str]:
    """Before a Train run in ``run_dir`` starts again: if its snapshot names checkpoints gone from storage,
    move the snapshot aside (``<name>.stale-<time>``) and return their names (else nothing is done).

    Ray Train V2 resumes a run of the same name from its snapshot, and refuses to start when a checkpoint
    named there was deleted (``CheckpointManagerInitializationError``): what ``KeepCheckpoints`` and
    ``tunekit gc`` do to Train checkpoints no Tune checkpoint names. Without the snapshot Train starts a
    new run in the same directory (the checkpoints stay; the trial's workers restore from the one Tune
    hands the trial).
    """
    import json
    import posixpath
    import time

    try:
        from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME as name
    except ImportError:
        name = "checkpoint_manager_snapshot.json"
    path = posixpath.join(run_dir, name)
    try:
        with filesystem.open_input_stream(path) as fh:
            text = fh.read().decode("utf-8", "replace")
    except OSError:  # (FileNotFoundError among them)
        return []
    try:
        named = {v for v in _values_of("checkpoint_dir_name", json.loads(text)) if isinstance(v, str)}
    except ValueError:
        return []  # (not JSON: not Ray's, left alone)
    import pyarrow.fs as pafs

    present = {posixpath.basename(i.path) for i in filesystem.get_file_info(pafs.FileSelector(run_dir))}
    gone = sorted(n for n in named if n not in present)
    if gone:
        filesystem.move(path, f"{path}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
    return gone


def _values_of(key: str, obj: Any) -> list[Any]:
    """Every value of ``key`` in nested JSON."""
    if isinstance(obj, dict):
        return [v for k, v in obj.items() if k == key] + [x for v in obj.values() for x in _values_of(key, v)]
    if isinstance(obj, list):
        return [x for v in obj for x in _values_of(key, v)]
    return []
