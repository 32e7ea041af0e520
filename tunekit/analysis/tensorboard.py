"""Export an experiment's results to TensorBoard (tensorboardX): scalars and the HParams view.

Ray Tune already writes event files per trial; after restores they hold
re-run iterations twice, and trials that never finished have no HParams
entry. :func:`export_tensorboard` writes one clean run per trial from
:func:`tunekit.analysis._load.load_results` (each iteration once) with an HParams
record (config against final metrics) for every trial.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from tunekit._checks import is_number
from tunekit.analysis._result_frames import row_config
from tunekit.analysis._load import load_results
from tunekit.errors import ExperimentError
from tunekit.storage._location import Storage

__all__ = ["export_tensorboard"]

_NOT_SCALARS = {"training_iteration", "timestamp", "pid", "done", "should_checkpoint", "trial_id"}


def _value(v: Any) -> Any:
    v = v.item() if hasattr(v, "item") else v
    return v if isinstance(v, (bool, int, float, str)) else str(v)


def export_tensorboard(location: str | Storage, logdir: str | os.PathLike[str]) -> Path:
    """Write ``logdir/<trial_id>/`` event files for every trial; return ``logdir``.

    Open with ``tensorboard --logdir LOGDIR``.
    """
    from tensorboardX import SummaryWriter
    from tensorboardX.summary import hparams

    df = load_results(location)
    if df.empty:
        raise ExperimentError(f"{location}: no results to export")
    out = Path(logdir)
    out.mkdir(parents=True, exist_ok=True)
    metrics = [
        c for c in df.columns
        if c not in _NOT_SCALARS and not c.startswith("config/") and pd.api.types.is_numeric_dtype(df[c])
    ]
    for trial_id, rows in df.groupby("trial_id"):
        with SummaryWriter(logdir=str(out / str(trial_id))) as writer:
            for record in rows.to_dict("records"):
                step = int(record["training_iteration"])
                for name in metrics:
                    value = _value(record.get(name))
                    if is_number(value):
                        writer.add_scalar(name, float(value), step)
            last = rows.iloc[-1]
            config = {name: _value(value) for name, value in row_config(last).items()}
            finals = {f"final/{m}": float(last[m]) for m in metrics if is_number(_value(last[m]))}
            for summary in hparams(config, finals):
                writer.file_writer.add_summary(summary)
            for name, value in finals.items():
                writer.add_scalar(name, value, int(last["training_iteration"]))
    return out
