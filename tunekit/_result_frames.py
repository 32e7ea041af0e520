"""Result rows as pandas: the Parquet dataset or every trial's ``result.json``, deduplicated after restores.

Implementation tier of :mod:`tunekit.analysis` (``load_results``) and of the
PBT lineage (:mod:`tunekit._lineage`).

Tested in ``tests/tunekit/test_analysis.py``.
"""

from __future__ import annotations

import io
import posixpath
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from tunekit.results import parse_result_lines
from tunekit.storage import Storage, storage_errors
from tunekit.table import RESULTS_DIR, flatten_result

__all__ = ["ITER", "dedupe_frame", "from_parquet", "from_result_json", "order_columns", "parquet_parts", "row_config"]

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


def order_columns(df: pd.DataFrame) -> pd.DataFrame:
    first = [c for c in ("trial_id", ITER) if c in df.columns]
    config = sorted(c for c in df.columns if c.startswith("config/"))
    rest = [c for c in df.columns if c not in first and c not in config]
    return df[first + rest + config]


def dedupe_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Keep, per trial, the rows no later row supersedes (a later row with iteration <= it).

    Rows come in the order they were logged; the result is sorted by trial and iteration.
    """
    if df.empty or ITER not in df.columns:
        return df.reset_index(drop=True)
    df = df.reset_index(drop=True)
    trials = df["trial_id"].to_numpy()
    iters = pd.to_numeric(df[ITER], errors="coerce")
    steps = iters.groupby(trials, sort=False).diff()
    if (steps <= 0).any():  # some trial went back: a restore re-ran iterations
        rev_iters = iters.iloc[::-1]
        later_min = rev_iters.groupby(trials[::-1], sort=False).cummin()
        exclusive = later_min.groupby(trials[::-1], sort=False).shift(1)
        keep = (exclusive.isna() | (rev_iters < exclusive)).to_numpy()[::-1]
        df = df[keep]
    return df.sort_values(["trial_id", ITER], kind="stable").reset_index(drop=True)


def parquet_parts(experiment: Storage) -> list[str]:
    directory = posixpath.join(experiment.path, RESULTS_DIR)
    with storage_errors("list", f"{experiment.uri}/{RESULTS_DIR}"):
        infos = experiment.filesystem.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    return sorted(
        i.path for i in infos
        if i.type == pafs.FileType.File and i.base_name.endswith(".parquet") and not i.base_name.startswith(".")
    )


def from_parquet(experiment: Storage, parts: list[str]) -> pd.DataFrame:
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


def from_result_json(experiment: Storage, names: list[str], problems: list[str]) -> pd.DataFrame:
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
