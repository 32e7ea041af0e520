"""Hyperparameters that may change during a trial (PBT) and how to apply them."""

from __future__ import annotations

from typing import Any, Mapping

from tunekit.errors import ConfigError
from tunekit.trial.state import TrainingState

__all__ = ["DEFAULT_MUTABLE", "apply_hyperparameters", "changed_hyperparameters", "put_learning_rate"]

#: Hyperparameters every tunekit trainable can change in place.
DEFAULT_MUTABLE: tuple[str, ...] = ("lr", "momentum", "weight_decay", "batch_size")

_OPTIMIZER_KEYS = ("lr", "momentum", "weight_decay")
#: Param-group entries that hold a rate of the schedule (OneCycleLR keeps its own there).
_GROUP_RATES = ("lr", "initial_lr", "max_lr", "min_lr")
#: Scheduler attributes that hold one rate per param group (CyclicLR's max_lrs).
_SCHEDULER_RATES = ("base_lrs", "_last_lr", "max_lrs")


def changed_hyperparameters(
    saved: Mapping[str, Any], config: Mapping[str, Any], mutable: tuple[str, ...]
) -> dict[str, Any]:
    """Return the mutable hyperparameters whose value in ``config`` differs from ``saved``."""
    return {
        key: config[key]
        for key in mutable
        if key in config and (key not in saved or saved[key] != config[key])
    }


def _schedulers_of(schedulers: Any) -> list[Any]:
    """Every scheduler, the ones inside SequentialLR and ChainedScheduler included."""
    out = []
    for scheduler in schedulers:
        out.append(scheduler)
        out.extend(_schedulers_of(getattr(scheduler, "_schedulers", None) or []))
    return out


def _check_scheduler(scheduler: Any) -> None:
    import torch.optim.lr_scheduler as lrs

    if not isinstance(scheduler, (lrs.LRScheduler, lrs.ReduceLROnPlateau)):
        raise ConfigError(
            f"hyperparameter lr: cannot put a new rate in effect under {type(scheduler).__name__}, which is not "
            "one of torch's LR schedulers; apply it yourself by overriding apply_hyperparameters"
        )


def put_learning_rate(optimizers: Any, schedulers: Any, value: float, *, previous: Any = None) -> None:
    """Put learning rate ``value`` in effect, the LR schedule going on as if built at it.

    The schedule was built at ``previous`` (the config's rate before the
    change). Every rate the optimizer and its schedulers hold (each param
    group's ``lr`` and ``initial_lr``, OneCycleLR's ``max_lr``/``min_lr``,
    each scheduler's ``base_lrs``, ``_last_lr`` and CyclicLR's ``max_lrs``, in
    SequentialLR and ChainedScheduler too) is scaled by ``value / previous``:
    the next step's rate is the one the schedule built at ``value`` has there,
    its progress (step count, warm-up, decay, cycles, plateau reductions) kept.
    Absolute floors (``eta_min``, ``min_lr`` of ReduceLROnPlateau) stay as given.
    Without a usable ``previous`` the rate is set as it is.

    Raises:
        ConfigError: no param group has ``lr``, or a scheduler is not one of torch's.
    """
    groups = [(o, i, g) for o in optimizers for i, g in enumerate(o.param_groups) if "lr" in g]
    if not groups:
        raise ConfigError(f"hyperparameter lr={value!r}: no optimizer param group has 'lr'")
    every = _schedulers_of(schedulers)
    for scheduler in every:
        _check_scheduler(scheduler)
    scale_known = isinstance(previous, (int, float)) and not isinstance(previous, bool) and previous > 0

    def scaled(x: float) -> float:  # value * (x / previous): exactly value where x == previous
        return value * (x / previous)

    for optimizer, index, group in groups:
        if not scale_known:
            group["lr"] = value
            if "initial_lr" in group:
                group["initial_lr"] = value
            for scheduler in every:
                if getattr(scheduler, "optimizer", None) is optimizer and hasattr(scheduler, "base_lrs"):
                    scheduler.base_lrs[index] = value
            continue
        for key in _GROUP_RATES:
            if isinstance(group.get(key), (int, float)):
                group[key] = scaled(group[key])
        for scheduler in every:
            if getattr(scheduler, "optimizer", None) is not optimizer:
                continue
            for attr in _SCHEDULER_RATES:
                rates = getattr(scheduler, attr, None)
                if isinstance(rates, list) and index < len(rates) and isinstance(rates[index], (int, float)):
                    rates[index] = scaled(rates[index])


def apply_hyperparameters(state: TrainingState, changed: Mapping[str, Any]) -> list[str]:
    """Apply ``lr``, ``momentum``, ``weight_decay`` and ``batch_size`` in place.

    ``lr`` is put in effect under the state's LR schedulers
    (:func:`put_learning_rate`, from the rate the loaded checkpoint was saved
    with, :attr:`TrainingState.hparams`); ``momentum`` and ``weight_decay`` go
    to every param group that has the key; ``batch_size`` goes to
    ``state.data.batch_size``.

    Returns:
        The keys of ``changed`` this function did not handle.
    """
    unhandled = []
    for key, value in changed.items():
        if key == "lr":
            put_learning_rate(state.optimizers.values(), state.schedulers.values(), value,
                              previous=state.hparams.get("lr"))
        elif key in _OPTIMIZER_KEYS:
            groups = [g for o in state.optimizers.values() for g in o.param_groups if key in g]
            if not groups:
                raise ConfigError(
                    f"hyperparameter {key}={value!r}: no optimizer param group has "
                    f"{key!r}; declare how to apply it by overriding apply_hyperparameters"
                )
            for group in groups:
                group[key] = value
        elif key == "batch_size" and hasattr(state.data, "batch_size"):
            state.data.batch_size = value  # type: ignore[union-attr]
        else:
            unhandled.append(key)
    return unhandled
