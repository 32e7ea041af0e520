"""SIGTERM ends a run as Ctrl-C does: what Slurm, Kubernetes and ``kill`` send stops Tune gracefully.

Ray's driver exits on SIGTERM (``ray.init`` installs ``sys.exit`` for it; its
core may dump a stack), so a preempted sweep ends with no summary and no
resume hint. :func:`sigterm_as_ctrl_c` hands SIGTERM to whatever handles
SIGINT at that moment: inside ``Tuner.fit()`` Tune's own handler (the run stops
after saving the experiment state, and the trials it stopped read as
INTERRUPTED), a second signal Python's ``KeyboardInterrupt`` (Tune restores the
previous handler after the first). A handler a program set itself (such as
:class:`tunekit.callbacks.CheckpointOnPreemption`'s) is left alone.

Tested in ``tests/tunekit/test_resume.py``.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["sigterm_as_ctrl_c"]


def _as_sigint(signum: int, frame: Any) -> None:
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def sigterm_as_ctrl_c() -> None:
    """Route SIGTERM to the SIGINT handler, unless a program handles SIGTERM itself (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if current is _as_sigint:
        return
    ours = current in (signal.SIG_DFL, None) or getattr(current, "__module__", "").startswith("ray.")
    if ours:
        signal.signal(signal.SIGTERM, _as_sigint)
