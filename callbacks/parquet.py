"""Log every trial result to a Parquet dataset inside the experiment directory.

Tested in ``tests/tunekit/test_analysis.py``.
"""

from __future__ import annotations

import os
import posixpath
import time
import uuid
from typing import Any, Callable

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from ray.tune.experiment import Trial
from typing_extensions import override

from tunekit._checks import integer_at_least, positive_number
from tunekit._ray import trial_filesystem
from tunekit.table import RESULTS_DIR, flatten_result, rows_to_table
from tunekit.callbacks.record import TunekitCallback

__all__ = ["ParquetLogger"]


class ParquetLogger(TunekitCallback):
    """Write every trial result, in batches, to ``EXP/tunekit_results/*.parquet``.

    Rows are flattened (``config/lr``), keyed by ``trial_id`` and
    ``training_iteration``; trials that report different keys are fine. A
    batch is written when it holds ``batch_rows`` rows, when ``flush_seconds``
    have passed, when a trial checkpoints, completes or fails, and at the end.
    Each batch is one new file (named by driver session and sequence, so
    files sort in the order they were written), on the experiment's own
    storage (local, S3, ...). When the experiment ends, the session's batch
    files are compacted into one (``part-<session>-all.parquet``), which
    makes reading a large experiment several times faster; a crash between
    writing it and deleting the batches leaves duplicate rows that readers
    drop. A driver killed with ``kill -9`` loses only the
    rows of its unwritten batch; rows after a trial's last checkpoint are
    reported and logged again when the experiment resumes, and
    :func:`tunekit.analysis.load_results` keeps each iteration once.

    Args:
        batch_rows: Rows per file at most.
        flush_seconds: Longest time a row waits in memory.
        clock: Monotonic time source (tests).
    """

    def __init__(
        self,
        *,
        batch_rows: int = 1000,
        flush_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        integer_at_least("ParquetLogger", "batch_rows", batch_rows)
        self.batch_rows = batch_rows
        self.flush_seconds = positive_number("ParquetLogger", "flush_seconds", flush_seconds)
        self._clock = clock
        self._rows: list[dict[str, Any]] = []
        self._target: tuple[pafs.FileSystem, str] | None = None
        self._session = ""
        self._seq = 0
        self._written: list[str] = []
        self._last_flush = 0.0

    def _recorded_kwargs(self) -> dict[str, Any]:
        return {"batch_rows": self.batch_rows, "flush_seconds": self.flush_seconds}

    def __getstate__(self) -> dict[str, Any]:
        # Tune stores callbacks with the experiment: keep the settings only.
        return {"batch_rows": self.batch_rows, "flush_seconds": self.flush_seconds, "_clock": self._clock}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**{k.lstrip("_"): v for k, v in state.items()})

    @override
    def setup(self, **info: Any) -> None:
        super().setup(**info)
        self._session = f"{int(time.time() * 1000):013d}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._last_flush = self._clock()

    @override
    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info: Any) -> None:
        super().on_trial_result(iteration, trials, trial, result, **info)
        if self._target is None:
            self._target = (trial_filesystem(trial), posixpath.dirname(trial.path.rstrip("/")))
        self._rows.append({"trial_id": trial.trial_id, **flatten_result(result)})
        if len(self._rows) >= self.batch_rows or self._clock() - self._last_flush >= self.flush_seconds:
            self.flush()

    @override
    def on_checkpoint(self, iteration: int, trials: list[Trial], trial: Trial, checkpoint: Any, **info: Any) -> None:
        self.flush()

    @override
    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        super().on_trial_complete(iteration, trials, trial, **info)
        self.flush()

    @override
    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        super().on_trial_error(iteration, trials, trial, **info)
        self.flush()

    @override
    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self.flush()
        self.compact()
        super().on_experiment_end(trials, **info)

    def compact(self) -> None:
        """Merge this session's batch files into one file, then delete them."""
        if len(self._written) < 2 or self._target is None:
            return
        fs, experiment = self._target
        tables = [pq.read_table(path, filesystem=fs) for path in self._written]
        try:
            merged = pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return  # a key changed type between batches: keep the batch files as they are
        name = posixpath.join(experiment, RESULTS_DIR, f"part-{self._session}-all.parquet")
        self._write(fs, merged, name)
        for path in self._written:
            fs.delete_file(path)
        self._written = [name]

    def flush(self) -> None:
        """Write the buffered rows as one Parquet file (storage errors are raised)."""
        self._last_flush = self._clock()
        if not self._rows or self._target is None:
            return
        fs, experiment = self._target
        directory = posixpath.join(experiment, RESULTS_DIR)
        fs.create_dir(directory, recursive=True)
        path = posixpath.join(directory, f"part-{self._session or 'nosetup'}-{self._seq:06d}.parquet")
        self._write(fs, rows_to_table(self._rows), path)
        self._written.append(path)
        self._seq += 1
        self._rows = []

    @staticmethod
    def _write(fs: pafs.FileSystem, table: pa.Table, path: str) -> None:
        if isinstance(fs, pafs.LocalFileSystem):
            tmp = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.tmp")
            pq.write_table(table, tmp, filesystem=fs)
            fs.move(tmp, path)
        else:  # an object store makes an object visible only once it is whole
            pq.write_table(table, path, filesystem=fs)
