"""tunekit.trial._checkpointer: what a trial's checkpoint holds (TrialContent) and how it is loaded back.

The save/restore protocol of TrialCheckpointer runs inside Ray's trainables: it is
exercised through both of them by tests/trainables/test_contract.py and
tests/tunekit/test_two_phase.py. These tests cover the value both trainables hand it.
"""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest
import torch

from tests.support.faults import flip_byte
from tunekit import CheckpointError
from tunekit.trial._checkpointer import TrialContent
from tunekit.checkpoint import read_metadata
from tunekit.trial.state import StateBuffers
from tunekit.trainables.digits import build_digits_state, train_steps


def _content(config, applied=None):
    state = build_digits_state({"seed": 1, "hidden_size": 8, **config}, torch.device("cpu"))
    apply = applied.append if applied is not None else (lambda changed: pytest.fail(f"applied {changed}"))
    return TrialContent(state, config, ("lr", "momentum"), apply, "tests:Trainable")


def _weights(content):
    return {k: v.clone() for k, v in content.state.models["model"].state_dict().items()}


def test_written_content_loads_back_bit_exact_with_its_metadata(tmp_path):
    saved = _content({"lr": 0.1})
    train_steps(saved.state, 3)
    saved.state.counters.iteration = 3
    saved.metrics = {"loss": 0.5}
    saved.write(tmp_path / "ckpt")
    metadata = read_metadata(str(tmp_path / "ckpt"))
    assert (metadata["iteration"], metadata["trainable"], metadata["hparams"], metadata["metrics"]) == (
        3, "tests:Trainable", {"lr": 0.1}, {"loss": 0.5})

    at_save = _weights(saved)
    train_steps(saved.state, 2)  # goes on from the checkpoint (data stream and RNG streams included)
    went_on = _weights(saved)

    fresh = _content({"lr": 0.1})
    assert fresh.load(tmp_path / "ckpt") == {}  # same hyperparameters: nothing to apply
    assert fresh.state.counters.iteration == 3 and fresh.metrics == {"loss": 0.5}
    assert all(torch.equal(at_save[k], v) for k, v in _weights(fresh).items())
    train_steps(fresh.state, 2)  # a resume goes on identically
    assert all(torch.equal(went_on[k], v) for k, v in _weights(fresh).items())


def test_a_mutated_config_wins_over_the_checkpoints_hyperparameters(tmp_path):
    donor = _content({"lr": 0.1, "momentum": 0.9})
    donor.write(tmp_path / "ckpt")
    applied = []
    clone = _content({"lr": 0.02, "momentum": 0.9}, applied)  # a PBT exploit mutated lr
    assert clone.load(tmp_path / "ckpt") == {"lr": 0.02}
    assert applied == [{"lr": 0.02}]


def test_a_snapshot_payload_is_the_state_at_snapshot_time(tmp_path):
    content = _content({"lr": 0.1})
    buffers = StateBuffers()
    sd, metadata = content.payload(into=buffers)
    buffers.wait_copied()
    before = {k: v.clone() for k, v in sd["models"]["model"].items()}
    train_steps(content.state, 2)  # training goes on; the snapshot does not change
    assert all(torch.equal(before[k], sd["models"]["model"][k]) for k in before)
    assert metadata["iteration"] == 0 and metadata["hparams"] == {"lr": 0.1}


def test_loading_a_damaged_checkpoint_fails_and_leaves_no_metrics_behind(tmp_path):
    content = _content({"lr": 0.1})
    content.write(tmp_path / "ckpt")
    flip_byte(pafs.LocalFileSystem(), str(tmp_path / "ckpt"), "state.pt")
    fresh = _content({"lr": 0.1})
    with pytest.raises(CheckpointError):
        fresh.load(tmp_path / "ckpt")
    assert fresh.metrics is None
