"""Trainables that each break bit-exact resume in one way, for ``tunekit check`` (tests/tunekit/test_check.py)."""

from __future__ import annotations

import random

import numpy as np
import torch

from tunekit import FunctionSession, TorchTrainable, TrainingState


class _Base(TorchTrainable):
    """A tiny model trained on a fixed problem; the subclasses add one thing outside the saved state."""

    def build(self, config):
        torch.manual_seed(config.get("seed", 0))
        model = torch.nn.Linear(4, 1)
        self.x, self.y = torch.randn(16, 4), torch.randn(16, 1)
        self.setup_extra()
        return TrainingState(models={"m": model}, optimizers={"sgd": torch.optim.SGD(model.parameters(), lr=0.1)})

    def setup_extra(self):
        pass

    def extra(self) -> float:
        return 0.0

    def train_iteration(self):
        model, opt = self.state.models["m"], self.state.optimizers["sgd"]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(self.x), self.y) + self.extra()
        loss.backward()
        opt.step()
        return {"loss": float(loss)}


class Resumable(_Base):
    """Everything that changes is in the state: passes."""


class ExtraTensor(_Base):
    """A tensor kept as an attribute, updated every iteration, outside the state."""

    def setup_extra(self):
        self.drift = torch.zeros(3)

    def extra(self):
        self.drift += 0.25
        return float(self.drift.sum())


class PrivateRandom(_Base):
    """A private random.Random seeded once, never saved."""

    def setup_extra(self):
        self.noise = random.Random(7)

    def extra(self):
        return self.noise.random()


class NumpyGenerator(_Base):
    """A numpy Generator attribute, never saved."""

    def setup_extra(self):
        self.gen = np.random.default_rng(7)

    def extra(self):
        return float(self.gen.normal())


class IteratorOutside(_Base):
    """Batches from an iterator kept as an attribute: it starts over when resumed."""

    def setup_extra(self):
        self.batches = iter(range(10_000))

    def extra(self):
        return next(self.batches) * 0.01


class Nondeterministic(_Base):
    """Noise from the operating system: two uninterrupted runs differ."""

    def extra(self):
        # (large enough that two runs' float32 losses never round to the same value: at 1e-6 they did, 1 in 4)
        return random.SystemRandom().random()


def _counting():
    calls = [0]

    def train_counted(config):
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        state = TrainingState(models={"m": model})
        session = FunctionSession(state, config=config, name="tests.tunekit.check_gallery:train_counted")
        while True:
            calls[0] += 1  # a counter in the closure: not in the state
            session.report({"calls": calls[0], "w": float(model.weight.sum())})

    return train_counted


train_counted = _counting()


def train_silent(config):
    """A training function that returns without reporting anything."""
    return None
