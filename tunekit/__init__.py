"""tunekit: checkpoint-complete hyperparameter experiments on Ray Tune.

Importing tunekit has no side effects: nothing starts Ray, reads the
environment or touches storage until a function is called.

Tested in ``tests/test_structure.py`` (the lazy table) and ``tests/test_packaging.py``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunekit.checkpoint import (
        CheckpointReport,
        local_checkpoint,
        read_metadata,
        read_state,
        verify_checkpoint,
        write_checkpoint,
    )
    from tunekit.data import ShuffledBatches
    from tunekit.loading import load_model
    from tunekit.device import release_memory, trial_device
    from tunekit.errors import (
        CheckpointError,
        ConfigError,
        ConfigTypeError,
        ExperimentError,
        StorageError,
        TunekitError,
    )
    from tunekit.function import FunctionSession, function_trainable
    from tunekit.hparams import DEFAULT_MUTABLE, apply_hyperparameters
    from tunekit.reuse import reusable
    from tunekit.rng import capture_rng, restore_rng, seed_everything
    from tunekit.state import Counters, TrainingState
    from tunekit.storage import Storage, check_cluster_storage, probe_storage, resolve_storage
    from tunekit.torch_trainable import TorchTrainable
    from tunekit.verify import ExperimentCheck, verify_experiment
    from tunekit.warm import warm_start

# Public name -> the module that defines it. ``import tunekit`` imports none of
# them: the offline tools (status, verify, report, analysis) and ``tunekit
# --help`` must not pay for Ray and torch; a name is imported on first use.
_LAZY = {
    "CheckpointReport": "tunekit.checkpoint",
    "load_model": "tunekit.loading",
    "local_checkpoint": "tunekit.checkpoint",
    "read_metadata": "tunekit.checkpoint",
    "read_state": "tunekit.checkpoint",
    "verify_checkpoint": "tunekit.checkpoint",
    "write_checkpoint": "tunekit.checkpoint",
    "ShuffledBatches": "tunekit.data",
    "release_memory": "tunekit.device",
    "reusable": "tunekit.reuse",
    "trial_device": "tunekit.device",
    "CheckpointError": "tunekit.errors",
    "ConfigError": "tunekit.errors",
    "ConfigTypeError": "tunekit.errors",
    "ExperimentError": "tunekit.errors",
    "StorageError": "tunekit.errors",
    "TunekitError": "tunekit.errors",
    "FunctionSession": "tunekit.function",
    "function_trainable": "tunekit.function",
    "DEFAULT_MUTABLE": "tunekit.hparams",
    "apply_hyperparameters": "tunekit.hparams",
    "capture_rng": "tunekit.rng",
    "restore_rng": "tunekit.rng",
    "seed_everything": "tunekit.rng",
    "Counters": "tunekit.state",
    "TrainingState": "tunekit.state",
    "Storage": "tunekit.storage",
    "check_cluster_storage": "tunekit.storage",
    "probe_storage": "tunekit.storage",
    "resolve_storage": "tunekit.storage",
    "TorchTrainable": "tunekit.torch_trainable",
    "ExperimentCheck": "tunekit.verify",
    "verify_experiment": "tunekit.verify",
    "warm_start": "tunekit.warm",
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


__version__ = "0.3.0"

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
