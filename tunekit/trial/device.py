"""Where a trial's tensors live: the GPU Ray assigned to it, else the CPU.
"""

from __future__ import annotations

import gc
import os

import torch

__all__ = ["allocated_bytes", "release_memory", "trial_device"]


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


def allocated_bytes() -> int:
    """GPU memory this process holds in tensors (0 without CUDA in use)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.memory_allocated())
    return 0


def release_memory(keep_bytes: int | None = None) -> bool:
    """Give a finished trial's GPU memory back to the device, without a full collection if possible.

    Call it after dropping every reference to the trial's tensors. On the CPU it
    does nothing: tensors without reference cycles were freed when their last
    reference went (CPython's reference counting), and cycles are left to
    Python's own collector, as in any PyTorch program. On a GPU, PyTorch's
    caching allocator keeps freed blocks for reuse; ``empty_cache`` returns
    them to the device. Only when more than ``keep_bytes`` (what the caller
    keeps on purpose, e.g. a dataset reused by the next trial; default: 0) is
    still allocated - tensors held by reference cycles - does it run
    ``gc.collect()`` before ``empty_cache``.

    Returns:
        True when a full ``gc.collect()`` was needed.
    """
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return False
    torch.cuda.synchronize()
    collected = torch.cuda.memory_allocated() > (keep_bytes or 0)
    if collected:
        gc.collect()
    torch.cuda.empty_cache()
    return collected
