"""The anchor of the PBT benchmark: a plain Ray Tune trainable doing tunekit's digits training.

What a Ray Tune user writes without tunekit: a ``tune.Trainable`` with the
same model, optimizer, batches and evaluation as
``tunekit.trainables.DigitsTrainable``, checkpoints written with
``torch.save`` (model and optimizer) and read with
``torch.load(weights_only=True)``, and a ``reset_config`` that only sets the
new ``lr`` and ``momentum`` (so ``reuse_actors=True`` works). It has none of
tunekit's guarantees (no RNG streams or data position in the checkpoint, no
manifest, no rebuild on reuse).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from ray import tune
from torch import nn

from tunekit.trainables.digits import DEFAULTS, digits_model, digits_on_device

__all__ = ["PlainDigits"]


class PlainDigits(tune.Trainable):
    def setup(self, config: dict[str, Any]) -> None:
        cfg = {**DEFAULTS, **config}
        torch.manual_seed(cfg["seed"])
        self.data = digits_on_device(torch.device("cpu"))
        self.model = digits_model(cfg["hidden_size"])
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"],
                                         weight_decay=cfg["weight_decay"])
        self.batch_size, self.steps = cfg["batch_size"], cfg["steps_per_iteration"] or 21

    def step(self) -> dict[str, float]:
        x, y = self.data.x_train, self.data.y_train
        self.model.train()
        losses = []
        for _ in range(self.steps):
            idx = torch.randint(0, len(x), (self.batch_size,))
            xb, yb = x[idx], y[idx]
            loss = nn.functional.cross_entropy(self.model(xb + torch.randn(xb.shape) * 0.01), yb)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            losses.append(loss.detach())
        with torch.no_grad():
            self.model.eval()
            logits = self.model(self.data.x_val)
            accuracy = float((logits.argmax(dim=1) == self.data.y_val).float().mean())
            val_loss = float(nn.functional.cross_entropy(logits, self.data.y_val))
        return {"train_loss": float(torch.stack(losses).mean()), "loss": val_loss, "accuracy": accuracy}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()},
                   os.path.join(checkpoint_dir, "state.pt"))

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        state = torch.load(os.path.join(checkpoint_dir, "state.pt"), weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # the (possibly mutated) config wins
            group["lr"], group["momentum"] = self.config["lr"], self.config.get("momentum", DEFAULTS["momentum"])

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        for group in self.optimizer.param_groups:
            group["lr"], group["momentum"] = new_config["lr"], new_config.get("momentum", DEFAULTS["momentum"])
        self.config = new_config
        return True
