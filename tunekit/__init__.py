"""tunekit: checkpoint-complete hyperparameter experiments on Ray Tune.

Importing tunekit has no side effects: nothing starts Ray, reads the
environment or touches storage until a function is called.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunekit.checkpoint._directory import (
        CheckpointReport,
        local_checkpoint,
        read_metadata,
        read_state,
        verify_checkpoint,
        write_checkpoint,
    )
    from tunekit.trial.data import ShuffledBatches
    from tunekit.checkpoint.loading import load_model
    from tunekit.trial.device import release_memory, trial_device
    from tunekit.errors import (
        CheckpointError,
        ConfigError,
        ConfigTypeError,
        ExperimentError,
        StorageError,
        TunekitError,
    )
    from tunekit.trial.function import FunctionSession, function_trainable
    from tunekit.trial.hparams import DEFAULT_MUTABLE, apply_hyperparameters
    from tunekit.trial.reuse import reusable
    from tunekit.trial.rng import capture_rng, restore_rng, seed_everything
    from tunekit.trial.state import Counters, TrainingState
    from tunekit.storage._location import Storage, check_cluster_storage, probe_storage, resolve_storage
    from tunekit.trial.torch_trainable import TorchTrainable
    from tunekit.experiment.verify import ExperimentCheck, verify_experiment
    from tunekit.trial.warm import warm_start

# Public name -> the module that defines it. ``import tunekit`` imports none of
# them: the offline tools (status, verify, report, analysis) and ``tunekit
# --help`` must not pay for Ray and torch; a name is imported on first use.
_LAZY = {
    "CheckpointReport": "tunekit.checkpoint._directory",
    "load_model": "tunekit.checkpoint.loading",
    "local_checkpoint": "tunekit.checkpoint._directory",
    "read_metadata": "tunekit.checkpoint._directory",
    "read_state": "tunekit.checkpoint._directory",
    "verify_checkpoint": "tunekit.checkpoint._directory",
    "write_checkpoint": "tunekit.checkpoint._directory",
    "ShuffledBatches": "tunekit.trial.data",
    "release_memory": "tunekit.trial.device",
    "reusable": "tunekit.trial.reuse",
    "trial_device": "tunekit.trial.device",
    "CheckpointError": "tunekit.errors",
    "ConfigError": "tunekit.errors",
    "ConfigTypeError": "tunekit.errors",
    "ExperimentError": "tunekit.errors",
    "StorageError": "tunekit.errors",
    "TunekitError": "tunekit.errors",
    "FunctionSession": "tunekit.trial.function",
    "function_trainable": "tunekit.trial.function",
    "DEFAULT_MUTABLE": "tunekit.trial.hparams",
    "apply_hyperparameters": "tunekit.trial.hparams",
    "capture_rng": "tunekit.trial.rng",
    "restore_rng": "tunekit.trial.rng",
    "seed_everything": "tunekit.trial.rng",
    "Counters": "tunekit.trial.state",
    "TrainingState": "tunekit.trial.state",
    "Storage": "tunekit.storage._location",
    "check_cluster_storage": "tunekit.storage._location",
    "probe_storage": "tunekit.storage._location",
    "resolve_storage": "tunekit.storage._location",
    "TorchTrainable": "tunekit.trial.torch_trainable",
    "ExperimentCheck": "tunekit.experiment.verify",
    "verify_experiment": "tunekit.experiment.verify",
    "warm_start": "tunekit.trial.warm",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tunekit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.4.0"

__all__ = [
    "CheckpointError",
    "CheckpointReport",
    "ConfigError",
    "ConfigTypeError",
    "Counters",
    "DEFAULT_MUTABLE",
    "ExperimentCheck",
    "ExperimentError",
    "FunctionSession",
    "ShuffledBatches",
    "Storage",
    "StorageError",
    "TorchTrainable",
    "TrainingState",
    "TunekitError",
    "__version__",
    "apply_hyperparameters",
    "capture_rng",
    "check_cluster_storage",
    "function_trainable",
    "load_model",
    "local_checkpoint",
    "probe_storage",
    "read_metadata",
    "read_state",
    "release_memory",
    "resolve_storage",
    "restore_rng",
    "reusable",
    "seed_everything",
    "trial_device",
    "verify_checkpoint",
    "verify_experiment",
    "warm_start",
    "write_checkpoint",
]
