"""Experiment results as pandas: all trials, every iteration once, best trial and model, PBT lineage.

Example:
    >>> import tempfile
    >>> load_results(tempfile.mkdtemp())  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    tunekit.errors.ExperimentError: ...: not a Ray Tune experiment directory ...
"""

from __future__ import annotations

import io
import logging
import math
import posixpath
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from tunekit._checks import check_mode, check_scope
from tunekit.checkpoint import load_model
from tunekit.errors import ConfigError, ExperimentError, StorageError
from tunekit.results import format_ranges, lost_iterations, parse_result_lines, read_text
from tunekit.snapshot import BestCheckpoint, ExperimentSnapshot, read_experiment
from tunekit.storage import Storage, resolve_storage, storage_errors
from tunekit.table import RESULTS_DIR, flatten_result, is_number

__all__ = [
    "BestTrial",
    "Lineage",
    "best_checkpoint",
    "best_trial",
    "load_best_model",
    "load_results",
    "pbt_lineage",
]

logger = logging.getLogger(__name__)

Scope = Literal["last", "max", "min", "mean", "avg"]
_ITER = "training_iteration"


def _order_columns(df: pd.DataFrame) -> pd.DataFrame:
    first = [c for c in ("trial_id", _ITER) if c in df.columns]
    config = sorted(c for c in df.columns if c.startswith("config/"))
    rest = [c for c in df.columns if c not in first and c not in config]
    return df[first + rest + config]


def _dedupe_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Keep, per trial, the rows no later row supersedes (a later row with iteration <= it).

    Rows come in the order they were logged; the result is sorted by trial and iteration.
    """
    if df.empty or _ITER not in df.columns:
        return df.reset_index(drop=True)
    df = df.reset_index(drop=True)
    trials = df["trial_id"].to_numpy()
    iters = pd.to_numeric(df[_ITER], errors="coerce")
    steps = iters.groupby(trials, sort=False).diff()
    if (steps <= 0).any():  # some trial went back: a restore re-ran iterations
        rev_iters = iters.iloc[::-1]
        later_min = rev_iters.groupby(trials[::-1], sort=False).cummin()
        exclusive = later_min.groupby(trials[::-1], sort=False).shift(1)
        keep = (exclusive.isna() | (rev_iters < exclusive)).to_numpy()[::-1]
        df = df[keep]
    return df.sort_values(["trial_id", _ITER], kind="stable").reset_index(drop=True)


def _parquet_parts(experiment: Storage) -> list[str]:
    directory = posixpath.join(experiment.path, RESULTS_DIR)
    with storage_errors("list", f"{experiment.uri}/{RESULTS_DIR}"):
        infos = experiment.filesystem.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    return sorted(
        i.path for i in infos
        if i.type == pafs.FileType.File and i.base_name.endswith(".parquet") and not i.base_name.startswith(".")
    )


def _from_parquet(experiment: Storage, parts: list[str]) -> pd.DataFrame:
    fs = experiment.filesystem
    with ThreadPoolExecutor(max_workers=8) as pool:
        schemas = list(pool.map(lambda path: pq.read_schema(path, filesystem=fs), parts))
    schema = schemas[0]
    if any(not other.equals(schema) for other in schemas[1:]):  # trials with other keys
        try:
            schema = pa.unify_schemas(schemas, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # a key changed type between batches
            tables = [pq.read_table(path, filesystem=fs) for path in parts]
            return pd.concat([t.to_pandas() for t in tables], ignore_index=True, sort=False)
    dataset = pads.dataset(parts, schema=schema, format="parquet", filesystem=fs)
    return dataset.to_table().to_pandas()


def _read_files(fs: pafs.FileSystem, paths: list[str]) -> list[bytes]:
    def read(path: str) -> bytes:
        try:
            with fs.open_input_stream(path) as stream:
                return stream.read()
        except FileNotFoundError:
            return b""

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(read, paths))


def _from_result_json(experiment: Storage, names: list[str], problems: list[str]) -> pd.DataFrame:
    """Every trial's ``result.json`` (``names``: the trial directories), damaged lines counted into ``problems``."""
    fs = experiment.filesystem
    blobs = _read_files(fs, [posixpath.join(experiment.join(name).path, "result.json") for name in names])
    try:  # fast: one C++ JSON parse over every trial's lines
        data = b"\n".join(b for b in (blob.strip() for blob in blobs) if b)
        if not data:
            return pd.DataFrame()
        table = pajson.read_json(io.BytesIO(data), read_options=pajson.ReadOptions(block_size=1 << 24))
        while any(pa.types.is_struct(f.type) for f in table.schema):
            table = table.flatten()
        df = table.to_pandas()
        df.columns = [c.replace(".", "/") for c in df.columns]
        if "trial_id" not in df.columns:
            raise ValueError("rows without trial_id")
        return df
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError):  # torn lines, type changes: row by row
        rows: list[dict[str, Any]] = []
        for name, blob in zip(names, blobs):
            parsed, bad = parse_result_lines(blob.decode("utf-8", errors="replace"))
            if bad:
                problems.append(f"{name}/result.json: {bad} damaged line(s) skipped")
            for row in parsed:
                flat = flatten_result(row)
                flat.setdefault("trial_id", name)
                rows.append(flat)
        return pd.DataFrame.from_records(rows)


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
        snapshot: The experiment as already read (:func:`tunekit.snapshot.read_experiment`), so
            that nothing is read twice; its structure is read here when not given.

    The damage found while reading (a state file or result lines that could
    not be read, checkpoints that failed verification) is in
    ``df.attrs["problems"]``, and each trial's rows Ray lost (gaps that no PBT
    exploit or warm start explains) in ``df.attrs["missing_iterations"]``;
    both also come as a warning.

    Raises:
        ExperimentError: not an experiment, or ``source="parquet"`` and no dataset.
    """
    if source not in ("auto", "parquet", "json"):
        raise ConfigError(f"load_results(source={source!r}): expected 'auto', 'parquet' or 'json'")
    experiment = resolve_storage(location, filesystem=filesystem)
    snap = snapshot if snapshot is not None else read_experiment(experiment, results=False)
    parts = _parquet_parts(experiment) if source != "json" else []
    read_problems: list[str] = []
    if parts:
        df = _from_parquet(experiment, parts)
    elif source == "parquet":
        raise ExperimentError(f"{experiment.uri}: no {RESULTS_DIR}/*.parquet (was ParquetLogger used?)")
    else:
        df = _from_result_json(experiment, [t.name for t in snap.trials], read_problems)
    if df.empty:
        return df
    df = _dedupe_frame(df)
    if warm_start_history:
        df = _with_warm_start_history(df, experiment, _seen=_seen)
    df = _order_columns(df)
    if _ITER in df.columns:
        continued = {t.trial_id for t in snap.trials if t.continued}
        gaps = {
            str(trial): missing
            for trial, iterations in df.groupby("trial_id", sort=True)[_ITER]
            if (missing := lost_iterations(
                iterations.tolist(),
                clones=[(e.iteration, e.source_iteration) for e in snap.exploits if e.target == str(trial)],
                continued=str(trial) in continued))
        }
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
    (:meth:`tunekit.snapshot.ExperimentSnapshot.best_checkpoint_of`).
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
    config = {
        c[len("config/"):]: (v.item() if hasattr(v, "item") else v)
        for c, v in rows.iloc[-1].items()
        if c.startswith("config/") and pd.notna(v)
    }
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
    :meth:`tunekit.snapshot.ExperimentSnapshot.best_checkpoint`), which is
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


_Logged = list[tuple[int, dict[str, Any]]]


def _logged_rows(experiment: Storage, snap: ExperimentSnapshot) -> dict[str, _Logged]:
    """Each trial's (iteration, config) in the order reported, re-runs included.

    From the Parquet dataset when there is one (it has every row), else from
    each trial's ``result.json`` (which may lack rows Ray lost).
    """
    out: dict[str, _Logged] = {}
    parts = _parquet_parts(experiment)
    if parts:
        dataset = pads.dataset(parts, format="parquet", filesystem=experiment.filesystem)
        columns = ["trial_id", _ITER] + [c for c in dataset.schema.names if c.startswith("config/")]
        table = dataset.to_table(columns=columns).to_pylist()
        for row in table:
            if is_number(row.get(_ITER)):
                config = {c[len("config/"):]: v for c, v in row.items() if c.startswith("config/")}
                out.setdefault(str(row["trial_id"]), []).append((int(row[_ITER]), config))
        return out
    for trial in snap.trials:
        text = read_text(experiment.filesystem, posixpath.join(experiment.join(trial.name).path, "result.json"))
        rows, _ = parse_result_lines(text or "")
        out[trial.trial_id] = [
            (int(r[_ITER]), r.get("config") if isinstance(r.get("config"), dict) else {})
            for r in rows if is_number(r.get(_ITER))
        ]
    return out


def _has(config: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return bool(wanted) and all(
        k in config and (config[k] == v or (is_number(config[k]) and is_number(v) and math.isclose(config[k], v)))
        for k, v in wanted.items()
    )


def _fix_exploit_iterations(experiment: Storage, snap: ExperimentSnapshot, records: list[dict[str, Any]]) -> None:
    """Place each exploit where the target's own rows show it happened.

    Ray logs iterations as of its decision, which with ``synch=True`` can lag
    both the checkpoint actually cloned and the target's own iteration. The
    target's rows are the truth: the first row after the exploit carries the
    new config, and continues from the cloned checkpoint (iteration k+1 after
    a checkpoint of iteration k). Where the config did not visibly change,
    the row after the logged iteration is used; where the rows around an
    exploit are missing, Ray's logged values stay.
    """
    if not records:
        return
    logged = _logged_rows(experiment, snap)
    position: dict[str, int] = {}
    for record in records:
        rows = logged.get(record["target"], [])
        start = max(position.get(record["target"], 0), 1)
        keys = {k for _, cfg in rows for k in cfg}
        wanted = {k: v for k, v in (record["new_config"] or {}).items()
                  if k in keys and (is_number(v) or isinstance(v, (str, bool)))}
        hit = next(
            (j for j in range(start, len(rows)) if _has(rows[j][1], wanted) and not _has(rows[j - 1][1], wanted)),
            None,
        )
        if hit is None:  # no visible config change: the row after the logged iteration
            hit = next((j for j in range(start, len(rows)) if rows[j - 1][0] == record["iteration"]), None)
        if hit is None:
            continue
        record["iteration"] = rows[hit - 1][0]
        record["source_iteration"] = rows[hit][0] - 1
        position[record["target"]] = hit + 1


@dataclass
class Lineage:
    """PBT history: every exploit, and where each trial's weights came from."""

    exploits: pd.DataFrame
    ancestry: dict[str, list[tuple[str, int, int]]]

    def describe(self, trial_id: str) -> str:
        """``a[1-4] -> b[5-8]``: whose iterations a trial's final weights went through."""
        return " -> ".join(f"{t}[{a}-{b}]" for t, a, b in self.ancestry.get(trial_id, []))


def pbt_lineage(
    location: str | Storage,
    *,
    results: pd.DataFrame | None = None,
    snapshot: ExperimentSnapshot | None = None,
) -> Lineage:
    """Every PBT exploit (from Ray's ``pbt_global.txt``) and each trial's ancestry.

    Columns of ``exploits``: ``iteration`` (the target's, when it exploited),
    ``target``, ``source``, ``source_iteration`` (of the checkpoint it took),
    ``old_config`` (the target's, before), ``new_config``.
    ``ancestry[trial]`` lists ``(trial_id, first_iteration, last_iteration)``
    segments, oldest first.
    """
    experiment = resolve_storage(location)
    snap = snapshot or read_experiment(experiment)
    df = results if results is not None else load_results(experiment, snapshot=snap)
    current: dict[str, dict[str, Any]] = {}
    for trial in snap.trials:
        rows = df[df["trial_id"] == trial.trial_id] if not df.empty else df
        if len(rows):
            first = rows.iloc[0]
            current[trial.trial_id] = {
                c[len("config/"):]: first[c] for c in rows.columns if c.startswith("config/") and pd.notna(first[c])
            }
        else:
            current[trial.trial_id] = dict(trial.config)
    records = []
    for exploit in snap.exploits:
        old = dict(current.get(exploit.target, {}))
        current[exploit.target] = {**old, **exploit.new_config}
        records.append(
            {
                "iteration": exploit.iteration,
                "target": exploit.target,
                "source": exploit.source,
                "source_iteration": exploit.source_iteration,
                "old_config": old,
                "new_config": exploit.new_config,
            }
        )
    _fix_exploit_iterations(experiment, snap, records)
    exploits = pd.DataFrame.from_records(
        records, columns=["iteration", "target", "source", "source_iteration", "old_config", "new_config"]
    )
    final = {t.trial_id: t.iterations for t in snap.trials}

    def chain(trial: str, upto: int, before: int) -> list[tuple[str, int, int]]:
        for k in range(before - 1, -1, -1):
            record = records[k]
            if record["target"] == trial and record["source_iteration"] <= upto:
                start = record["source_iteration"] + 1
                own = [(trial, start, upto)] if start <= upto else []
                return chain(record["source"], record["source_iteration"], k) + own
        return [(trial, 1, upto)] if upto >= 1 else []

    ancestry = {t: chain(t, n, len(records)) for t, n in final.items()}
    return Lineage(exploits, ancestry)
