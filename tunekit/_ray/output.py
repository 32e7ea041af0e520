"""What of Ray's output tunekit's commands drop: exact log lines, one warning, a vendored colorama's exit hook.

Part of :mod:`tunekit._ray`. Tested in ``tests/test_cli.py`` (the quickstart's
output) and ``tests/tunekit/test_ray_contract.py``.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from typing import Callable

__all__ = [
    "RAY_NOTICES", "RAY_SYNC_FAILURE", "RAY_WARNINGS", "drop_color_reset_at_exit", "quiet_ray_notices",
    "quiet_tune_banner"
]


# -- output ----------------------------------------------------------------------
class _DropMessages(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


#: logger -> the exact message starts that :func:`quiet_ray_notices` drops, and why.
RAY_NOTICES: dict[str, tuple[str, ...]] = {
    # ray.init of a new local cluster turns token authentication on (the safe
    # default we keep) and says how to turn it off; nothing for the user to do.
    "ray._private.authentication.authentication_token_setup": (
        "Token authentication is enabled for this Ray cluster",
    ),
    # A forced experiment snapshot after num_to_keep checkpoints: the
    # quickstart's state is a few trials on the experiment's own storage, a
    # snapshot costs milliseconds, and it is what keeps the state consistent
    # with the checkpoints Ray deletes.
    "ray.tune.execution.experiment_state": (
        "Experiment state snapshotting has been triggered multiple times",
    ),
    # A trial resumed before the driver ever synced its result.json: Ray then
    # keeps appending to the driver's local copy, which holds every row.
    "ray.tune.logger.logger": ("Remote file not found:",),
}


#: (logger, message start) of Ray's report that an experiment sync failed. Tune
#: copies the driver's staging folder to storage in the background while the
#: next snapshot is written: a searcher state goes to a temporary file
#: (``.tmp_generator`` in Ray 2.51, ``.<uuid>-tmp-basic-variant-state-...``
#: later) that is renamed into place, and a copy that listed the temporary
#: file fails when it is gone. The next sync copies the renamed file, and the
#: sync at the end of ``fit()`` is waited for, so nothing is lost: only that
#: failure (a vanished temporary file) is dropped, never another one.
RAY_SYNC_FAILURE = ("ray.tune.execution.experiment_state", "Saving experiment state to storage at")
_VANISHED_TEMPORARY = re.compile(r"[/\\]\.[^/\\']*tmp[^/\\']*'")


class _DropVanishedTemporarySync(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(RAY_SYNC_FAILURE[1]):
            return True
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, FileNotFoundError) and _VANISHED_TEMPORARY.search(str(error)))


#: Python warnings Ray issues that :func:`quiet_ray_notices` drops: (category, message start).
RAY_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    # Ray (2.51-2.5x) announces that it will stop hiding GPUs from workers with
    # num_gpus=0. tunekit places a trial by ray.get_gpu_ids(), never by what
    # CUDA shows, so either behaviour gives the same device.
    (FutureWarning, "Tip: In future versions of Ray, Ray will no longer override accelerator"),
)


def quiet_ray_notices() -> Callable[[], None]:
    """Drop exactly the Ray log lines in :data:`RAY_NOTICES`, warnings in :data:`RAY_WARNINGS` and
    the transient sync failure of :data:`RAY_SYNC_FAILURE`.

    Returns the undo.
    """
    undo = []
    filters = [(name, _DropMessages(prefixes)) for name, prefixes in RAY_NOTICES.items()]
    filters.append((RAY_SYNC_FAILURE[0], _DropVanishedTemporarySync()))
    for name, flt in filters:
        log = logging.getLogger(name)
        log.addFilter(flt)
        undo.append((log, flt))
    saved_filters = list(warnings.filters)
    for category, message in RAY_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), category=category)

    def restore() -> None:
        for log, flt in undo:
            log.removeFilter(flt)
        warnings.filters[:] = saved_filters

    return restore


def quiet_tune_banner() -> Callable[[], None]:
    """Use Tune's classic reporter, which prints nothing at ``verbose=0``.

    Tune's default output prints an experiment banner and a TensorBoard path
    into Ray's temporary session directory even at ``verbose=0``.
    """
    previous = os.environ.get("RAY_AIR_NEW_OUTPUT")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"

    def restore() -> None:
        if previous is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = previous

    return restore


def drop_color_reset_at_exit() -> None:
    """Unregister the exit hook of Ray's vendored colorama, which prints ``ESC[0m`` after our last line."""
    import atexit
    import sys

    initialise = sys.modules.get("colorama.initialise")
    reset_all = getattr(initialise, "reset_all", None)
    if initialise is not None and "thirdparty_files" in str(getattr(initialise, "__file__", "")) and reset_all:
        atexit.unregister(reset_all)
