"""The toy problem of the PBT paper (Jaderberg et al. 2017, section 4.1, figure 2).

Maximise ``Q(theta) = 1.2 - (theta0^2 + theta1^2)`` by gradient ascent on the
surrogate ``Q^(theta | h) = 1.2 - (h0 * theta0^2 + h1 * theta1^2)``, from
``theta = (0.9, 0.9)``, with a population of two: ``h = (1, 0)`` and ``h = (0, 1)``.
Each member alone only ever shrinks one coordinate, so its Q stays near
``1.2 - 0.81 = 0.39``; with exploit (copy the better member's theta and h) and
explore (perturb h), the population reaches ``Q ~ 1.2``.

``ToyPBT`` is a :class:`tunekit.TorchTrainable`: theta is its model, SGD its
optimizer, and ``h`` is read from the config at every step, so PBT's explore
takes effect as soon as the trial continues.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from tunekit import TorchTrainable, TrainingState

__all__ = ["ToyPBT", "explore_h", "true_q"]

THETA0 = (0.9, 0.9)


class _Theta(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(torch.tensor(THETA0, dtype=torch.float64))


def true_q(theta: torch.Tensor) -> float:
    """The objective the population is judged by."""
    return float(1.2 - (theta**2).sum())


class ToyPBT(TorchTrainable):
    """One member of the toy population; config: ``h`` (two floats), ``lr`` (step size)."""

    def build(self, config: dict[str, Any]) -> TrainingState:
        h = config.get("h")
        if not (isinstance(h, (list, tuple)) and len(h) == 2):
            raise ValueError(f"ToyPBT(config h={h!r}): expected two numbers")
        model = _Theta()
        optimizer = torch.optim.SGD(model.parameters(), lr=float(config.get("lr", 0.05)))
        return TrainingState(models={"theta": model}, optimizers={"sgd": optimizer})

    def train_iteration(self) -> dict[str, Any]:
        theta = self.state.models["theta"].theta
        h = torch.tensor([float(v) for v in self.config["h"]], dtype=torch.float64)
        surrogate = 1.2 - (h * theta**2).sum()
        optimizer = self.state.optimizers["sgd"]
        optimizer.zero_grad()
        (-surrogate).backward()  # ascent on Q^
        optimizer.step()
        with torch.no_grad():
            return {"Q": true_q(theta), "surrogate": float(1.2 - (h * theta**2).sum()),
                    "theta0": float(theta[0]), "theta1": float(theta[1])}


def explore_h(config: dict[str, Any]) -> dict[str, Any]:
    """PBT's explore step of the paper: perturb h with Gaussian noise (sd 0.1)."""
    config = dict(config)
    config["h"] = [float(v) + random.gauss(0.0, 0.1) for v in config["h"]]
    return config
