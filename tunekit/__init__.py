"""tunekit: checkpoint-complete hyperparameter experiments on Ray Tune.

Importing tunekit has no side effects: nothing starts Ray, reads the environment or touches storage until a
function is called. A public name is imported from its module on first use (:mod:`tunekit._lazy`): the
offline tools (status, verify, report, analysis) and ``tunekit --help`` do not pay for Ray and torch.
"""

from __future__ import annotations

from tunekit._lazy import lazy_exports

_EXPORTS = {
    "tunekit.checkpoint._directory": (
        "CheckpointReport", "local_checkpoint", "read_metadata", "read_state", "verify_checkpoint", "write_checkpoint"
    ),
    "tunekit.checkpoint.loading": ("load_model",),
    "tunekit.errors": (
        "CheckpointError", "ConfigError", "ConfigTypeError", "ExperimentError", "StorageError", "TunekitError"
    ),
    "tunekit.experiment.verify": ("ExperimentCheck", "verify_experiment"),
    "tunekit.storage._location": ("Storage", "check_cluster_storage", "probe_storage", "resolve_storage"),
    "tunekit.trial.data": ("ShuffledBatches",),
    "tunekit.trial.device": ("release_memory", "trial_device"),
    "tunekit.trial.function": ("FunctionSession", "function_trainable"),
    "tunekit.trial.hparams": ("DEFAULT_MUTABLE", "apply_hyperparameters"),
    "tunekit.trial.reuse": ("reusable",),
    "tunekit.trial.rng": ("capture_rng", "restore_rng", "seed_everything"),
    "tunekit.trial.state": ("Counters", "TrainingState"),
    "tunekit.trial.torch_trainable": ("TorchTrainable",),
    "tunekit.trial.warm": ("warm_start",),
}
__getattr__, __dir__, _LAZY = lazy_exports(__name__, _EXPORTS)
__version__ = "0.4.0"
__all__ = sorted([*_LAZY, "__version__"])
