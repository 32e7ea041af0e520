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

:func:`run_toy_problem` runs the experiment the paper describes: PBT with
the members ready every 4 steps, exploit = copy the better member (theta,
h and step size), explore = add Gaussian noise (sd 0.2) to h, 120 steps.
It uses Ray's asynchronous PBT (Ray 2.60's synchronous PBT stops making
progress here after a few perturbations, with a plain ``tune.Trainable``
too: both members paused, none resumed). Asynchronous PBT only exploits when
one member is strictly worse, and the paper's two members are exactly
symmetric (equal Q at every step), so the members' step sizes differ a
little (0.2 and 0.19) to break the tie. A pure-Python simulation of the
synchronous schedule reaches ``Q >= 1.19`` in 5000 of 5000 seeds; without
exploit/explore the best member stays at ``1.2 - 0.81 = 0.39``.
Run it as an example::

    python -m tunekit.trainables.toy_pbt            # PBT against no PBT, same budget
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sys
import tempfile
from typing import Any

import torch

from tunekit import TorchTrainable, TrainingState
from tunekit.errors import ConfigError

__all__ = ["ToyPBT", "explore_h", "main", "run_toy_problem", "true_q"]

THETA0 = (0.9, 0.9)
STEP_SIZES = (0.2, 0.19)  # member 0, member 1 (distinct: breaks the tie)
STEP_SIZE = STEP_SIZES[0]
EXPLORE_SD = 0.2
READY_EVERY = 4  # steps between exploit/explore (the paper's "ready")
BUDGET = 120  # gradient steps per member
TARGET_Q = 1.19


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
            raise ConfigError(f"ToyPBT(config h={h!r}): expected two numbers")
        model = _Theta()
        optimizer = torch.optim.SGD(model.parameters(), lr=float(config.get("lr", STEP_SIZE)))
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


def explore_h(config: dict[str, Any], rng: random.Random | None = None) -> dict[str, Any]:
    """PBT's explore step of the paper: perturb h with Gaussian noise (sd ``EXPLORE_SD``).

    ``rng``: where the noise comes from (default: the ``random`` module).

    >>> explore_h({"h": [1.0, 0.0]}, random.Random(0))["h"] != [1.0, 0.0]
    True
    """
    config = dict(config)
    gauss = (rng or random).gauss
    config["h"] = [float(v) + gauss(0.0, EXPLORE_SD) for v in config["h"]]
    return config


def run_toy_problem(storage_path: str, *, pbt: bool, name: str | None = None, steps: int = BUDGET,
                    one_slot: bool = False, seed: int | None = None) -> float:
    """Run the population of two for ``steps`` steps; return the best Q any member reached.

    ``pbt=False`` runs the same two members with the same budget and no
    scheduler (no exploit, no explore). ``one_slot=True``: each member asks
    for all of the cluster's CPUs, so the two time-share one slot (pause,
    resume) instead of running side by side. Then the population's path does
    not depend on timing: which member runs, when it pauses and whom it
    clones follow from iteration counts alone (a member pauses two intervals
    ahead of the other, see :class:`tunekit.schedule.pbt.PopulationBasedTrainingNoIdlePause`),
    and with ``seed`` the explore noise is fixed too. Side by side, the order
    in which the two members' results reach the scheduler decides who clones
    whom, and a run can end below the target (seen: Q = 1.10 and 1.17).
    Needs a running Ray (or starts one).
    """
    import ray
    from ray import tune

    from tunekit.schedule.pbt import pbt_setup, quiet_pbt_keep_warning

    quiet_pbt_keep_warning()
    explore = explore_h if seed is None else functools.partial(explore_h, rng=random.Random(seed))
    setup = pbt_setup(ToyPBT, metric="Q", mode="max", perturbation_interval=READY_EVERY,
                      custom_explore_fn=explore, quantile_fraction=0.5, num_to_keep=1)
    tune_config = setup.tune_config_kwargs()
    if not pbt:
        del tune_config["scheduler"]
    trainable: Any = ToyPBT
    if one_slot:
        if not ray.is_initialized():
            ray.init()
        trainable = tune.with_resources(ToyPBT, {"cpu": ray.cluster_resources()["CPU"]})
    grid = tune.Tuner(
        trainable,
        param_space={
            "h": tune.grid_search([[1.0, 0.0], [0.0, 1.0]]),
            "lr": tune.sample_from(lambda spec: STEP_SIZES[0] if spec.config.h[0] == 1.0 else STEP_SIZES[1]),
        },
        tune_config=tune.TuneConfig(**tune_config),
        run_config=tune.RunConfig(name=name or ("toy_pbt" if pbt else "toy_no_pbt"), storage_path=storage_path,
                                  stop={"training_iteration": steps}, checkpoint_config=setup.checkpoint_config,
                                  verbose=0),
    ).fit()
    if grid.errors:
        raise RuntimeError(f"toy problem: {len(grid.errors)} trial(s) failed: {grid.errors[0]}")
    return max(float(r.metrics_dataframe["Q"].max()) for r in grid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The toy problem of the PBT paper: PBT against no PBT.")
    parser.add_argument("--storage-path", default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--side-by-side", action="store_true",
                        help="the two members run side by side (default: they time-share one slot, pausing "
                             "and resuming in turn, so the result does not depend on timing)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the explore noise (default 0)")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    storage = args.storage_path or tempfile.mkdtemp(prefix="tunekit-toy-pbt-")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        one_slot = not args.side_by_side
        with_pbt = run_toy_problem(storage, pbt=True, one_slot=one_slot, seed=args.seed)
        without = run_toy_problem(storage, pbt=False, one_slot=one_slot)
    finally:
        ray.shutdown()
    print(f"best Q with exploit/explore:    {with_pbt:.4f}  (target >= {TARGET_Q})")
    print(f"best Q without (same budget):   {without:.4f}")
    print(f"experiments in {storage}")
    return 0 if with_pbt >= TARGET_Q > without else 1


if __name__ == "__main__":
    sys.exit(main())
