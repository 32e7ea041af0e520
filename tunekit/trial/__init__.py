"""The trial layer: what a trial carries and the two trainables that carry it.

Owns: :class:`TrainingState` (models, optimizers, schedulers, scaler, RNG streams, counters, data position),
RNG capture, resumable data, device placement, hyperparameters PBT may change, worker reuse, warm starts, the
checkpointing core both trainables share (saving, restoring, cloning) and the trainables themselves
(:class:`TorchTrainable`, :func:`function_trainable`). May import: ``tunekit.checkpoint``,
``tunekit.storage``, ``tunekit._ray`` and the top-level modules.
"""

from __future__ import annotations

from tunekit._lazy import lazy_exports

_EXPORTS = {
    "tunekit.trial.data": ("ShuffledBatches",),
    "tunekit.trial.device": ("allocated_bytes", "release_memory", "trial_device"),
    "tunekit.trial.function": ("FunctionSession", "function_trainable"),
    "tunekit.trial.hparams": (
        "DEFAULT_MUTABLE", "apply_hyperparameters", "changed_hyperparameters", "put_learning_rate"
    ),
    "tunekit.trial.kind": ("TrainableKind", "declared"),
    "tunekit.trial.reuse": ("ReusableSlot", "reusable", "reusable_key", "reusable_slot"),
    "tunekit.trial.rng": ("capture_rng", "restore_rng", "seed_everything"),
    "tunekit.trial.state": ("Counters", "StateBuffers", "Stateful", "TrainingState", "to_cpu"),
    "tunekit.trial.torch_trainable": ("TorchTrainable",),
    "tunekit.trial.warm": (
        "LINEAGE_KEY", "MODES", "WARM_START_KEY", "apply_warm_start", "warm_start", "warm_start_spec"
    ),
}
__getattr__, __dir__, _LAZY = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_LAZY)
