"""Result rows as pandas: the Parquet dataset or every trial's ``result.json``, deduplicated after restores.

Implementation tier of :mod:`tunekit.analysis._load` (``load_results``) and of the
PBT lineage (:mod:`tunekit.analysis._lineage`).
"""

from __future__ import annotations

import io
import posixpath
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from tunekit.experiment.results import parse_result_lines
from tunekit.storage._files import read_bytes, read_text
from tunekit.storage._location import Storage, storage_errors
from tunekit.table import JOURNAL, RESULTS_DIR, flatten_result, rows_to_table

__all__ = ["ITER", "by_trial", "dedupe_frame", "dedupe_order", "dedupe_table", "from_parquet", "from_result_json", "is_journal",
           "journal_table", "order_columns", "parquet_parts", "parts_table", "row_config"]

#: The iteration column.
ITER = "training_iteration"


def row_config(row: pd.Series) -> dict[str, Any]:
    """The ``config/`` columns of one result row as plain Python values, missing ones left out (a list
    value, ``config/layers = [64, 64]``, is a value: only a scalar can be missing)."""
    config = {}
    for column, value in row.items():
        if not str(column).startswith("config/") or (pd.api.types.is_scalar(value) and pd.isna(value)):
            continue
        if hasattr(value, "tolist"):  # a numpy scalar or array
            value = value.tolist()
        config[str(column)[len("config/"):]] = value
    return config


def _column_order(columns: list[str]) -> list[str]:
    first = [c for c in ("trial_id", ITER) if c in columns]
    config = sorted(c for c in columns if c.startswith("config/"))
    return first + [c for c in columns if c not in first and not c.startswith("config/")] + config


def order_columns(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``trial_id`` and the iteration first and the config columns last (sorted); ``df`` itself when
    they are in that order already (a table read from Parquet is ordered before it becomes pandas)."""
    order = _column_order([str(c) for c in df.columns])
    return df if order == list(df.columns) else df[order]


def _trial_codes(trials: Any) -> np.ndarray:
    """Each row's trial as an integer ranking the trials' ids in sorted order (a missing id sorts last)."""
    if isinstance(trials, (pa.Array, pa.ChunkedArray)):
        encoded = pc.dictionary_encode(trials.combine_chunks() if isinstance(trials, pa.ChunkedArray) else trials)
        rank = np.empty(len(encoded.dictionary), dtype=np.int64)
        rank[pc.array_sort_indices(encoded.dictionary).to_numpy()] = np.arange(len(rank))
        indices = encoded.indices.fill_null(len(rank)).to_numpy(zero_copy_only=False).astype(np.int64)
        return np.append(rank, len(rank))[indices]
    codes, uniques = pd.factorize(np.asarray(trials, dtype=object), sort=True)
    return np.where(codes < 0, len(uniques), codes)


def by_trial(table: pa.Table) -> pa.Table:
    """``table``'s rows grouped by trial (in sorted order of the trial ids), each trial's rows in the order
    logged: a compacted dataset is stored so, and a reader whose trials never ran an iteration twice finds it
    in order (:func:`dedupe_order` then moves nothing)."""
    if "trial_id" not in table.column_names or table.num_rows < 2:
        return table
    codes = _trial_codes(table.column("trial_id"))
    return table.take(np.lexsort((np.arange(len(codes)), codes)))


def dedupe_order(trials: Any, iterations: Any) -> np.ndarray:
    """The indices of the rows to keep, sorted by trial and iteration: per trial, the rows no later row
    supersedes (a later row with iteration <= it: a restore re-ran iterations). Rows come in the order
    they were logged; ties keep it.

    >>> dedupe_order(["b", "a", "a", "a", "a"], [1, 1, 2, 2, 3]).tolist()
    [1, 3, 4, 0]
    """
    codes = _trial_codes(trials)
    iters = pd.to_numeric(pd.Series(iterations), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    if len(codes) and np.all((codes[1:] > codes[:-1]) | ((codes[1:] == codes[:-1]) & (iters[1:] > iters[:-1]))):
        return np.arange(len(codes))  # sorted already, each iteration once (a compacted dataset)
    by_trial = np.lexsort((np.arange(len(codes)), codes))  # each trial's rows together, in logged order
    codes, iters = codes[by_trial], iters[by_trial]
    went_back = (codes[1:] == codes[:-1]) & (iters[1:] <= iters[:-1])
    if went_back.any():  # some trial went back: keep a row only if every later one of its trial is past it
        rev_codes, rev_iters = codes[::-1], pd.Series(iters[::-1])
        later_min = rev_iters.groupby(rev_codes, sort=False).cummin()
        exclusive = later_min.groupby(rev_codes, sort=False).shift(1)
        keep = (exclusive.isna() | (rev_iters < exclusive)).to_numpy()[::-1]
        by_trial, codes, iters = by_trial[keep], codes[keep], iters[keep]
    return by_trial[np.lexsort((iters, codes))]  # stable: a tie keeps the logged order


def dedupe_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df``'s rows that :func:`dedupe_order` keeps, in its order."""
    if df.empty or ITER not in df.columns:
        return df.reset_index(drop=True)
    return df.iloc[dedupe_order(df["trial_id"].to_numpy(), df[ITER].to_numpy())].reset_index(drop=True)


def dedupe_table(table: pa.Table) -> pd.DataFrame:
    """``table``'s rows that :func:`dedupe_order` keeps, in its order, as pandas (taken before converting:
    Arrow's take is cheaper than pandas' indexing of string columns)."""
    table = table.select(_column_order(table.column_names))  # (no copy: pandas' reordering copies every column)
    if table.num_rows == 0 or ITER not in table.column_names or "trial_id" not in table.column_names:
        return dedupe_frame(table.to_pandas())
    order = dedupe_order(table.column("trial_id"), table.column(ITER).to_pandas())
    if len(order) == table.num_rows and np.array_equal(order, np.arange(len(order))):
        return table.to_pandas()  # nothing to drop or move
    return table.take(order).to_pandas()


def is_journal(path: str) -> bool:
    """Whether ``path`` is a ParquetLogger journal (``.part-<session>-<JOURNAL>``), not a batch."""
    return posixpath.basename(path).startswith(".part-") and path.endswith("-" + JOURNAL)


def _read_part(fs: pafs.FileSystem, path: str) -> pa.Table:
    return journal_table(fs, path) if is_journal(path) else pq.read_table(path, filesystem=fs)


def parquet_parts(experiment: Storage) -> list[str]:
    """ParquetLogger's batch files and the journals of rows it secured but had not yet batched (a driver
    killed: see :class:`tunekit.callbacks.ParquetLogger`), in the order they were written."""
    directory = posixpath.join(experiment.path, RESULTS_DIR)
    with storage_errors("list", f"{experiment.uri}/{RESULTS_DIR}"):
        infos = experiment.filesystem.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    return sorted(
        (i.path for i in infos if i.type == pafs.FileType.File and (
            (i.base_name.endswith(".parquet") and not i.base_name.startswith(".")) or is_journal(i.path))),
        key=lambda path: posixpath.basename(path).lstrip("."),  # a session's journal after its batches
    )


def journal_table(fs: pafs.FileSystem, path: str) -> pa.Table:
    """A ParquetLogger journal's rows (a torn last line, from a kill inside a write, skipped)."""
    return rows_to_table(parse_result_lines(read_text(fs, path) or "")[0])


def parts_table(experiment: Storage, parts: list[str],
                columns: Callable[[list[str]], list[str]] | None = None) -> pa.Table:
    """Every row of ``parts`` (:func:`parquet_parts`: batches and journals), in the order logged; only the
    columns ``columns(every column's name)`` names, when given."""
    fs = experiment.filesystem
    if not any(is_journal(p) for p in parts):
        dataset = pads.dataset(parts, format="parquet", filesystem=fs)
        return dataset.to_table(columns=columns(dataset.schema.names) if columns else None)
    tables = [_read_part(fs, p) for p in parts]
    table = pa.concat_tables([t for t in tables if t.num_rows] or tables[:1], promote_options="permissive")
    return table.select(columns(table.schema.names)) if columns else table


def from_parquet(experiment: Storage, parts: list[str], *, dedupe: bool = True) -> pd.DataFrame:
    """The rows of the Parquet ``parts`` (and journals), deduplicated and sorted (:func:`dedupe_order`), or
    every row in the order logged (``dedupe=False``)."""
    tidy = dedupe_frame if dedupe else (lambda df: df)
    fs = experiment.filesystem
    if any(is_journal(p) for p in parts):  # a driver was killed: its secured rows are read with the batches
        try:
            table = parts_table(experiment, parts)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # a key changed type between batches
            tables = [_read_part(fs, p) for p in parts]
            return tidy(pd.concat([t.to_pandas() for t in tables], ignore_index=True, sort=False))
        return dedupe_table(table) if dedupe else table.to_pandas()
    with ThreadPoolExecutor(max_workers=8) as pool:
        schemas = list(pool.map(lambda path: pq.read_schema(path, filesystem=fs), parts))
    schema = schemas[0]
    if any(not other.equals(schema) for other in schemas[1:]):  # trials with other keys
        try:
            schema = pa.unify_schemas(schemas, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # a key changed type between batches
            tables = [pq.read_table(path, filesystem=fs) for path in parts]
            return tidy(pd.concat([t.to_pandas() for t in tables], ignore_index=True, sort=False))
    table = pads.dataset(parts, schema=schema, format="parquet", filesystem=fs).to_table()
    return dedupe_table(table) if dedupe else table.to_pandas()


def _read_files(fs: pafs.FileSystem, paths: list[str]) -> list[bytes]:
    """Each file's bytes (empty where it is missing): on a local disk one after the other with Python's own
    I/O (from the page cache, a quarter of a thread pool's time for 500 trials' files), else 8 at a time."""
    if type(fs) is pafs.LocalFileSystem:
        return [read_bytes(fs, path) or b"" for path in paths]

    def read(path: str) -> bytes:
        try:
            with fs.open_input_stream(path) as stream:
                return stream.read()
        except FileNotFoundError:
            return b""

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(read, paths))


def from_result_json(experiment: Storage, names: list[str], problems: list[str]) -> pd.DataFrame:
    """Every trial's ``result.json`` (``names``: the trial directories), damaged lines counted into ``problems``."""
    fs = experiment.filesystem
    blobs = _read_files(fs, [posixpath.join(experiment.join(name).path, "result.json") for name in names])
    try:  # fast: one C++ JSON parse over every trial's lines, in 2 MB blocks parsed in parallel
        data = b"\n".join(b for b in (blob.strip() for blob in blobs) if b)
        if not data:
            return pd.DataFrame()
        table = pajson.read_json(io.BytesIO(data), read_options=pajson.ReadOptions(block_size=1 << 21))
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
