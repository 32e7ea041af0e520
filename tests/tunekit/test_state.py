from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tunekit.testing import tensors_equal
from tunekit import (
    CheckpointError,
    ConfigError,
    ShuffledBatches,
    TrainingState,
    capture_rng,
    read_state,
    restore_rng,
    seed_everything,
    write_checkpoint,
)


def _draws():
    return (random.random(), float(np.random.rand()), float(torch.rand(1)))


def test_rng_capture_restore_replays_every_stream():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    state = capture_rng()
    first = [_draws() for _ in range(3)]
    restore_rng(state)
    assert [_draws() for _ in range(3)] == first


def test_each_capture_holds_the_python_state_of_its_moment():
    # The Python stream's tensor is built again only when the state changed (saves of a loop that never draws
    # from ``random`` share one): a draw between two captures must still give each its own state.
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    before = capture_rng()
    again = capture_rng()
    assert torch.equal(before["python"]["state"], again["python"]["state"])
    first = _draws()
    after = capture_rng()
    assert not torch.equal(before["python"]["state"], after["python"]["state"])
    second = _draws()
    restore_rng(before)
    assert _draws() == first
    restore_rng(after)
    assert _draws() == second
    random.seed(5)  # back to the state ``before`` holds: captured again, equal to it
    assert torch.equal(capture_rng()["python"]["state"], before["python"]["state"])


def test_rng_state_from_before_the_python_stream_was_one_tensor_restores():
    # Checkpoints written before 2026-11-28 hold Python's Mersenne Twister state as a list of 625 ints.
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    state = capture_rng()
    assert isinstance(state["python"]["state"], torch.Tensor)
    old = {**state, "python": {**state["python"], "state": state["python"]["state"].tolist()}}
    first = [_draws() for _ in range(3)]
    restore_rng(old)
    assert [_draws() for _ in range(3)] == first


def test_seed_everything_seeds_every_stream_as_each_library_seeds_it():
    random.seed(11), np.random.seed(11), torch.manual_seed(11)
    expected = [_draws() for _ in range(3)]
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    seed_everything(11)
    assert [_draws() for _ in range(3)] == expected


def test_batches_resume_at_the_next_batch_even_across_epochs():
    x = torch.arange(10.0).unsqueeze(1)
    a = ShuffledBatches(x, batch_size=3, seed=5)
    for _ in range(3):
        a.next_batch()
    saved = a.state_dict()
    expected = [a.next_batch()[0].tolist() for _ in range(5)]  # crosses the epoch boundary
    b = ShuffledBatches(x, batch_size=3, seed=5)
    b.load_state_dict(saved)
    assert [b.next_batch()[0].tolist() for _ in range(5)] == expected
    assert a.epoch == 1


def test_batch_size_change_keeps_the_sample_offset():
    x = torch.arange(12.0)
    a = ShuffledBatches(x, batch_size=4, seed=0)
    first = a.next_batch()[0]
    a.batch_size = 2
    nxt = a.next_batch()[0]
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    assert first.tolist() == x[perm[:4]].tolist() and nxt.tolist() == x[perm[4:6]].tolist()


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_batch_size_is_refused(bad):
    with pytest.raises(ConfigError, match=r"ShuffledBatches\(batch_size="):
        ShuffledBatches(torch.zeros(3), batch_size=bad)


def test_state_requires_models():
    with pytest.raises(ConfigError, match="non-empty dict"):
        TrainingState(models={})
    with pytest.raises(ConfigError, match=r"models\['m'\]"):
        TrainingState(models={"m": "not a module"})


@pytest.mark.parametrize("parts, named", [
    ({"schedulers": {"s": "cosine"}}, r"TrainingState\(schedulers\['s'\]\): expected an object with state_dict"),
    ({"data": [1, 2, 3]}, r"TrainingState\(data\): expected an object with state_dict\(\) and load_state_dict"),
    ({"counters": {"iteration": 3}}, r"TrainingState\(counters=...\): expected a tunekit.trial.state.Counters, got dict"),
    ({"extras": {"f": lambda: 1}}, r"TrainingState\(extras\['f'\]\): cannot be saved in a checkpoint"),
    ({"optimizers": "list"}, r"TrainingState\(optimizers=...\): expected a dict of name -> object, got list"),
], ids=["scheduler", "data", "counters", "extras", "optimizers"])
def test_a_part_that_cannot_be_saved_is_refused_when_the_state_is_built(parts, named):
    """Said in one line where the state is built, not after an iteration at the trial's first save."""
    model = torch.nn.Linear(2, 1)
    if parts.get("optimizers") == "list":
        parts = {"optimizers": [torch.optim.SGD(model.parameters(), lr=0.1)]}
    with pytest.raises(ConfigError, match=named) as refused:
        TrainingState(models={"m": model}, **parts)
    assert "\n" not in str(refused.value)
    TrainingState(models={"m": model}, extras={"n": 1, "t": torch.ones(2), "l": [1.0, "a"]})  # plain data: fine


def _state(device="cpu"):
    model = torch.nn.Linear(4, 2).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 4, device=device)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    sched.step()
    return TrainingState(models={"m": model}, optimizers={"o": opt}, schedulers={"s": sched})


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("save_on", DEVICES)
@pytest.mark.parametrize("load_on", DEVICES)
def test_checkpoint_saved_on_one_device_loads_on_another(tmp_path, save_on, load_on):
    src = _state(save_on)
    write_checkpoint(tmp_path, src.state_dict())
    raw = torch.load(tmp_path / "state.pt", weights_only=True)  # device-independent file
    flat = [t for g in ("models", "optimizers") for t in _tensors(raw[g])]
    assert flat and all(t.device.type == "cpu" for t in flat)
    dst = _state(load_on)
    dst.load_state_dict(read_state(tmp_path))
    assert all(p.device.type == load_on for p in dst.model.parameters())
    assert tensors_equal(to_cpu_sd(dst), to_cpu_sd(src)) == []
    assert dst.schedulers["s"].get_last_lr() == src.schedulers["s"].get_last_lr()


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def to_cpu_sd(state):
    sd = state.state_dict()
    return {"models": sd["models"], "optimizers": sd["optimizers"]}


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_checkpoint_needing_unpickling_is_refused(tmp_path):
    write_checkpoint(tmp_path, {"format": "x", "payload": Evil()})
    with pytest.raises(CheckpointError, match="arbitrary unpickling"):
        read_state(tmp_path)


def test_state_of_another_layout_is_refused(tmp_path):
    write_checkpoint(tmp_path, _state().state_dict())
    other = TrainingState(models={"other": torch.nn.Linear(4, 2)})
    with pytest.raises(CheckpointError, match="checkpoint has models"):
        other.load_state_dict(read_state(tmp_path))
