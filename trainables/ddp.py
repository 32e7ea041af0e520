"""Multi-worker trials: each Tune trial trains data-parallel with Ray Train (DDP).

``tune_ddp`` is a Tune function trainable that runs a Ray Train
``TorchTrainer`` (``num_workers`` workers, gloo on CPU, NCCL when
``use_gpu``) training the digits MLP with ``DistributedDataParallel``; the
Train workers' reports reach Tune through ``TuneReportCallback``. Use it as::

    tuner = tune.Tuner(
        tune.with_resources(tune_ddp, {"cpu": 0.2}),  # the Train workers hold the CPUs
        param_space={"lr": tune.grid_search([0.05, 0.1]), "workers": 2,
                     "storage_path": "s3://bucket/train-runs"},
    )

Checkpoints follow the Ray Train docs for replicated and sharded state:

* rank 0 writes the replicated state (model, optimizer, counters) as a
  tunekit checkpoint (``state.pt``, ``tunekit.json``, ``manifest.json``);
* every rank writes what is its own (its data-stream position and RNG
  streams) under ``rank-<r>/``, a tunekit checkpoint of its own;
* Ray Train uploads all ranks' files into one checkpoint directory.

On restart (a Train worker died and ``FailureConfig`` retries, or the Tune
trial is resumed: the Train run's name is the trial id, so Train finds its
checkpoints again) every rank loads the replicated state plus its own
``rank-<r>/``, each verified against its manifest, and training continues
bit-exactly.
"""

from __future__ import annotations

import os
import signal
import tempfile
from typing import Any

import torch
from torch import nn

from tunekit.checkpoint import read_state, write_checkpoint
from tunekit.errors import CheckpointError, ConfigError
from tunekit.rng import seed_everything
from tunekit.trainables.digits import build_digits_state, evaluate

__all__ = ["REPLICATED_KEYS", "rank_dir", "train_loop", "tune_ddp"]

REPLICATED_KEYS = ("format", "models", "optimizers", "schedulers", "scaler", "counters", "extras")
RANK_KEYS = ("format", "data", "rng")


def rank_dir(rank: int) -> str:
    return f"rank-{rank}"


def train_loop(config: dict[str, Any]) -> None:
    """The Ray Train worker loop (every rank runs it)."""
    import ray.train
    import ray.train.torch

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    seed = int(config.get("seed", 0))
    seed_everything(seed + rank)
    # Each rank draws its own batches (its own stream seed): its shard of the data.
    state = build_digits_state({**_digits_config(config), "seed": seed + rank}, torch.device("cpu"))
    ddp = ray.train.torch.prepare_model(state.models["model"], move_to_device=False)

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            own = os.path.join(directory, rank_dir(rank))
            if not os.path.isdir(own):
                raise CheckpointError(
                    f"checkpoint {checkpoint.path} has no {rank_dir(rank)}/: it was written by fewer "
                    f"workers than the {world} now running; resume with the same number of workers"
                )
            state.load_state_dict({**read_state(directory), **read_state(own)})

    epochs = int(config.get("epochs", 6))
    every = int(config.get("checkpoint_every", 2))
    steps = int(config.get("steps_per_iteration", 10))
    fault = config.get("fault") or {}
    while state.counters.iteration < epochs:
        ddp.train()
        for _ in range(steps):
            xb, yb = state.data.next_batch()
            noise = torch.randn(xb.shape) * 0.01
            loss = nn.functional.cross_entropy(ddp(xb + noise), yb)
            state.optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces the gradients here
            state.optimizer.step()
            state.counters.step += 1
        state.counters.iteration += 1
        iteration = state.counters.iteration
        metrics = {"train_loss": float(loss), **evaluate(state.models["model"], torch.device("cpu")),
                   "iteration": iteration, "world_size": world}
        if iteration % every == 0 or iteration == epochs:
            sd = state.state_dict()
            with tempfile.TemporaryDirectory() as tmp:
                write_checkpoint(os.path.join(tmp, rank_dir(rank)), {k: sd[k] for k in RANK_KEYS},
                                 metadata={"iteration": iteration, "rank": rank, "world_size": world})
                if rank == 0:  # replicated state: once, by rank 0 (its manifest lists rank-0/ too)
                    write_checkpoint(tmp, {k: sd[k] for k in REPLICATED_KEYS},
                                     metadata={"iteration": iteration, "world_size": world,
                                               "trainable": "tunekit.trainables.ddp:tune_ddp", "config": _digits_config(config)})
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))
        else:
            ray.train.report(metrics)
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
    default 1), ``storage_path`` (where Train writes, required: a shared or
    cloud location on a cluster), ``fault`` (drills: ``{"rank", "iteration",
    "marker"}`` kills that rank once after that iteration).
    """
    from ray import tune
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    storage_path = config.get("storage_path")
    if not storage_path:
        raise ConfigError("tune_ddp(config['storage_path']): required, the Train runs' storage (shared or cloud)")
    use_gpu = bool(config.get("use_gpu", False))
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=dict(config),
        scaling_config=ScalingConfig(num_workers=int(config.get("workers", 2)), use_gpu=use_gpu,
                                     resources_per_worker={"CPU": float(config.get("cpus_per_worker", 1))}),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=RunConfig(
            name=f"ddp-{tune.get_context().get_trial_id()}",
            storage_path=storage_path,
            failure_config=FailureConfig(max_failures=int(config.get("max_failures", 1))),
            callbacks=[TuneReportCallback()],
        ),
    )
    trainer.fit()
