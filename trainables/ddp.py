"""Multi-worker trials: each Tune trial trains data-parallel with Ray Train (DDP), on tunekit.multiworker.

``tune_ddp`` is a Tune function trainable that runs a Ray Train
``TorchTrainer`` (``workers`` workers, gloo on CPU, NCCL when ``use_gpu``)
training the digits MLP with ``DistributedDataParallel``. Use it as::

    tuner = tune.Tuner(
        tune.with_resources(tune_ddp, {"cpu": 0.1}),  # the Train workers hold the CPUs
        param_space={"lr": tune.grid_search([0.05, 0.1]), "workers": 2},
    )

What is specific to this model is here; the rest is :mod:`tunekit.multiworker`
(``WorkerSession``: the replicated state written once by rank 0, each rank's
data position and RNG streams by that rank, every part verified on restore;
``train_trial``: one Train run per trial, in the trial's directory).
"""

from __future__ import annotations

import os
import signal
from typing import Any

import torch
from torch import nn

from tunekit.multiworker import WorkerSession, train_trial
from tunekit.trial.rng import seed_everything
from tunekit.trial.kind import TrainableKind
from tunekit.trainables.digits import build_digits_state, evaluate

__all__ = ["train_loop", "tune_ddp"]


def train_loop(config: dict[str, Any]) -> None:
    """The Ray Train worker loop (every rank runs it)."""
    import ray.train
    import ray.train.torch

    rank = ray.train.get_context().get_world_rank()
    seed = int(config.get("seed", 0))
    seed_everything(seed + rank)
    # Each rank draws its own batches (its own stream seed): its shard of the data.
    state = build_digits_state({**_digits_config(config), "seed": seed + rank}, torch.device("cpu"))
    ddp = ray.train.torch.prepare_model(state.models["model"], move_to_device=False)
    session = WorkerSession(state, config=_digits_config(config), name="tunekit.trainables.ddp:train_loop",
                            resume_from=config.get("resume_from"))
    epochs = int(config.get("epochs", 6))
    every = int(config.get("checkpoint_every", 2))
    steps = int(config.get("steps_per_iteration", 10))
    fault = config.get("fault") or {}
    while session.iteration < epochs:
        ddp.train()
        for _ in range(steps):
            xb, yb = state.data.next_batch()
            noise = torch.randn(xb.shape) * 0.01
            loss = nn.functional.cross_entropy(ddp(xb + noise), yb)
            state.optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces the gradients here
            state.optimizer.step()
            state.counters.step += 1
        iteration = session.iteration + 1
        metrics = {"train_loss": float(loss), **evaluate(state.models["model"], torch.device("cpu")),
                   "iteration": iteration, "world_size": session.world_size}
        session.report(metrics, checkpoint=iteration % every == 0 or iteration == epochs)
        if fault.get("rank") == rank and fault.get("iteration") == iteration:
            marker = fault["marker"]
            if not os.path.exists(marker):  # once: the retried worker group goes on
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)


def _digits_config(config: dict[str, Any]) -> dict[str, Any]:
    keys = ("lr", "momentum", "weight_decay", "hidden_size", "batch_size")
    return {k: config[k] for k in keys if k in config}


def tune_ddp(config: dict[str, Any]) -> None:
    """Tune function trainable: one data-parallel Ray Train run per trial.

    Config: the digits hyperparameters (``lr``, ``momentum``, ...), ``seed``,
    ``epochs``, ``checkpoint_every``, ``steps_per_iteration``, ``workers``
    (default 2), ``cpus_per_worker`` (default 1), ``use_gpu``, ``max_failures`` (Train worker-group retries,
    default 1), ``storage_path`` (where Train writes; default the trial's directory), ``fault`` (drills:
    ``{"rank", "iteration", "marker"}`` kills that rank once after that iteration).
    """
    trial = train_trial(train_loop, workers=int(config.get("workers", 2)),
                        cpus_per_worker=float(config.get("cpus_per_worker", 1)),
                        use_gpu=bool(config.get("use_gpu", False)), max_failures=int(config.get("max_failures", 1)),
                        storage_path=config.get("storage_path"), lockstep=False)  # (run inside this function)
    trial(config)


#: ``tunekit check`` cannot check it (its workers run ahead of Tune) and says so in one line; it checks a
#: module-level ``train_trial(train_loop, workers=2)`` (lockstep, the default) instead.
tune_ddp.tunekit_trainable = TrainableKind(multiworker=True)  # type: ignore[attr-defined]
