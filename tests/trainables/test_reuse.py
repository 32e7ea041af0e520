"""A worker reused through ``reset_config`` trains exactly like a fresh one.

Tune's ``reuse_actors=True`` (PBT's default in tunekit) runs a trial, or a
resumed one, in a worker that ran another trial before. Only what a trainable
declares reusable may survive; everything else must be rebuilt, so the final
state is bit-identical to a fresh worker's for the same config and checkpoint.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import ray
import torch

from tests.support.contract import end_actor, make_actor
from tunekit.testing import tensors_equal
from tunekit import TorchTrainable, read_state
from tunekit.trial.reuse import reusable_slot
from tunekit.trainables import DigitsTrainable, TrainDigits
from tunekit.trainables.digits import build_digits_state, digits_on_device, evaluate, train_steps

BASE = {"lr": 0.05, "momentum": 0.9, "hidden_size": 16, "batch_size": 32, "steps_per_iteration": 5}
DONOR = {**BASE, "seed": 3}  # the trial whose checkpoint is restored (a PBT donor)
OTHER = {**BASE, "seed": 11, "lr": 0.2, "batch_size": 16}  # the trial that ran in the worker before
TARGET = {**DONOR, "lr": 0.01}  # the donor's config with a mutated lr


class KeyedBuffers(TorchTrainable):
    """A trainable with its own reuse hook: the dataset plus a buffer keyed by ``batch_size``."""

    reusable_keys = ("batch_size",)

    def build_reusable(self, config: dict[str, Any]) -> dict[str, Any]:
        return {"data": digits_on_device(self.device), "buffer": torch.zeros(config["batch_size"], 64)}

    def build(self, config):
        return build_digits_state(config, self.device, self.reusable["data"])

    def train_iteration(self):
        loss = train_steps(self.state, self.config["steps_per_iteration"])
        return {"train_loss": loss, **evaluate(self.state.model, self.device, self.reusable["data"])}

    def reusable_builds(self) -> int:
        return self._reusable_slot.builds


def _builds(actor, trainable) -> int:
    if trainable is TrainDigits:
        return ray.get(actor.execute.remote(lambda _: reusable_slot("tunekit.trainables.digits").builds))
    if trainable is KeyedBuffers:
        return ray.get(actor.reusable_builds.remote())
    return -1  # DigitsTrainable: no way to ask; KeyedBuffers checks the class hook


def _reset(actor, config, storage, trial) -> bool:
    """What Tune does to reuse a worker for another trial: ``Trainable.reset`` (config, storage)."""
    from tunekit._ray import storage_context

    return ray.get(actor.reset.remote(dict(config), storage_context(str(storage), "exp", trial)))


def _train_and_save(actor, iterations: int):
    for _ in range(iterations):
        ray.get(actor.train.remote())
    return ray.get(actor.save.remote())


@pytest.mark.parametrize("trainable", [DigitsTrainable, TrainDigits, KeyedBuffers], ids=["class", "function", "hook"])
def test_a_reused_worker_ends_bit_identical_to_a_fresh_one(ray_session, storage, trainable):
    donor = make_actor(trainable, DONOR, storage, "donor")
    try:
        checkpoint = _train_and_save(donor, 2)
    finally:
        end_actor(donor)

    # A worker that ran another trial, then takes the target trial (reset + restore, as Tune does).
    reused = make_actor(trainable, OTHER, storage, "reused")
    try:
        new_in_fresh = _train_and_save(reused, 2)  # OTHER in a fresh worker: the reference for the end
        assert _reset(reused, TARGET, storage, "target")
        ray.get(reused.restore.remote(checkpoint))
        from_reused = _train_and_save(reused, 3)
        # And a brand-new trial in the same worker (no checkpoint) after that.
        assert _reset(reused, OTHER, storage, "other_again")
        new_in_reused = _train_and_save(reused, 2)
        builds = _builds(reused, trainable)
    finally:
        end_actor(reused)

    fresh = make_actor(trainable, TARGET, storage, "fresh")
    try:
        ray.get(fresh.restore.remote(checkpoint))
        from_fresh = _train_and_save(fresh, 3)
    finally:
        end_actor(fresh)
    for a_result, b_result in ((from_reused, from_fresh), (new_in_reused, new_in_fresh)):
        a, b = read_state(a_result.checkpoint.path), read_state(b_result.checkpoint.path)
        for part in ("models", "optimizers", "data", "rng", "hparams"):
            assert tensors_equal(a[part], b[part]) == [], part
        assert a["counters"] == b["counters"]
    assert read_state(from_reused.checkpoint.path)["counters"]["iteration"] == 5
    assert read_state(from_reused.checkpoint.path)["optimizers"]["optimizer"]["param_groups"][0]["lr"] == 0.01

    if trainable is KeyedBuffers:
        # OTHER (batch 16) -> TARGET (batch 32) -> OTHER (batch 16): the keyed buffer is rebuilt each time.
        assert builds == 3
    elif trainable is TrainDigits:
        assert builds == 1  # the dataset on the device was built once for three trials


def test_reusable_is_rebuilt_only_when_its_keys_change():
    from tunekit import reusable

    built = []

    def build():
        built.append(1)
        return object()

    first = reusable("test.keyed", {"batch_size": 32, "lr": 0.1}, ("batch_size",), build)
    assert reusable("test.keyed", {"batch_size": 32, "lr": 0.5}, ("batch_size",), build) is first
    assert reusable("test.keyed", {"batch_size": 64, "lr": 0.5}, ("batch_size",), build) is not first
    assert reusable("test.other", {"batch_size": 64}, ("batch_size",), build) is not first
    assert len(built) == 3


@pytest.mark.parametrize("config, keys, message", [
    ({"shape": [1, 2]}, ("shape",), "config['shape']=[1, 2] is not hashable"),
    ({"batch_size": 1}, "batch_size", "must be a tuple of config key names"),
])
def test_reusable_keys_are_checked(config, keys, message):
    from tunekit import ConfigError, reusable

    with pytest.raises(ConfigError, match=re.escape(message)):
        reusable("test.bad", config, keys, object)
