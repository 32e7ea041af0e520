"""A tiny TorchTrainable that reports a scripted metric: exact, fast checkpoint tests."""

from __future__ import annotations

import time

import torch

from tunekit import TorchTrainable, TrainingState


class ScriptedTrainable(TorchTrainable):
    """Reports ``score = config["scores"][i]`` (cycling); sleeps ``config["sleep"]`` per iteration."""

    def build(self, config):
        model = torch.nn.Linear(2, 1).to(self.device)
        return TrainingState(models={"model": model}, optimizers={"opt": torch.optim.SGD(model.parameters(), lr=0.1)})

    def train_iteration(self):
        time.sleep(self.config.get("sleep", 0.0))
        scores = self.config.get("scores", [0.0])
        i = self.state.counters.iteration
        loss = self.state.model(torch.ones(1, 2)).pow(2).sum()
        self.state.optimizer.zero_grad()
        loss.backward()
        self.state.optimizer.step()
        return {"score": float(scores[i % len(scores)]), "loss": float(loss)}


class TickClock:
    """A clock that advances one second per call (deterministic CheckpointByTime tests)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now
