"""CPU priorities (nice, per thread on Linux) of tunekit's helper threads: below the thread that asks for a
background write or fsync, so that on a busy machine it takes spare cycles and training keeps its own; at
the asking thread's priority while that thread waits for it (no priority inversion: training blocked on a
write that the scheduler starves).

Relative, not absolute: Ray starts its workers at nice 15 (``worker_niceness``), where an absolute nice 10
put the helpers above training. Raising a thread's nice needs no privilege; lowering it back (the lending)
may be refused without one: the write then runs lower, only slower.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

__all__ = ["BELOW_CALLER", "lend_priority", "submit_below", "thread_nice"]

#: Nice levels below the asking thread's that a background write or fsync runs.
BELOW_CALLER = 5


def thread_nice() -> int | None:
    """This thread's nice; None where there are no per-thread priorities."""
    try:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except (AttributeError, OSError):
        return None


class _Job:
    def __init__(self, nice: int | None, job: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.nice, self.job, self.args = nice, job, args
        self.tid: int | None = None  # the helper thread running it, once started

    def __call__(self) -> Any:
        self.tid = threading.get_native_id()  # (before ``nice`` is read: see ``lend_priority``)
        if self.nice is not None and thread_nice() != self.nice:
            _set_nice(self.tid, self.nice)
        return self.job(*self.args)


def _set_nice(tid: int, nice: int) -> None:
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, tid, nice)


def submit_below(pool: ThreadPoolExecutor, job: Callable[..., Any], *args: Any, step: int = BELOW_CALLER) -> Future:
    """``pool.submit(job, *args)``, run ``step`` nice levels below the calling thread (0: at its priority)."""
    nice = thread_nice()
    runner = _Job(None if nice is None else min(19, nice + step), job, args)
    future = pool.submit(runner)
    future.tunekit_job = runner  # type: ignore[attr-defined]
    return future


def lend_priority(future: Future) -> None:
    """The calling thread is about to wait for ``future`` (from :func:`submit_below`): its job runs at the
    caller's priority from now on, when that is higher."""
    runner = getattr(future, "tunekit_job", None)
    if runner is None or runner.nice is None or future.done():  # (the common case: no syscall)
        return
    mine = thread_nice()
    if mine is None or mine >= runner.nice:
        return
    runner.nice = mine  # a job not started yet starts at it; a running one is raised now
    if runner.tid is not None:
        _set_nice(runner.tid, mine)
