"""Run a process that dies by SIGKILL, then end what it left running, as the machine's end would
(:func:`run_and_reap`). Tested through the driver-kill tests of ``tests/tunekit/test_resume.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from typing import Any, Callable

__all__ = ["kill_until_gone", "run_and_reap"]

#: The environment variable whose value marks every process a reaped run started.
MARKER = "TUNEKIT_TEST_KILLED_RUN"


def _marked(needle: bytes) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    pids.append(int(name))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def run_and_reap(argv: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run`` of a driver that kills itself; then every process it started (its Ray, its workers) is
    SIGKILLed too, so that nothing writes to the experiment once this returns (a worker outliving its driver by a
    moment could otherwise finish a checkpoint while the test reads the experiment)."""
    marker = uuid.uuid4().hex
    needle = f"{MARKER}={marker}".encode()
    done = subprocess.run(argv, env={**env, MARKER: marker}, **kwargs)
    kill_until_gone(lambda: _marked(needle))
    return done


def kill_until_gone(find: Callable[[], list[int]]) -> None:
    """SIGKILL every process ``find()`` names, until it names none (a SIGKILLed process ends at once; its
    children of ours are reaped)."""
    while left := find():
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in left:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
