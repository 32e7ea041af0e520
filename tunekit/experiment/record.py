"""tunekit's own record of an experiment, in plain JSON: what ``tunekit resume`` needs when Ray's files are torn.

Ray keeps an experiment's definition in ``tuner.pkl`` (a pickle of the trainable, the search space, the searcher,
the callbacks) and its trials in ``experiment_state-*.json``. A killed driver, a full disk or a partial copy can
tear either. ``tunekit-experiment.json`` beside them holds, in plain JSON, what a resume needs besides checkpoints:

* the trainable's import path (``module:qualname``), the stop criteria, the
  checkpoint config, ``num_samples``, metric and mode where known, and
  tunekit's callbacks with their settings;
* every trial: its id, directory, status, config, last iteration, stop
  criteria and the checkpoint Ray registered as its newest (what it would
  restore; ``tunekit verify`` checks it is on storage).

Written by the driver at most once a second while something changed (less often where building its text takes
more than 0.5% of that, up to every 10 s) and once at the end, atomically (a temporary name, fsync, a rename; on
object stores one PUT), on a helper thread one write at a time. Every tunekit callback and
:func:`tunekit.pbt_setup`'s scheduler keep it (:class:`tunekit.callbacks.ExperimentRecord` adds it to any other
``Tuner``); one record per run. A run whose experiment's record names another live driver (a second resume, a
second ``Tuner.restore``) is refused at its first write. Nothing here is unpickled: read with :func:`read_record`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import posixpath
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable

import pyarrow.fs as pafs


__all__ = ["ExperimentRecorder", "RECORD_NAME", "driver_running", "finish", "in_use_by_another", "interrupted_trials",
           "json_safe", "observe", "read_record", "trial_finished", "write_record"]

RECORD_NAME = "tunekit-experiment.json"
FORMAT = "tunekit-experiment"
VERSION = 1
#: Seconds between two writes of the record while a run goes on (the last one is written at the end); longer
#: where building its text takes the driver more than ``_SHARE`` of that (a sweep of thousands of trials: the
#: text is O(trials)), up to ``MAX_INTERVAL_S``.
INTERVAL_S = 1.0
MAX_INTERVAL_S = 30.0
_SHARE = 0.005
#: The record is rewritten at least this often while its driver runs, changed or not: its heartbeat.
HEARTBEAT_S = 60.0
#: Statuses Tune does not change again in a run (a trial it retries goes back to PENDING, never to ERROR first).
_ENDED = ("TERMINATED", "ERROR")
#: Where the trials' entries go in the record's text (encoded apart, each once).
_TRIALS_SLOT = "\0trials"
#: Writes the records of running experiments, one at a time, so that the driver never waits for an fsync.
_WRITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunekit-record")


def json_safe(value: Any) -> Any:
    """``value`` as JSON can hold it; what it cannot is kept as ``{"unrecorded": repr}``."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # numpy / torch scalars
        return json_safe(value.item())
    return {"unrecorded": repr(value)[:200]}


def write_record(fs: pafs.FileSystem, experiment_path: str, record: dict[str, Any] | str) -> None:
    """Replace ``EXP/tunekit-experiment.json`` with ``record`` (or its JSON text), atomically."""
    data = (record if isinstance(record, str) else json.dumps(record, indent=1, sort_keys=True)).encode()
    target = posixpath.join(experiment_path, RECORD_NAME)
    if isinstance(fs, pafs.LocalFileSystem):
        tmp = posixpath.join(experiment_path, f".{RECORD_NAME}.tmp-{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        return
    with fs.open_output_stream(target) as stream:  # one PUT: the object appears whole or not at all
        stream.write(data)


def read_record(fs: pafs.FileSystem, experiment_path: str) -> tuple[dict[str, Any] | None, str | None]:
    """The record of the experiment at ``experiment_path``, and a one-line problem if it is missing or damaged."""
    from tunekit.storage._files import file_bytes, loads

    data = file_bytes(fs, posixpath.join(experiment_path, RECORD_NAME))
    if data is None:
        return None, f"no {RECORD_NAME} (the run used no tunekit callback or scheduler, or tunekit < 0.4)"
    try:
        record = loads(data)
    except ValueError as exc:
        return None, f"{RECORD_NAME} is damaged ({exc})"
    if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("trials"), list):
        return None, f"{RECORD_NAME} is not a tunekit experiment record"
    return record, None


def _trainable_spec(trial: Any) -> str | None:
    from tunekit.trial._saving import trainable_spec

    try:
        cls = trial.get_trainable_cls()
    except Exception:  # noqa: BLE001 - not registered in this process: nothing to record
        return None
    if cls is None:
        return None
    from tunekit.trial.kind import declared

    fn = declared(cls).train_fn  # tunekit.function_trainable
    if fn is not None:
        return f"{fn.__module__}:{fn.__qualname__}"
    if getattr(cls, "__module__", "").startswith("ray.") and getattr(cls, "_name", None):
        return None  # a plain training function Ray wrapped: its module is not recorded by Ray
    return trainable_spec(cls)


def _checkpoint_config(trial: Any) -> dict[str, Any] | None:
    from tunekit._ray import trial_checkpoint_config  # the readers import this module without Ray

    config = trial_checkpoint_config(trial)
    if config is None or not dataclasses.is_dataclass(config):
        return None
    return json_safe(dataclasses.asdict(config))


def _registered_checkpoint(checkpoint: Any, experiment: str) -> str | None:
    """The checkpoint Ray would restore a trial from (``Result.checkpoint``: ``checkpoint``), relative to the
    experiment directory (a PBT donor's pin lies in the donor's directory); None before its first."""
    if checkpoint is None:
        return None
    path = checkpoint.path.rstrip("/")  # (not posixpath.relpath: it reads the working directory, twice)
    return posixpath.normpath(path[len(experiment) + 1:].lstrip("/")) if path.startswith(experiment + "/") else None


class ExperimentRecorder:
    """Keeps one run's record up to date; one per run, shared by the tunekit callbacks of that run."""

    def __init__(self, trials: list[Any]) -> None:
        self.trials = trials  # the controller's own list: the run's identity while it lives
        self.info: dict[str, Any] = {}
        self.metric: str | None = None
        self.mode: str | None = None
        self.scheduler: str | None = None
        self.callbacks: dict[str, dict[str, Any] | None] = {}
        self._last_write = self._last_written = -math.inf
        self._last_text: str | None = None
        self.ended = False
        self.refused: str | None = None  # why the experiment is another live driver's: never written then
        #: Trials that ended in this run by Tune's decision (their stop criteria, a scheduler, an error).
        self.finished: set[str] = set()
        #: Trials that had ended before this run began (a restored experiment's).
        self.ended_before = {t.trial_id for t in trials if t.status in ("TERMINATED", "ERROR")}
        #: At the end: trials Tune stopped because the run itself stopped (Ctrl-C, SIGTERM, a stopper).
        self.interrupted: list[str] = []
        self.target: tuple[pafs.FileSystem, str] | None = None  # (the record's filesystem and directory)
        #: The run's constants (trainable, checkpoint config: read once) and each trial's entry with what it
        #: was built from (rebuilt when that changed: the record is rewritten every second of a long sweep).
        self._constants: tuple[str | None, dict[str, Any] | None] | None = None
        #: trial id -> (config, (status, iteration, checkpoint path), JSON text, ended, Ray's latest checkpoint result)
        self._entries: dict[str, tuple[Any, tuple[Any, ...], str, bool, Any]] = {}
        self._writing: Future | None = None  # the write in flight, on the helper thread
        self._text_s = 0.0  # what building the text took last time (the write is the helper thread's)
        #: id(callback) -> the info it last described itself with (each step's call after the first: a lookup)
        self.seen: dict[int, Any] = {}
        #: The experiment directory, and each trial's directory name: read once (``trial.path`` is built anew).
        self._experiment: str | None = None
        self._dirs: dict[str, str] = {}
        #: The SIGTERM handler this run replaced (put back at its end), else None.
        self.sigterm_before: Any = None

    def describe_callback(self, callback: Any) -> None:
        name = f"{type(callback).__module__}:{type(callback).__qualname__}"
        if name not in self.callbacks:
            kwargs = callback._recorded_kwargs() if hasattr(callback, "_recorded_kwargs") else None
            self.callbacks[name] = json_safe(kwargs) if kwargs is not None else None
        metric = getattr(callback, "metric", None)
        mode = getattr(callback, "mode", None)
        if self.metric is None and isinstance(metric, str):
            self.metric = metric
            self.mode = mode if mode in ("max", "min") else self.mode

    def text(self, *, recheck: bool = False) -> str | None:
        """The record as JSON text (None before the run has trials). Each trial's entry is encoded once and
        again only when what it was built from changed; an ended trial's entry is checked by its status and
        checkpoint alone (what can still change once Tune has ended it), all of it with ``recheck``."""
        trials = list(self.trials)
        if not trials:
            return None
        first = trials[0]
        stop = self.info.get("stop")
        if self._constants is None:
            self._constants = (_trainable_spec(first), _checkpoint_config(first))
            self._experiment = posixpath.dirname(first.path.rstrip("/"))
        interrupted = set(self.interrupted)
        head = json.dumps({
            "format": FORMAT,
            "version": VERSION,
            "name": posixpath.basename(self._experiment or ""),
            "trainable": self._constants[0],
            "stop": json_safe(stop) if isinstance(stop, dict) else json_safe(getattr(first, "stopping_criterion", None)),
            "stop_is_dict": stop is None or isinstance(stop, dict),
            "num_samples": json_safe(self.info.get("num_samples")),
            "total_num_samples": json_safe(self.info.get("total_num_samples")),
            "metric": self.metric,
            "mode": self.mode,
            "checkpoint_config": self._constants[1],
            "scheduler": self.scheduler,
            "callbacks": [{"class": k, "kwargs": v} for k, v in sorted(self.callbacks.items())],
            "trials": _TRIALS_SLOT,
            "driver": {"host": socket.gethostname(), "pid": os.getpid()},
            "ended": self.ended,
            "interrupted": self.interrupted,
        }, sort_keys=True)
        before, _, after = head.rpartition(json.dumps(_TRIALS_SLOT))  # ("trials" is the last key but "version")
        entries = ", ".join([self._trial(t, interrupted, recheck) for t in trials])
        return f"{before}[{entries}]{after}"

    def _trial(self, trial: Any, interrupted: set[str], recheck: bool) -> str:
        status = trial.status
        latest = trial.latest_checkpoint_result  # (``trial.checkpoint`` looks it up twice)
        known = self._entries.get(trial.trial_id)
        if known is not None and known[3] and not recheck and known[1][0] == status and known[4] is latest:
            return known[2]  # (ended: its config and iteration are final; KeepCheckpoints may still forget)
        checkpoint = latest.checkpoint if latest else None
        iteration = (trial.last_result or {}).get("training_iteration")
        # Tune marks the trials it stops because the run stops TERMINATED; they did not finish.
        if trial.trial_id in interrupted:
            status = "INTERRUPTED"
        made_of = (status, iteration, None if checkpoint is None else checkpoint.path)
        if known is not None and known[0] is trial.config and known[1] == made_of:  # (a new config is a new dict)
            return known[2]
        text = json.dumps({
            "trial_id": trial.trial_id,
            "dir": self._dirs.get(trial.trial_id) or self._dirs.setdefault(trial.trial_id,
                                                                           posixpath.basename(trial.path)),
            "status": status,
            "config": json_safe(trial.config),
            "iteration": json_safe(iteration),
            "stop": json_safe(getattr(trial, "stopping_criterion", None)),
            "checkpoint": _registered_checkpoint(checkpoint, self._experiment or ""),
        }, sort_keys=True)
        self._entries[trial.trial_id] = (trial.config, made_of, text, status in _ENDED, latest)
        return text

    def flush(self, *, force: bool = False) -> None:
        if self.refused:
            return
        now = time.monotonic()
        interval = min(MAX_INTERVAL_S, max(INTERVAL_S, self._text_s / _SHARE))
        if not force and (now - self._last_write < interval or (self._writing and not self._writing.done())):
            return  # (a write in flight: the next flush writes what changed meanwhile)
        self._last_write = now
        text = self.text(recheck=force)  # (one line: json's C encoder; indented, 5x the time)
        self._text_s = time.monotonic() - now
        if text is None:
            return
        if text == self._last_text and now - self._last_written < HEARTBEAT_S and not force:
            return
        # wall clock, read by other processes and machines (tunekit gc): added to the text, not dumped again
        written = f'{text[:-1]}, "updated": {json.dumps(time.time())}}}'
        if self.target is None:
            from tunekit._ray import trial_filesystem

            first = self.trials[0]
            target = (trial_filesystem(first), posixpath.dirname(first.path))
            if running := in_use_by_another(read_record(*target)[0]):  # (a second run of it: refused)
                from tunekit.errors import ExperimentError

                self.refused = f"{target[1]} is in use: {running}; this run would train its trials twice (stop it first)"
                raise ExperimentError(self.refused)
            self.target = target
        if self._writing is not None:
            self._writing.result()  # (the end: after any write in flight, never before it)
        self._last_text, self._last_written = text, now
        if force:
            self._write(written)
        else:
            self._writing = _WRITER.submit(self._write, written)

    def _write(self, text: str) -> None:
        fs, path = self.target  # type: ignore[misc]
        try:
            write_record(fs, path, text)
        except OSError as exc:  # the record is a safety net: a failed write must not fail the run
            import logging

            logging.getLogger(__name__).warning("tunekit: could not write %s in %s: %s", RECORD_NAME, path, exc)
            self._last_text = None  # (written again at the next flush)


# id(the controller's trial list) -> (recorder, the callback or scheduler that writes it)
_RUNS: dict[int, tuple[ExperimentRecorder, Any]] = {}


def observe(owner: Any, trials: list[Any], *, info: dict[str, Any] | None = None, scheduler: bool = False,
            force: bool = False) -> ExperimentRecorder:
    """Called by a tunekit callback (every step) or scheduler (every result): the first for a run writes the record."""
    entry = _RUNS.get(id(trials))
    if entry is None or entry[0].trials is not trials:
        from tunekit.experiment._signals import sigterm_as_ctrl_c

        entry = _RUNS[id(trials)] = (ExperimentRecorder(trials), owner)
        entry[0].sigterm_before = sigterm_as_ctrl_c()  # a run with tunekit's callbacks stops on SIGTERM as on Ctrl-C
    recorder, writer = entry
    if recorder.seen.get(id(owner), recorder) is info and not scheduler:  # (described already, with this info)
        if writer is owner:
            recorder.flush(force=force)
        return recorder
    recorder.seen[id(owner)] = info
    if info:
        recorder.info.update(info)
    if scheduler:
        recorder.scheduler = f"{type(owner).__module__}:{type(owner).__qualname__}"
        recorder.metric = recorder.metric or getattr(owner, "_metric", None)
        recorder.mode = recorder.mode or getattr(owner, "_mode", None)
    else:
        recorder.describe_callback(owner)
    if writer is owner:
        recorder.flush(force=force)
    return recorder


def finish(owner: Any, trials: Iterable[Any]) -> tuple[pafs.FileSystem, str] | None:
    """At the end of a run: the final record, and the run forgotten; where it went (None: not its writer)."""
    entry = _RUNS.get(id(trials))
    if entry is None or entry[1] is not owner:
        return None
    recorder = entry[0]
    recorder.ended = True
    recorder.interrupted = sorted(
        t.trial_id for t in trials
        if t.trial_id not in recorder.finished and t.trial_id not in recorder.ended_before and t.status != "ERROR"
        and (t.status != "TERMINATED" or not (t.last_result or {}).get("done")))
    entry[0].flush(force=True)
    del _RUNS[id(trials)]
    from tunekit.experiment._signals import restore_sigterm

    restore_sigterm(recorder.sigterm_before)
    return recorder.target


def interrupted_trials(fs: pafs.FileSystem, experiment_path: str, trials: list[Any],
                       record: dict[str, Any] | None = None) -> list[str]:
    """Trials (read-model ``TrialSnapshot``s) left unfinished by a run that stopped: none while the record's driver
    runs, or without a record (``record``: read already). Those Tune marked TERMINATED as the run stopped get the
    status INTERRUPTED."""
    if record is None:
        record, _ = read_record(fs, experiment_path)
    if record is None or driver_running(record):
        return []
    named = set(record.get("interrupted") or [])
    for trial in trials:
        if trial.trial_id in named and trial.status == "TERMINATED":
            trial.status = "INTERRUPTED"
    return [t.trial_id for t in trials if t.status not in ("TERMINATED", "ERROR")]


def trial_finished(trials: Iterable[Any], trial: Any) -> None:
    """Tune ended ``trial`` by its own decision (stop criteria, a scheduler, an error): it was not interrupted."""
    entry = _RUNS.get(id(trials))
    if entry is not None:
        entry[0].finished.add(trial.trial_id)


def in_use_by_another(record: dict[str, Any] | None) -> str | None:
    """Why another live driver holds the experiment that keeps ``record`` (None: none, or this process)."""
    driver = record.get("driver") if isinstance(record, dict) and isinstance(record.get("driver"), dict) else {}
    if not record or (driver.get("pid") == os.getpid() and driver.get("host") == socket.gethostname()):
        return None
    return driver_running(record)


def driver_running(record: dict[str, Any]) -> str | None:
    """Why the run that keeps ``record`` may still be going (its driver alive, its heartbeat fresh), else None."""
    from tunekit.checkpoint._trial_dir import writer_alive, writer_id

    if record.get("ended"):
        return None
    driver = record.get("driver") if isinstance(record.get("driver"), dict) else {}
    host, pid, updated = driver.get("host"), driver.get("pid"), record.get("updated")
    age = time.time() - updated if isinstance(updated, (int, float)) else math.inf
    if age > 5 * HEARTBEAT_S:
        return None  # no heartbeat for 5 minutes: its driver is gone
    if host == socket.gethostname() and isinstance(pid, int):
        if not writer_alive(writer_id().rsplit("-", 1)[0], pid):
            return None
        return f"its driver is running (pid {pid} on this machine; record updated {age:.0f} s ago)"
    return f"its driver on {host} updated the record {age:.0f} s ago (it beats every {HEARTBEAT_S:.0f} s)"
