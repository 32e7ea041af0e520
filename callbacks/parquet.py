"""Log every trial result to a Parquet dataset inside the experiment directory.
"""

from __future__ import annotations

import json
import logging
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
from tunekit.errors import first_line
from tunekit.analysis._result_frames import by_trial, is_journal, journal_table
from tunekit._ray import trial_filesystem
from tunekit.table import JOURNAL, RESULTS_DIR, flatten_result, rows_to_table
from tunekit.callbacks.record import TunekitCallback

__all__ = ["ParquetLogger"]

logger = logging.getLogger(__name__)


class ParquetLogger(TunekitCallback):
    """Write every trial result, in batches, to ``EXP/tunekit_results/*.parquet``.

    Rows are flattened (``config/lr``), keyed by ``trial_id`` and
    ``training_iteration``; trials that report different keys are fine. A
    batch is written when it holds ``batch_rows`` rows, when ``flush_seconds``
    have passed, and at the end. Each batch is one new file (named by driver
    session and sequence, so files sort in the order they were written), on
    the experiment's own storage (local, S3, ...). When the experiment ends,
    the session's batch files are compacted into one
    (``part-<session>-all.parquet``, its rows grouped by trial), which makes
    reading a large experiment several times faster; a crash between writing it and deleting the batches
    leaves duplicate rows that readers drop.

    When a trial checkpoints, completes or fails, the rows not yet written
    are secured before Tune can record that checkpoint or end: on local
    storage appended to the session's journal
    (``.part-<session>-journal.jsonl``, JSON lines, emptied by each batch
    written, deleted at the end; a hidden file, so pyarrow's own dataset
    reader skips it and :func:`tunekit.analysis.load_results` reads it); on
    object stores, which cannot append, written as a batch. So a driver
    killed with ``kill -9`` loses no row of an iteration a trial will not run
    again: rows after a trial's last checkpoint are reported and logged again
    when the experiment resumes, and :func:`tunekit.analysis.load_results`
    keeps each iteration once. (A 2,000-trial sweep checkpoints 4,000 times:
    a journal line costs microseconds, a Parquet file about a millisecond to
    write and another to compact.)

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
        self._journal: Any = None  # the open journal (local storage), or None
        self._journaled = 0  # how many of ``_rows`` it holds
        self._stopped: str | None = None  # why it stopped writing (a storage error), else None

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
        if self._stopped:
            return
        if self._target is None:
            self._target = (trial_filesystem(trial), posixpath.dirname(trial.path.rstrip("/")))
            self._storing(self._adopt_journals)
        self._rows.append({"trial_id": trial.trial_id, **flatten_result(result)})
        if len(self._rows) >= self.batch_rows or self._clock() - self._last_flush >= self.flush_seconds:
            self._storing(self.flush)

    @override
    def on_checkpoint(self, iteration: int, trials: list[Trial], trial: Trial, checkpoint: Any, **info: Any) -> None:
        self._storing(self.secure)

    @override
    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        super().on_trial_complete(iteration, trials, trial, **info)
        self._storing(self.secure)

    @override
    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        super().on_trial_error(iteration, trials, trial, **info)
        self._storing(self.secure)

    @override
    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self._storing(self.flush)
        self._storing(self.compact)
        self._storing(self._close_journal)
        super().on_experiment_end(trials, **info)

    def _storing(self, write: Callable[[], None]) -> None:
        """Run one of the hooks' writes: a storage error (a full disk, a lost bucket) stops this logger for the
        rest of the run, said once, instead of taking the driver down; the rows it wrote stay readable."""
        if self._stopped:
            return
        try:
            write()
        except OSError as exc:
            self._stopped = first_line(exc)
            where = self._target[1] if self._target else "the experiment directory"
            logger.warning("tunekit: ParquetLogger cannot write to %s (%s); it stops writing for the rest of this "
                           "run, which goes on (Ray's result.json files hold the rows; tunekit.load_results "
                           "reads both)", posixpath.join(where, RESULTS_DIR), self._stopped)

    def compact(self) -> None:
        """Merge this session's batch files into one file (rows grouped by trial, each trial's in the order
        logged), then delete them."""
        if len(self._written) < 2 or self._target is None:
            return
        fs, experiment = self._target
        tables = [pq.read_table(path, filesystem=fs) for path in self._written]
        try:
            merged = by_trial(pa.concat_tables(tables, promote_options="permissive"))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return  # a key changed type between batches: keep the batch files as they are
        name = posixpath.join(experiment, RESULTS_DIR, f"part-{self._session}-all.parquet")
        self._write(fs, merged, name)
        for path in self._written:
            fs.delete_file(path)
        self._written = [name]

    def secure(self) -> None:
        """Make the buffered rows survive the driver: appended to the journal on local storage, else
        written as a batch (:meth:`flush`)."""
        if self._target is None or not self._rows:
            return
        fs, experiment = self._target
        if not isinstance(fs, pafs.LocalFileSystem):
            self.flush()
            return
        if self._journal is None:
            directory = posixpath.join(experiment, RESULTS_DIR)
            fs.create_dir(directory, recursive=True)
            self._journal = open(posixpath.join(directory, f".part-{self._session or 'nosetup'}-{JOURNAL}"),
                                 "a", encoding="utf-8")
        if len(self._rows) > self._journaled:
            # written through to the OS: a row there outlives the process (as a batch file does)
            self._journal.write("".join(json.dumps(row) + "\n" for row in self._rows[self._journaled:]))
            self._journal.flush()
            self._journaled = len(self._rows)

    def flush(self) -> None:
        """Write the buffered rows as one Parquet file (storage errors are raised); empties the journal."""
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
        if self._journal is not None:  # its rows are in the batch now (killed before this: read twice, kept once)
            self._journal.seek(0)
            self._journal.truncate()
        self._journaled = 0

    def _adopt_journals(self) -> None:
        """An earlier driver's journal (it was killed before its end): its rows written as a batch of its
        session (``part-<session>-journal.parquet``, sorted after that session's batches), then deleted."""
        fs, experiment = self._target  # type: ignore[misc]
        directory = posixpath.join(experiment, RESULTS_DIR)
        for info in fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True)):
            name = info.base_name
            if is_journal(info.path) and self._session not in name:
                table = journal_table(fs, info.path)
                if table.num_rows:
                    self._write(fs, table, posixpath.join(directory, name[1:-len(JOURNAL)] + "journal.parquet"))
                fs.delete_file(info.path)

    def _close_journal(self) -> None:
        """Its rows are in a batch: the journal is closed and deleted."""
        if self._journal is not None:
            self._journal.close()
            os.remove(self._journal.name)
            self._journal = None

    @staticmethod
    def _write(fs: pafs.FileSystem, table: pa.Table, path: str) -> None:
        if isinstance(fs, pafs.LocalFileSystem):
            tmp = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.tmp")
            try:
                pq.write_table(table, tmp, filesystem=fs)
            except OSError:
                if os.path.exists(tmp):  # (a full disk: the part written goes, the space comes back)
                    os.remove(tmp)
                raise
            fs.move(tmp, path)
        else:  # an object store makes an object visible only once it is whole
            pq.write_table(table, path, filesystem=fs)
