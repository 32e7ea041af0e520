"""Hyperparameters that may change during a trial (PBT) and how to apply them."""

from __future__ import annotations

from typing import Any, Mapping

from tunekit.errors import ConfigError
from tunekit.state import TrainingState

__all__ = ["DEFAULT_MUTABLE", "apply_hyperparameters", "changed_hyperparameters"]

#: Hyperparameters every tunekit trainable can change in place.
DEFAULT_MUTABLE: tuple[str, ...] = ("lr", "momentum", "weight_decay", "batch_size")

_OPTIMIZER_KEYS = ("lr", "momentum", "weight_decay")


def changed_hyperparameters(
    saved: Mapping[str, Any], config: Mapping[str, Any], mutable: tuple[str, ...]
) -> dict[str, Any]:
    """Return the mutable hyperparameters whose value in ``config`` differs from ``saved``."""
    return {
        key: config[key]
        for key in mutable
        if key in config and (key not in saved or saved[key] != config[key])
    }


def apply_hyperparameters(state: TrainingState, changed: Mapping[str, Any]) -> list[str]:
    """Apply ``lr``, ``momentum``, ``weight_decay`` and ``batch_size`` in place.

    Optimizer values go to every param group that has the key (``lr`` also to
    ``initial_lr``, which LR schedulers read); ``batch_size`` goes to
    ``state.data.batch_size``.

    Returns:
        The keys of ``changed`` this function did not handle.
    """
    unhandled = []
    for key, value in changed.items():
        if key in _OPTIMIZER_KEYS:
            groups = [g for o in state.optimizers.values() for g in o.param_groups if key in g]
            if not groups:
                raise ConfigError(
                    f"hyperparameter {key}={value!r}: no optimizer param group has "
                    f"{key!r}; declare how to apply it by overriding apply_hyperparameters"
                )
            for group in groups:
                group[key] = value
                if key == "lr" and "initial_lr" in group:
                    group["initial_lr"] = value
        elif key == "batch_size" and hasattr(state.data, "batch_size"):
            state.data.batch_size = value  # type: ignore[union-attr]
        else:
            unhandled.append(key)
    return unhandled
