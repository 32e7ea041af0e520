"""PBT's new learning rate under every LR scheduler torch ships: the schedule goes on as if built at it."""

from __future__ import annotations

import pytest
import torch
from torch.optim import lr_scheduler as lrs

from tunekit import ConfigError, TrainingState, apply_hyperparameters
from tunekit.trial.hparams import put_learning_rate

TOTAL = 40


def _warmup_cosine(opt: torch.optim.Optimizer, lr: float) -> lrs.LRScheduler:
    warm = lrs.LinearLR(opt, start_factor=0.1, total_iters=5)
    decay = lrs.CosineAnnealingLR(opt, T_max=TOTAL - 5)
    return lrs.SequentialLR(opt, [warm, decay], milestones=[5])


# Each factory builds a schedule for an optimizer whose config rate is ``lr``,
# the way a user would build it from config["lr"].
SCHEDULES = {
    "StepLR": lambda opt, lr: lrs.StepLR(opt, step_size=7, gamma=0.5),
    "MultiStepLR": lambda opt, lr: lrs.MultiStepLR(opt, milestones=[6, 15, 30], gamma=0.3),
    "ExponentialLR": lambda opt, lr: lrs.ExponentialLR(opt, gamma=0.93),
    "LambdaLR": lambda opt, lr: lrs.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 8) * 0.97 ** step),
    "CosineAnnealingLR": lambda opt, lr: lrs.CosineAnnealingLR(opt, T_max=TOTAL),
    "LinearLR": lambda opt, lr: lrs.LinearLR(opt, start_factor=0.05, end_factor=1.0, total_iters=12),
    "PolynomialLR": lambda opt, lr: lrs.PolynomialLR(opt, total_iters=TOTAL, power=2.0),
    "OneCycleLR": lambda opt, lr: lrs.OneCycleLR(opt, max_lr=lr, total_steps=TOTAL + 1, cycle_momentum=False),
    "CyclicLR": lambda opt, lr: lrs.CyclicLR(opt, base_lr=lr / 10, max_lr=lr, step_size_up=6, cycle_momentum=False),
    "CosineAnnealingWarmRestarts": lambda opt, lr: lrs.CosineAnnealingWarmRestarts(opt, T_0=9, T_mult=2),
    "SequentialLR": _warmup_cosine,
    "ChainedScheduler": lambda opt, lr: lrs.ChainedScheduler(
        [lrs.LinearLR(opt, start_factor=0.2, total_iters=6), lrs.ExponentialLR(opt, gamma=0.95)]),
    "ReduceLROnPlateau": lambda opt, lr: lrs.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=2),
}

#: A loss that plateaus, so that ReduceLROnPlateau reduces the rate now and then.
PLATEAU = [1.0 / (1 + (i // 5)) for i in range(TOTAL + 5)]


def _trial(name: str, lr: float, seed: int = 0) -> TrainingState:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return TrainingState(models={"model": model}, optimizers={"opt": opt},
                         schedulers={"sched": SCHEDULES[name](opt, lr)})


def _step(state: TrainingState, step: int) -> float:
    state.optimizer.step()
    scheduler = state.schedulers["sched"]
    if isinstance(scheduler, lrs.ReduceLROnPlateau):
        scheduler.step(PLATEAU[step])
    else:
        scheduler.step()
    return state.optimizer.param_groups[0]["lr"]


@pytest.mark.parametrize("at", [1, 4, 11, 23])
@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_a_clone_follows_the_schedule_built_at_the_new_rate(name, at):
    donor_lr, target_lr, new_lr = 0.05, 0.003, 0.0217
    donor = _trial(name, donor_lr)
    for step in range(at):
        _step(donor, step)
    sd = donor.state_dict()
    sd["hparams"] = {"lr": donor_lr}  # as tunekit saves it: the config values the state was built at

    # The target's own objects (built at its own rate) take the donor's state,
    # then PBT's new rate, as a TorchTrainable's exploit does.
    target = _trial(name, target_lr, seed=1)
    target.load_state_dict(sd)
    apply_hyperparameters(target, {"lr": new_lr})

    reference = _trial(name, new_lr)  # the same schedule, built at the new rate
    for step in range(at):
        _step(reference, step)
    assert target.optimizer.param_groups[0]["lr"] == pytest.approx(
        reference.optimizer.param_groups[0]["lr"], rel=1e-9)
    for step in range(at, TOTAL):
        assert _step(target, step) == pytest.approx(_step(reference, step), rel=1e-9), f"{name}: step {step + 1}"


def test_without_a_schedule_the_new_rate_is_exact():
    state = _trial("StepLR", 0.1)
    state.schedulers = {}
    state.hparams = {"lr": 0.1}
    apply_hyperparameters(state, {"lr": 0.0123, "momentum": 0.5})
    group = state.optimizer.param_groups[0]
    assert (group["lr"], group["momentum"]) == (0.0123, 0.5)


def test_a_scheduler_tunekit_cannot_rescale_is_refused_in_one_line():
    class Custom:  # not one of torch's schedulers
        def __init__(self, optimizer):
            self.optimizer = optimizer

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="cannot put a new rate in effect under Custom") as info:
        put_learning_rate([opt], [Custom(opt)], 0.2, previous=0.1)
    assert "\n" not in str(info.value)
    assert opt.param_groups[0]["lr"] == 0.1  # nothing changed
