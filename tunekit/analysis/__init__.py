"""The analysis layer: an experiment's results for people.

Owns: every result of every trial in one pandas DataFrame, best trial and model, PBT lineage, what ``tunekit
status`` prints, ``tunekit report`` (HTML and plots) and the TensorBoard export. May import: ``tunekit.schedule``
and the layers below it; imports neither Ray nor torch until a model is loaded.
"""

from __future__ import annotations

from tunekit._lazy import lazy_exports

_EXPORTS = {
    "tunekit.analysis._load": (
        "BestTrial", "Lineage", "best_checkpoint", "best_trial", "load_best_model", "load_results", "pbt_lineage"
    ),
    "tunekit.analysis.report": ("ReportSummary", "guess_metric", "hyperparameters", "write_report"),
    "tunekit.analysis.tensorboard": ("export_tensorboard",),
}
__getattr__, __dir__, _LAZY = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_LAZY)
