"""Experiment results as pandas: all trials, every iteration once, best trial and model, PBT lineage.

Example:
    >>> import tempfile
    >>> load_results(tempfile.mkdtemp())  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    tunekit.errors.ExperimentError: ...: not a Ray Tune experiment directory ...
"""

from __future__ import annotations

import logging
import posixpath
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd

from tunekit._checks import check_mode, check_scope
from tunekit.analysis._lineage import Lineage, build_lineage
from tunekit.analysis._result_frames import ITER as _ITER
from tunekit.analysis._result_frames import dedupe_frame, from_parquet, from_result_json, order_columns, parquet_parts, row_config
from tunekit.checkpoint.loading import load_model
from tunekit.errors import ConfigError, ExperimentError, StorageError
from tunekit._keys import RESTORED_FROM_KEY
from tunekit.experiment.results import exploits_by_trial, format_ranges, rows_lost
from tunekit.storage._files import gc_paused
from tunekit.experiment.snapshot import BestCheckpoint, ExperimentSnapshot, read_experiment
from tunekit.storage._location import Storage, resolve_storage
from tunekit.table import RESULTS_DIR

__all__ = [
    "BestTrial", "Lineage", "best_checkpoint", "best_trial", "load_best_model", "load_results", "pbt_lineage"
]

logger = logging.getLogger(__name__)

Scope = Literal["last", "max", "min", "mean", "avg"]


def load_results(
    location: str | Storage,
    *,
    filesystem: Any = None,
    source: Literal["auto", "parquet", "json"] = "auto",
    warm_start_history: bool = True,
    snapshot: ExperimentSnapshot | None = None,
    _seen: frozenset[str] = frozenset(),
) -> pd.DataFrame:
    """All results of all trials: one row per trial and iteration.

    Reads the Parquet dataset that :class:`tunekit.callbacks.ParquetLogger` wrote
    (fast), or else each trial's ``result.json`` (any Ray Tune experiment).
    Iterations that ran again after a restore are kept once: the row of the
    lineage that went on. Config values are columns ``config/<name>``.

    Args:
        location: The experiment directory (path, URI or Storage).
        filesystem: A pyarrow/fsspec filesystem ``location`` is a path on.
        source: ``"parquet"`` or ``"json"`` to force one; ``"auto"`` prefers Parquet.
        warm_start_history: For a trial warm-started with ``mode="continue"``
            (:func:`tunekit.warm_start`, ``tunekit resume --extend``), also the
            rows of the trial it continued, up to the checkpoint it started
            from, marked with ``inherited_from`` (that trial's id): every
            iteration of its history once.
        snapshot: The experiment as already read (:func:`tunekit.experiment.snapshot.read_experiment`), so
            that nothing is read twice; its structure is read here when not given.

    The damage found while reading (a state file or result lines that could
    not be read; checkpoints that failed verification in a ``snapshot`` a
    reader verified: checkpoints are not hashed here, ``tunekit verify`` does) is in
    ``df.attrs["problems"]``, and each trial's rows Ray lost (gaps that no PBT
    exploit or warm start explains) in ``df.attrs["missing_iterations"]``;
    both also come as a warning.

    Raises:
        ExperimentError: not an experiment, or ``source="parquet"`` and no dataset.
    """
    if source not in ("auto", "parquet", "json"):
        raise ConfigError(f"load_results(source={source!r}): expected 'auto', 'parquet' or 'json'")
    with gc_paused():  # (see gc_paused: what the read parses lives only until it returns)
        experiment = resolve_storage(location, filesystem=filesystem)
        parts = parquet_parts(experiment) if source != "json" else []
        read_problems: list[str] = []
        if parts and snapshot is None:  # the rows read (Arrow, mostly without the GIL) while the structure is parsed
            with ThreadPoolExecutor(max_workers=1) as pool:
                rows = pool.submit(from_parquet, experiment, parts)  # deduplicated and sorted as it is read
                snap = read_experiment(experiment, results=False)
                df: pd.DataFrame | None = rows.result()
        else:
            snap = snapshot if snapshot is not None else read_experiment(experiment, results=False)
            df = from_parquet(experiment, parts) if parts else None
        if df is None and source == "parquet":
            raise ExperimentError(f"{experiment.uri}: no {RESULTS_DIR}/*.parquet (was ParquetLogger used?)")
        if df is None or (df.empty and source == "auto"):  # (a journal alone may hold no row yet)
            df = dedupe_frame(from_result_json(experiment, [t.name for t in snap.trials], read_problems))
        if df.empty:
            return df
        if warm_start_history:
            df = _with_warm_start_history(df, experiment, _seen=_seen)
        df = order_columns(df)
        if _ITER in df.columns:
            gaps = _gaps(df, snap)
            if gaps:
                df.attrs["missing_iterations"] = gaps
                warnings.warn(
                    f"{experiment.uri}: {len(gaps)} trial(s) lack result rows "
                    f"({'; '.join(f'{t}: iterations {format_ranges(m)}' for t, m in sorted(gaps.items())[:5])}); "
                    "Ray's result.json lost them (add tunekit.callbacks.ParquetLogger to keep every row)",
                    stacklevel=2,
                )
    problems = list(snap.problems) + [p for p in read_problems if p not in snap.problems]
    if problems:
        df.attrs["problems"] = problems
        warnings.warn(f"{experiment.uri} is damaged: {'; '.join(problems)}", stacklevel=2)
    return df


_WARM = "config/tunekit_warm_start/"


def _gaps(df: pd.DataFrame, snap: ExperimentSnapshot) -> dict[str, list[int]]:
    """Each trial's rows Ray lost (:func:`tunekit.experiment.results.lost_iterations`), for the trials whose
    deduplicated, sorted iterations are not ``1..n`` (found in one vectorised pass: the rest have none)."""
    iterations = pd.to_numeric(df[_ITER], errors="coerce")
    grouped = iterations.groupby(df["trial_id"], sort=True)
    first, last, count = grouped.first(), grouped.last(), grouped.size()
    suspects = count.index[(first != 1) | (last - first + 1 != count)]
    if not len(suspects):
        return {}
    continued = {t.trial_id for t in snap.trials if t.continued}
    clones = exploits_by_trial(snap.exploits)
    names = {t.trial_id: t.name for t in snap.trials}
    mask = df["trial_id"].isin(suspects).to_numpy()
    part = pd.DataFrame({"trial_id": df["trial_id"].to_numpy()[mask], "it": iterations.to_numpy()[mask],
                         "origin": df[RESTORED_FROM_KEY].to_numpy()[mask] if RESTORED_FROM_KEY in df else None})
    gaps = {}
    for trial, rows in part.groupby("trial_id", sort=True):
        trial = str(trial)
        its = rows["it"].tolist()  # exploits its rows record themselves, where the trial is one of the snapshot's
        origins = rows["origin"].tolist() if trial in names else [None] * len(its)
        if missing := rows_lost(its, origins, own=names.get(trial, ""), exploits=clones.get(trial, []),
                                continued=trial in continued):
            gaps[trial] = missing
    return gaps


def _with_warm_start_history(df: pd.DataFrame, experiment: Storage, *, _seen: frozenset[str]) -> pd.DataFrame:
    """Prepend, for each trial that continued another one's checkpoint, that trial's rows up to it."""
    if df.empty or _ITER not in df.columns or _WARM + "checkpoint" not in df.columns:
        return df
    firsts = df.groupby("trial_id", sort=False).first()
    sources: dict[str, pd.DataFrame] = {}
    inherited = []
    for trial_id, row in firsts.iterrows():
        uri, mode = row.get(_WARM + "checkpoint"), row.get(_WARM + "mode")
        if not isinstance(uri, str) or mode != "continue":
            continue
        base, sep, query = uri.partition("?")  # a URI's storage options stay with it
        trial_dir = posixpath.dirname(base.rstrip("/"))
        source_exp = posixpath.dirname(trial_dir) + sep + query
        if source_exp in _seen or source_exp == experiment.uri:
            continue  # a cycle or the same experiment: nothing to add
        if source_exp not in sources:
            try:
                sources[source_exp] = load_results(source_exp, _seen=_seen | {experiment.uri})
            except (ExperimentError, StorageError, OSError) as exc:
                logger.warning("%s: trial %s started from %s, whose results cannot be read (%s)",
                               experiment.uri, trial_id, uri, exc)
                sources[source_exp] = pd.DataFrame()
        src = sources[source_exp]
        if src.empty:
            continue
        name = posixpath.basename(trial_dir)
        ids = [t for t in src["trial_id"].unique() if f"_{t}_" in f"_{name}_"]
        own = df[df["trial_id"] == trial_id][_ITER]
        start = pd.to_numeric(own, errors="coerce").min() - 1
        rows = src[src["trial_id"].isin(ids[:1]) & (pd.to_numeric(src[_ITER], errors="coerce") <= start)].copy()
        if rows.empty:
            continue
        # The trial it continued, or, for rows that trial inherited itself, the one they came from.
        prior = rows["inherited_from"] if "inherited_from" in rows.columns else pd.Series(None, index=rows.index,
                                                                                              dtype=object)
        rows["inherited_from"] = prior.fillna(rows["trial_id"])
        rows["trial_id"] = trial_id
        inherited.append(rows)
    if not inherited:
        return df
    return pd.concat([*inherited, df], ignore_index=True).sort_values(
        ["trial_id", _ITER], kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class BestTrial:
    """The best trial for a metric, and its best checkpoint."""

    trial_id: str
    metric: str
    value: float
    config: dict[str, Any]
    checkpoint: str | None


def _trial_scores(df: pd.DataFrame, metric: str, scope: str) -> pd.Series:
    values = pd.to_numeric(df[metric], errors="coerce")
    grouped = values.groupby(df["trial_id"])
    if scope == "last":
        return grouped.agg(lambda s: s.dropna().iloc[-1] if s.notna().any() else float("nan")).dropna()
    return getattr(grouped, scope)().dropna()


def _check_metric(df: pd.DataFrame, metric: str, call: str) -> None:
    if metric not in df.columns:
        known = sorted(c for c in df.columns if not c.startswith("config/") and pd.api.types.is_numeric_dtype(df[c]))
        shown = ", ".join(known[:15]) + (", ..." if len(known) > 15 else "")
        raise ConfigError(f"{call}: no trial reported metric {metric!r}; the trials reported: {shown}")


def _warn_skipped(best: BestCheckpoint) -> None:
    for line in best.skipped:
        warnings.warn(f"best checkpoint: passed over {line}", stacklevel=3)


def best_trial(
    location: str | Storage,
    *,
    metric: str,
    mode: Literal["max", "min"],
    scope: Scope = "last",
    results: pd.DataFrame | None = None,
    snapshot: ExperimentSnapshot | None = None,
) -> BestTrial:
    """The best trial by ``metric`` over its ``scope`` (last/max/min/mean), with its best checkpoint.

    Trials are ranked on every row :func:`load_results` has (the Parquet
    dataset when there is one). The checkpoint is the trial's best checkpoint
    by ``metric`` *that verifies* (its newest good one if none records it);
    one that does not verify is passed over with a warning
    (:meth:`tunekit.experiment.snapshot.ExperimentSnapshot.best_checkpoint_of`).
    """
    check_mode("best_trial", mode)
    scope = check_scope("best_trial", scope)  # type: ignore[assignment]
    experiment = resolve_storage(location)
    snap = snapshot or read_experiment(experiment)
    df = results if results is not None else load_results(experiment, snapshot=snap)
    if df.empty:
        raise ExperimentError(f"{experiment.uri}: no results yet")
    _check_metric(df, metric, "best_trial")
    scores = _trial_scores(df, metric, scope)
    if scores.empty:
        raise ExperimentError(f"{experiment.uri}: no trial reported {metric!r}")
    trial_id = str(scores.idxmax() if mode == "max" else scores.idxmin())
    rows = df[df["trial_id"] == trial_id]
    config = row_config(rows.iloc[-1])
    trial = next((t for t in snap.trials if t.trial_id == trial_id or t.name == trial_id), None)
    uri = None
    if trial is not None:
        best = snap.best_checkpoint_of(trial, metric, mode)
        _warn_skipped(best)
        uri = best.uri
    return BestTrial(trial_id, metric, float(scores[trial_id]), config, uri)


def best_checkpoint(
    location: str | Storage,
    *,
    metric: str,
    mode: Literal["max", "min"],
    scope: Scope | None = None,
) -> str:
    """The URI (or path) of the best checkpoint for ``metric`` that verifies.

    By default the best checkpoint across all trials (the one on storage with
    the best recorded ``metric``; see
    :meth:`tunekit.experiment.snapshot.ExperimentSnapshot.best_checkpoint`), which is
    what ``tunekit quickstart``, ``tunekit status --metric --mode`` and
    ``tunekit report`` name. With a ``scope``, the best trial by that scope
    (see :func:`best_trial`) and then that trial's best checkpoint. A
    checkpoint that does not verify is never returned: the next best good one
    is, with a warning naming what was passed over.
    """
    check_mode("best_checkpoint", mode)
    experiment = resolve_storage(location)
    if scope is not None:
        trial = best_trial(experiment, metric=metric, mode=mode, scope=scope)
        trial_id, uri = trial.trial_id, trial.checkpoint
    else:
        snap = read_experiment(experiment)
        snap.check_metric("best_checkpoint", metric)
        best = snap.best_checkpoint(metric, mode)
        if best is None:
            raise ExperimentError(f"{experiment.uri}: no trial reported {metric!r}")
        _warn_skipped(best)
        trial_id, uri = best.trial_id, best.uri
    if uri is None:
        raise ExperimentError(f"best trial {trial_id} has no checkpoint that verifies")
    return uri


def load_best_model(
    location: str | Storage,
    model: Any,
    *,
    metric: str,
    mode: Literal["max", "min"],
    scope: Scope | None = None,
    name: str | None = None,
) -> Any:
    """Load the best good checkpoint's weights into ``model`` (eval mode), ready for inference.

    Args:
        location: The experiment directory.
        model: A ``torch.nn.Module`` of the trained architecture.
        metric, mode, scope: How "best" is decided (see :func:`best_checkpoint`).
        name: Which model of the checkpoint's state (default: the first).
    """
    return load_model(best_checkpoint(location, metric=metric, mode=mode, scope=scope), model, name=name)


def pbt_lineage(
    location: str | Storage,
    *,
    results: pd.DataFrame | None = None,
    snapshot: ExperimentSnapshot | None = None,
) -> Lineage:
    """Every PBT exploit (from Ray's ``pbt_global.txt``) and each trial's ancestry.

    Columns of ``exploits``: ``iteration`` (the target's, when it exploited),
    ``target``, ``source``, ``source_iteration`` (of the checkpoint it took),
    ``old_config`` (the target's, before), ``new_config``, ``undone`` (the
    target's restore fell back to its own checkpoint, the donor's being gone:
    its weights stayed its own, its new config stands). ``ancestry[trial]`` lists ``(trial_id, first_iteration, last_iteration)``
    segments, oldest first.
    """
    experiment = resolve_storage(location)
    snap = snapshot or read_experiment(experiment)
    df = results if results is not None else load_results(experiment, snapshot=snap)
    return build_lineage(experiment, snap, df)
