"""``DigitsTrainable``: the class-API reference trainable.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.tune.result import SHOULD_CHECKPOINT

from tunekit import TorchTrainable, TrainingState, load_model, read_metadata
from tunekit.trainables.digits import (
    DEFAULTS, DigitsData, build_digits_state, digits_model, digits_on_device, evaluate, train_steps
)

__all__ = ["DigitsTrainable"]


class DigitsTrainable(TorchTrainable):
    """An MLP on scikit-learn's digits; one iteration is one epoch by default.

    Config: ``lr``, ``momentum``, ``weight_decay``, ``hidden_size``,
    ``batch_size``, ``seed``, ``steps_per_iteration`` (None = one epoch),
    ``checkpoint_every`` (optional: the trainable sets ``should_checkpoint``
    every N iterations).
    Reports ``loss`` and ``accuracy`` on the validation split and
    ``train_loss``.

    The dataset on the trial's device depends on no hyperparameter: it is
    declared reusable (``reusable_keys = ()``), so a worker Tune reuses for
    another trial keeps it.
    """

    reusable_keys = ()
    reusable: DigitsData

    def build_reusable(self, config: dict[str, Any]) -> DigitsData:
        return digits_on_device(self.device)

    def build(self, config: dict[str, Any]) -> TrainingState:
        return build_digits_state(config, self.device, self.reusable)

    def train_iteration(self) -> dict[str, Any]:
        steps = self.config.get("steps_per_iteration", DEFAULTS["steps_per_iteration"])
        train_loss = train_steps(self.state, steps)
        metrics = {"train_loss": train_loss, **evaluate(self.state.model, self.device, self.reusable)}
        every = self.config.get("checkpoint_every")
        if every and (self.state.counters.iteration + 1) % every == 0:
            metrics[SHOULD_CHECKPOINT] = True  # the trainable asks for a checkpoint
        return metrics

    @staticmethod
    def load_model(checkpoint_dir: str, *, map_location: str | torch.device = "cpu") -> torch.nn.Module:
        """Rebuild the model recorded in a checkpoint and load its weights (eval mode)."""
        config = {**DEFAULTS, **read_metadata(checkpoint_dir).get("config", {})}
        return load_model(checkpoint_dir, digits_model(int(config["hidden_size"])), map_location=map_location)
