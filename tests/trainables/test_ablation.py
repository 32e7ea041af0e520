"""The bit-exact check is sharp: leaving one piece of state out of the checkpoint breaks it."""

from __future__ import annotations

import pytest

from tunekit.testing import tensors_equal
from tunekit import read_state
from tunekit.trial.state import TrainingState
from tunekit.trainables import DigitsTrainable

CONFIG = {"lr": 0.05, "momentum": 0.9, "hidden_size": 16, "batch_size": 32, "seed": 7, "steps_per_iteration": 7}


def _resume_run(tmp_path, name):
    """In-process: 4 iterations straight vs 2 + checkpoint + new trainable + 2."""
    full = DigitsTrainable(config=CONFIG)
    for _ in range(4):
        full.train()
    a = full.save(str(tmp_path / f"{name}-full"))
    first = DigitsTrainable(config=CONFIG)
    for _ in range(2):
        first.train()
    half = str(tmp_path / f"{name}-half")
    first.save(half)
    second = DigitsTrainable(config=CONFIG)
    second.restore(half)
    for _ in range(2):
        second.train()
    b = second.save(str(tmp_path / f"{name}-resumed"))
    sa, sb = read_state(a.checkpoint.path), read_state(b.checkpoint.path)
    return tensors_equal(sa["models"], sb["models"]) + tensors_equal(sa["optimizers"], sb["optimizers"])


def test_complete_state_resumes_bit_exactly(tmp_path):
    assert _resume_run(tmp_path, "complete") == []


@pytest.mark.parametrize("piece", ["rng", "optimizers", "data"])
def test_leaving_out_a_piece_breaks_bit_exactness(tmp_path, monkeypatch, piece):
    original_load = TrainingState.load_state_dict

    def load_without(self, sd, **kw):
        # As if `piece` had never been saved: the restored run keeps its fresh value.
        if piece == "rng":
            return original_load(self, sd, restore_rngs=False)
        stripped = dict(sd)
        if piece == "optimizers":
            fresh = {k: o.state_dict() for k, o in self.optimizers.items()}
            stripped["optimizers"] = fresh
        if piece == "data":
            stripped["data"] = None
        return original_load(self, stripped, **kw)

    monkeypatch.setattr(TrainingState, "load_state_dict", load_without)
    assert _resume_run(tmp_path, piece) != []
