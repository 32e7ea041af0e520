"""The scheduling layer: when trials run and when they checkpoint.

Owns: the PBT setup for tunekit trainables (:func:`tunekit.pbt.pbt_setup`), schedulers that keep every worker
busy, and the checkpoint-interval model (Young, Daly). May import: ``tunekit.experiment`` and the layers
below it.
"""

from __future__ import annotations

from tunekit._lazy import lazy_exports

_EXPORTS = {
    "tunekit.schedule.interval": (
        "MtbfEstimate", "choose_interval", "daly_interval", "describe_intervals", "expected_runtime",
        "format_duration", "parse_duration", "trial_intervals", "young_interval"
    ),
    "tunekit.schedule.pbt": (
        "PBTSetup", "PopulationBasedTrainingNoIdlePause", "mutable_hyperparameters", "pbt_setup",
        "quiet_pbt_keep_warning"
    ),
    "tunekit.schedule.schedulers": ("ASHAKeepWorkersBusy", "FIFOKeepWorkersBusy", "KeepWorkersBusy"),
}
__getattr__, __dir__, _LAZY = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_LAZY)
