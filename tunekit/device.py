"""Where a trial's tensors live: the GPU Ray assigned to it, else the CPU."""

from __future__ import annotations

import gc
import os

import torch

__all__ = ["release_memory", "trial_device"]


def trial_device() -> torch.device:
    """Return the torch device of the GPU Ray assigned to this worker, or CPU.

    Ray sets ``CUDA_VISIBLE_DEVICES`` to the trial's GPU(s), so the first
    assigned GPU is ``cuda:0`` inside the worker; fractional GPUs share it.
    """
    if not torch.cuda.is_available():
        return torch.device("cpu")
    try:
        import ray

        gpu_ids = ray.get_gpu_ids() if ray.is_initialized() else []
    except Exception:  # noqa: BLE001 - outside a Ray worker: no assignment
        gpu_ids = []
    if not gpu_ids:
        return torch.device("cpu")
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
    first = str(gpu_ids[0])
    index = visible.index(first) if first in visible else int(float(first))
    return torch.device("cuda", index)


def release_memory() -> None:
    """Collect garbage and return cached GPU memory to the driver."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
