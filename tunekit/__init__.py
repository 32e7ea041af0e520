"""tunekit: checkpoint-complete hyperparameter experiments on Ray Tune.

Importing tunekit has no side effects: nothing starts Ray, reads the
environment or touches storage until a function is called.
"""

from __future__ import annotations

from tunekit.checkpoint import (
    CheckpointReport,
    load_model,
    read_metadata,
    read_state,
    verify_checkpoint,
    write_checkpoint,
)
from tunekit.data import ShuffledBatches
from tunekit.device import release_memory, trial_device
from tunekit.errors import CheckpointError, ConfigError, TunekitError
from tunekit.function import FunctionSession, function_trainable
from tunekit.hparams import DEFAULT_MUTABLE, apply_hyperparameters
from tunekit.rng import capture_rng, restore_rng, seed_everything
from tunekit.state import Counters, TrainingState
from tunekit.torch_trainable import TorchTrainable

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MUTABLE",
    "CheckpointError",
    "CheckpointReport",
    "ConfigError",
    "Counters",
    "FunctionSession",
    "ShuffledBatches",
    "TorchTrainable",
    "TrainingState",
    "TunekitError",
    "__version__",
    "apply_hyperparameters",
    "capture_rng",
    "function_trainable",
    "load_model",
    "read_metadata",
    "read_state",
    "release_memory",
    "restore_rng",
    "seed_everything",
    "trial_device",
    "verify_checkpoint",
    "write_checkpoint",
]
