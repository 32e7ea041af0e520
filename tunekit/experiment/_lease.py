"""The experiment's lease: one driver at a time continues an experiment (``tunekit resume``).

``EXP/.tunekit-lease.json`` names its holder (host, pid, start time, command).
On local storage it is created exclusively (``O_EXCL``); on remote storage it
is written and read back (object stores have no exclusive create through
pyarrow: two takers within the same moment can both win there). A lease whose
holder is a dead process on this host is taken over; one held on another host
is taken over once tunekit's record (``tunekit-experiment.json``) of that
holder has had no heartbeat for five of its intervals, else refused, naming
the holder and the lease's age. The run that keeps the record (its driver
alive, its heartbeat fresh) holds the experiment too: a resume beside it is
refused.
"""

from __future__ import annotations

import json
import os
import posixpath
import socket
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterator

import pyarrow.fs as pafs

from tunekit.errors import ExperimentError, first_line
from tunekit.experiment.record import HEARTBEAT_S, in_use_by_another, read_record
from tunekit.storage._location import Storage

__all__ = ["LEASE_NAME", "experiment_lease"]

LEASE_NAME = ".tunekit-lease.json"


@contextmanager
def experiment_lease(experiment: Storage, command: str) -> Iterator[None]:
    """Hold ``experiment``'s lease while the body runs; refuse (``ExperimentError``) if another holds it."""
    record, _ = read_record(experiment.filesystem, experiment.path)
    if running := in_use_by_another(record):
        raise ExperimentError(f"{experiment.uri} is in use: {running}; `tunekit {command}` would train its "
                              "trials twice (stop that run first)")
    token = _take(experiment, command, record)
    try:
        yield
    finally:
        _release(experiment, token)


def _path(experiment: Storage) -> str:
    return posixpath.join(experiment.path, LEASE_NAME)


def _take(experiment: Storage, command: str, record: dict[str, Any] | None) -> str:
    token = uuid.uuid4().hex
    text = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
                       "command": f"tunekit {command}", "token": token})
    fs, path = experiment.filesystem, _path(experiment)
    for _ in range(2):  # (a second try after a stale lease was removed)
        try:
            created = _create(experiment, path, text)
        except OSError as exc:
            raise ExperimentError(f"{experiment.uri}: cannot write its lease {LEASE_NAME} ({first_line(exc)}); "
                                  "continuing an experiment needs storage it can write to") from None
        if created:
            if experiment.is_local or _read(fs, path).get("token") == token:
                return token
        held = _read(fs, path)
        if not held.get("token"):
            raise ExperimentError(f"{experiment.uri}: its lease {LEASE_NAME} cannot be read; if no tunekit command "
                                  "is running on this experiment, delete that file and try again")
        if not _stale(held, record):
            raise ExperimentError(f"{experiment.uri} is in use: {_holder(held)}; wait for it to end, or stop it")
        try:  # stale (its holder is dead): taken over
            fs.delete_file(path)
        except (FileNotFoundError, OSError):
            pass
    raise ExperimentError(f"{experiment.uri}: could not take its lease ({path}); another resume may be starting")


def _create(experiment: Storage, path: str, text: str) -> bool:
    """Write the lease if none is there (exclusively on local disk)."""
    if experiment.is_local:  # written aside, then linked into place: no reader ever sees it half-written
        aside = f"{path}.{os.getpid()}-{uuid.uuid4().hex[:6]}"
        with open(aside, "w") as fh:
            fh.write(text)
        try:
            os.link(aside, path)
        except FileExistsError:
            return False
        finally:
            os.remove(aside)
        return True
    fs = experiment.filesystem
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        return False
    with fs.open_output_stream(path) as out:
        out.write(text.encode())
    return True


def _read(fs: pafs.FileSystem, path: str) -> dict[str, Any]:
    try:
        with fs.open_input_stream(path) as stream:
            held = json.loads(stream.read() or b"{}")
    except (FileNotFoundError, OSError, ValueError):
        return {}
    return held if isinstance(held, dict) else {}


def _stale(held: dict[str, Any], record: dict[str, Any] | None) -> bool:
    """Whether the lease's holder is gone: a dead process on this host; elsewhere, no fresh heartbeat."""
    from tunekit.checkpoint._trial_dir import writer_alive, writer_id

    host, pid = held.get("host"), held.get("pid")
    if host == socket.gethostname() and isinstance(pid, int):
        return pid != os.getpid() and not writer_alive(writer_id().rsplit("-", 1)[0], pid)
    beat = record.get("updated") if isinstance(record, dict) else None
    last = max(v for v in (beat, held.get("started")) if isinstance(v, (int, float))) \
        if isinstance(beat, (int, float)) or isinstance(held.get("started"), (int, float)) else 0.0
    return time.time() - last > 5 * HEARTBEAT_S


def _holder(held: dict[str, Any]) -> str:
    started = held.get("started")
    age = f"{time.time() - started:.0f} s ago" if isinstance(started, (int, float)) else "at an unknown time"
    where = "this machine" if held.get("host") == socket.gethostname() else str(held.get("host"))
    return f"{held.get('command') or 'a tunekit command'} (pid {held.get('pid')} on {where}) took it {age}"


def _release(experiment: Storage, token: str) -> None:
    fs, path = experiment.filesystem, _path(experiment)
    if _read(fs, path).get("token") == token:
        try:
            fs.delete_file(path)
        except (FileNotFoundError, OSError):
            pass
