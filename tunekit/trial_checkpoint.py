"""Save and restore one trial's TrainingState, shared by class and function trainables."""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

from tunekit.checkpoint import read_state, write_checkpoint
from tunekit.device import trial_device
from tunekit.hparams import changed_hyperparameters
from tunekit.state import TrainingState

__all__ = ["restore_trial_state", "save_trial_state"]


def save_trial_state(
    directory: str | os.PathLike[str],
    state: TrainingState,
    *,
    config: Mapping[str, Any],
    mutable: tuple[str, ...],
    trainable: str,
) -> None:
    """Write ``state`` plus the trial's current mutable hyperparameters."""
    sd = state.state_dict()
    hparams = {k: config[k] for k in mutable if k in config}
    sd["hparams"] = hparams
    write_checkpoint(
        directory,
        sd,
        metadata={
            "iteration": state.counters.iteration,
            "epoch": state.counters.epoch,
            "trainable": trainable,
            "config": dict(config),
            "hparams": hparams,
            "device": str(trial_device()),
            "models": sorted(state.models),
        },
    )


def restore_trial_state(
    directory: str | os.PathLike[str],
    state: TrainingState,
    *,
    config: Mapping[str, Any],
    mutable: tuple[str, ...],
    apply: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Load a checkpoint into ``state``, then apply hyperparameters that changed.

    A PBT exploit restores the donor's optimizer (with the donor's ``lr``) into
    a trial whose config was just mutated; the mutated values win.

    Returns:
        The hyperparameters that differed from the checkpoint and were applied.
    """
    sd = read_state(directory)
    state.load_state_dict(sd)
    changed = changed_hyperparameters(sd.get("hparams") or {}, config, mutable)
    if changed:
        apply(changed)
    return changed
