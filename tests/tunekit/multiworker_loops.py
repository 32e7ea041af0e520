"""Ray Train worker loops the multi-worker tests run (importable by Train workers): a small MLP trained
data-parallel (DDP) or fully sharded (FSDP2 ``fully_shard``) on CPU with gloo (or on the worker's GPU with
NCCL), with per-rank data streams and a global-RNG noise draw each step (on the model's device), so a resume
is bit-exact only when every rank's state came back."""

from __future__ import annotations

import os
import signal
from typing import Any

import torch
from torch import nn

from tunekit import TrainingState
from tunekit.multiworker import train_trial
from tunekit.trial.rng import seed_everything

__all__ = ["Stream", "checked", "full_model_state", "loop"]


class Stream:
    """A per-rank data stream whose position is state (``state_dict``/``load_state_dict``)."""

    def __init__(self, seed: int) -> None:
        self.seed, self.position = seed, 0

    def next(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.position)
        self.position += 1
        return torch.randn(8, 16, generator=generator)

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed, self.position = state["seed"], state["position"]


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on every rank (a test's gather of a tiny model: never tunekit's way)."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
            for k, v in model.state_dict().items()}


def _wait_until_train_registered_a_checkpoint() -> None:
    """Until the Train controller lists a checkpoint in its snapshot (a checkpoint still being written in
    the background when the worker dies is not one to resume from); after 5 minutes, on regardless."""
    import json
    import time

    import ray.train

    snapshot = os.path.join(ray.train.get_context().get_storage().experiment_fs_path, "checkpoint_manager_snapshot.json")
    for _ in range(6000):
        try:
            with open(snapshot) as fh:
                if json.load(fh).get("checkpoint_results"):
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)


def _die_once(marker: str) -> None:
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


def loop(config: dict[str, Any]) -> None:
    """``config``: ``mode`` ("ddp" | "fsdp"), ``device`` ("cpu", the default, or "cuda": the worker's GPU),
    ``seed``, ``lr``, ``epochs``, ``steps``, ``out`` (where rank 0
    writes ``final.pt``: the full weights at the end), ``fault``: ``{"rank", "iteration", "step" | "phase",
    "marker"}``; ``resume_from``: a checkpoint to start from; ``dump_restored``: rank 0 writes the full restored weights and iteration there, and the loop
    ends (``train_after_dump``: trains on) (that rank SIGKILLs itself once: mid-epoch at that step, or inside its checkpoint write at
    that write phase)."""
    import ray.train
    import ray.train.torch

    from tunekit.checkpoint import _faults as tk_faults
    from tunekit.multiworker import WorkerSession

    config = {**config, **config.get("case", {})}  # a grid search over cases: {"out": ..., "faults": ...}
    rank = ray.train.get_context().get_world_rank()
    device = ray.train.torch.get_device() if config.get("device") == "cuda" else torch.device("cpu")
    seed_everything(config["seed"])
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)).to(device)
    if config["mode"] == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # On CPU workers the mesh is said: by default FSDP2 takes the machine's GPU type and sets device
        # <rank> (on a one-GPU machine, rank 1 failed: "invalid device ordinal", seen on an H100)
        mesh = init_device_mesh(device.type, (ray.train.get_context().get_world_size(),))
        net = fully_shard(model, mesh=mesh)
    else:
        net = ray.train.torch.prepare_model(model, move_to_device=device.type == "cuda")
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    seed_everything(config["seed"] * 7 + rank)  # each rank its own noise stream
    stream = Stream(config["seed"] * 10 + rank)
    # (``stream_in_state: False``: the data position left out of the state, a resume that is not bit-exact)
    state = TrainingState(models={"model": model}, optimizers={"opt": opt},
                          data=stream if config.get("stream_in_state", True) else None)
    session = WorkerSession(state, config=config, resume_from=config.get("resume_from"))
    if config.get("dump_restored"):  # a resharding test: the whole restored state, then stop (or train on)
        full = full_model_state(model)
        if rank == 0:
            torch.save({"weights": full, "iteration": session.iteration}, config["dump_restored"])
        if not config.get("train_after_dump"):
            return
    faults = [f for f in config.get("faults", []) if f["rank"] == rank]
    while session.iteration < config["epochs"]:
        now = [f for f in faults if f["iteration"] == session.iteration + 1]
        for step in range(config["steps"]):
            x = stream.next().to(device)
            loss = (net(x + torch.randn(x.shape, device=device) * 0.01) - x.flip(1)).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            for fault in now:
                if fault.get("step") == step and not os.path.exists(fault["marker"]):
                    _wait_until_train_registered_a_checkpoint()  # (saves are written in the background)
                    _die_once(fault["marker"])
        for fault in now:  # (the write may run on after report returns: the marker makes it die once)
            if "phase" in fault:
                tk_faults.hook = lambda phase, f=fault: phase == f["phase"] and _die_once(f["marker"])
        restored = {"restored_from_iteration": _restored_iteration(session), "restored_from": session.restored_from or ""}
        session.report({"loss": float(loss.detach()), "iteration": session.iteration + 1,
                        "lr_in_effect": opt.param_groups[0]["lr"],
                        **(restored if config.get("report_restored", True) else {})},
                       checkpoint=(session.iteration + 1) % config.get("every", 1) == 0)
    full = full_model_state(model)
    if rank == 0 and config.get("out"):
        torch.save(full, os.path.join(config["out"], "final.pt"))


def _restored_iteration(session: Any) -> int:
    return -1 if session.restored_from is None else int(session.restored_iteration)


#: The loop as a Tune trainable of 2 workers on half a CPU each, for ``tunekit check``.
checked = train_trial(loop, workers=2, cpus_per_worker=0.5)
