"""tunekit.warm_start: what each mode loads, and the one-line errors for bad input (no Ray needed)."""

from __future__ import annotations

import pytest
import torch

from tunekit import CheckpointError, ConfigError, TrainingState, warm_start, write_checkpoint
from tunekit.trial.warm import LINEAGE_KEY, WARM_START_KEY, apply_warm_start


def _state(seed: int, width: int = 3) -> TrainingState:
    torch.manual_seed(seed)
    model = torch.nn.Linear(width, 1)
    return TrainingState(models={"model": model},
                         optimizers={"sgd": torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)})


def _trained_checkpoint(tmp_path, steps: int = 3):
    state = _state(0)
    for _ in range(steps):
        state.optimizer.zero_grad()
        state.model(torch.ones(4, 3)).sum().backward()
        state.optimizer.step()
        state.counters.iteration += 1
    sd = state.state_dict()
    sd["hparams"] = {"lr": 0.1}
    path = tmp_path / "checkpoint_000002"
    write_checkpoint(path, sd, metadata={"iteration": steps})
    return path, state


def _never(changed):
    raise AssertionError(f"nothing should be applied: {changed}")


def test_weights_mode_loads_weights_only_with_a_fresh_optimizer(tmp_path):
    path, trained = _trained_checkpoint(tmp_path)
    fresh = _state(1)
    started = apply_warm_start(fresh, warm_start(path, mode="weights"), mutable=("lr",), apply=_never)
    assert started == 0 and fresh.counters.iteration == 0
    assert torch.equal(fresh.model.weight, trained.model.weight)
    assert fresh.optimizer.state_dict()["state"] == {}  # no momentum carried over
    assert fresh.extras[LINEAGE_KEY] == {"checkpoint": str(path), "mode": "weights", "iteration": 3}


def test_continue_mode_loads_everything_and_applies_changed_hyperparameters(tmp_path):
    path, trained = _trained_checkpoint(tmp_path)
    fresh = _state(1)
    applied = []
    config = {"lr": 0.02, **warm_start(path, mode="continue")}
    started = apply_warm_start(fresh, config, mutable=("lr",), apply=applied.append)
    assert started == 3 and fresh.counters.iteration == 3
    momentum = fresh.optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(momentum, trained.optimizer.state_dict()["state"][0]["momentum_buffer"])
    assert applied == [{"lr": 0.02}]


def test_a_warm_start_of_a_warm_started_checkpoint_keeps_the_chain(tmp_path):
    path, _ = _trained_checkpoint(tmp_path)
    second = _state(1)
    apply_warm_start(second, warm_start(path, mode="continue"), mutable=(), apply=_never)
    write_checkpoint(tmp_path / "checkpoint_000009", second.state_dict())
    third = _state(2)
    apply_warm_start(third, warm_start(tmp_path / "checkpoint_000009", mode="weights"), mutable=(), apply=_never)
    assert third.extras[LINEAGE_KEY]["before"]["checkpoint"] == str(path)


def test_bad_input_gets_one_line_errors_naming_it(tmp_path):
    path, _ = _trained_checkpoint(tmp_path)
    with pytest.raises(ConfigError, match=r"warm_start\(mode='all'\): expected 'continue'"):
        warm_start(path, mode="all")
    missing = tmp_path / "nowhere"
    with pytest.raises(CheckpointError, match=f"warm start from {missing}: no such directory"):
        warm_start(missing, mode="weights")
    plain = tmp_path / "plain"
    plain.mkdir()
    torch.save({"model": 1}, plain / "model.pt")
    with pytest.raises(CheckpointError, match=f"warm start from {plain}: not a tunekit checkpoint"):
        warm_start(plain, mode="weights")
    with pytest.raises(ConfigError, match=f"config\\['{WARM_START_KEY}'\\]"):
        apply_warm_start(_state(0), {WARM_START_KEY: str(path)}, mutable=(), apply=_never)
    wider = _state(0, width=5)  # a different model: the error says which checkpoint did not fit
    with pytest.raises(CheckpointError, match=f"warm start from {path} \\(weights\\): model 'model' does not fit the "
                       "Linear given .*weight \\(1, 3\\) vs \\(1, 5\\)") as misfit:
        apply_warm_start(wider, warm_start(path, mode="weights"), mutable=(), apply=_never)
    assert "\n" not in str(misfit.value) and "size mismatch" not in str(misfit.value)  # one line, not torch's
    for error in (ConfigError, CheckpointError):
        try:
            warm_start(missing if error is CheckpointError else path, mode="x" if error is ConfigError else "weights")
        except error as exc:
            assert "\n" not in str(exc)
