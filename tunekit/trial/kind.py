"""What a trainable declares to tunekit: one typed attribute, ``tunekit_trainable``, on a trainable class (or on a
multi-worker trial's function), read by ``tunekit check``, ``resume``, PBT's setup and ``KeepCheckpoints``
instead of probing private names.

Example:
    >>> def train(config): ...
    >>> train.tunekit_trainable = TrainableKind(multiworker=True)
    >>> declared(train).multiworker, declared(print).multiworker
    (True, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["TrainableKind", "declared"]


@dataclass(frozen=True)
class TrainableKind:
    """What a trainable is, as far as tunekit needs to know.

    Attributes:
        train_fn: A function trainable's training function (:func:`tunekit.function_trainable`): what its
            checkpoints record as ``module:qualname`` and what ``tunekit check`` inspects.
        multiworker: Each trial runs a Ray Train worker group (:func:`tunekit.multiworker.train_trial`): its
            Tune checkpoints point at Train checkpoints, and its workers run as Ray actors.
        resources: A multi-worker trial's worker group: ``workers``, ``cpus_per_worker``, ``use_gpu``.
    """

    train_fn: Callable[[dict[str, Any]], Any] | None = None
    multiworker: bool = False
    resources: Mapping[str, Any] | None = None


def declared(obj: Any) -> TrainableKind:
    """What ``obj`` (a trainable class or instance, or a trial function) declares; an empty kind for anything else."""
    kind = getattr(obj, "tunekit_trainable", None)
    return kind if isinstance(kind, TrainableKind) else TrainableKind()
