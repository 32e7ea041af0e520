"""SIGTERM ends a run as Ctrl-C does: what Slurm, Kubernetes and ``kill`` send stops Tune gracefully.

Ray's driver exits on SIGTERM (``ray.init`` installs ``sys.exit`` for it; its
core may dump a stack), so a preempted sweep ends with no summary and no
resume hint. :func:`sigterm_as_ctrl_c` hands SIGTERM to whatever handles
SIGINT at that moment: inside ``Tuner.fit()`` Tune's own handler (the run stops
after saving the experiment state, and the trials it stopped read as
INTERRUPTED), a second signal Python's ``KeyboardInterrupt`` (Tune restores the
previous handler after the first). A handler a program set itself (such as
:class:`tunekit.callbacks.CheckpointOnPreemption`'s) is left alone.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["restore_sigterm", "sigterm_as_ctrl_c"]


def _as_sigint(signum: int, frame: Any) -> None:
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def sigterm_as_ctrl_c() -> Any:
    """Route SIGTERM to the SIGINT handler, unless a program handles SIGTERM itself (main thread only).

    Returns the handler it replaced (for :func:`restore_sigterm` at the run's end), or None when it left
    SIGTERM as it was."""
    if threading.current_thread() is not threading.main_thread():
        return None
    current = signal.getsignal(signal.SIGTERM)
    if current is _as_sigint:
        return None
    if current in (signal.SIG_DFL, None) or getattr(current, "__module__", "").startswith("ray."):
        signal.signal(signal.SIGTERM, _as_sigint)
        return signal.SIG_DFL if current is None else current
    return None


def restore_sigterm(previous: Any) -> None:
    """Put back the SIGTERM handler :func:`sigterm_as_ctrl_c` replaced, if SIGTERM is still routed by it."""
    if previous is not None and threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGTERM) is _as_sigint:
        signal.signal(signal.SIGTERM, previous)
