"""tunekit: checkpoint-complete hyperparameter experiments on Ray Tune.

Importing tunekit has no side effects: nothing starts Ray, reads the
environment or touches storage until a function is called.
"""

from __future__ import annotations

from tunekit.checkpoint import (
    CheckpointReport,
    load_model,
    local_checkpoint,
    read_metadata,
    read_state,
    verify_checkpoint,
    write_checkpoint,
)
from tunekit.data import ShuffledBatches
from tunekit.device import release_memory, trial_device
from tunekit.errors import CheckpointError, ConfigError, ExperimentError, StorageError, TunekitError
from tunekit.function import FunctionSession, function_trainable
from tunekit.hparams import DEFAULT_MUTABLE, apply_hyperparameters
from tunekit.rng import capture_rng, restore_rng, seed_everything
from tunekit.state import Counters, TrainingState
from tunekit.storage import Storage, check_cluster_storage, probe_storage, resolve_storage
from tunekit.torch_trainable import TorchTrainable
from tunekit.verify import ExperimentCheck, verify_experiment

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "CheckpointReport",
    "ConfigError",
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
    "function_trainable",
    "load_model",
    "local_checkpoint",
    "check_cluster_storage",
    "probe_storage",
    "read_metadata",
    "read_state",
    "release_memory",
    "resolve_storage",
    "restore_rng",
    "seed_everything",
    "trial_device",
    "verify_checkpoint",
    "verify_experiment",
    "write_checkpoint",
]
