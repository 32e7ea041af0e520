"""The fault-injection point of checkpoint writes, for kill tests: :func:`reached` is called with each phase a
write reaches ("state": a chunk of ``state.pt`` written; "manifest": every file written, before the manifest;
"committed": a save renamed into place); a test sets :data:`hook` to act there (SIGKILL its process, hold the
write). None (the default) costs one global lookup per call.
"""

from __future__ import annotations

from typing import Any

__all__ = ["hook", "reached"]

#: Called with the phase a checkpoint write reached; None: nothing is.
hook: Any = None


def reached(phase: str) -> None:
    """A checkpoint write reached ``phase``."""
    if hook is not None:
        hook(phase)
