"""Capture and restore every random-number stream a training run draws from.

The captured state holds only tensors, ints, floats, strings and containers of
them, so it can be stored with ``torch.save`` and read back with
``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng", "restore_rng", "seed_everything"]


def seed_everything(seed: int) -> None:
    """Seed Python ``random``, NumPy's global RNG and torch (CPU and every GPU)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


#: The Python RNG state captured last, and its tensor: a loop that never draws from ``random`` saves the same
#: state again and again (building the tensor from 625 ints is most of a small checkpoint's capture). Shared by
#: the payloads that hold it, and never written to (:func:`restore_rng` reads it).
_last_python: tuple[tuple[int, ...], torch.Tensor] | None = None


def capture_rng() -> dict[str, Any]:
    """Return the state of Python, NumPy, torch CPU and torch CUDA RNGs."""
    global _last_python
    version, internal, gauss = random.getstate()
    last = _last_python
    if last is None or last[0] != internal:
        last = _last_python = (internal, torch.tensor(internal, dtype=torch.int64))
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        # (one tensor, not 625 ints: each int is an object for every copy and for the pickler)
        "python": {"version": version, "state": last[1], "gauss": gauss},
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": [],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Restore RNG streams captured by :func:`capture_rng`.

    CUDA streams are restored for as many devices as both the checkpoint and
    this process have, so a checkpoint taken on a GPU loads on a CPU machine.
    """
    py = state["python"]
    internal = py["state"]  # a tensor; a list in checkpoints written before 2026-11-28
    random.setstate((py["version"], tuple(internal.tolist() if isinstance(internal, torch.Tensor) else internal),
                     py["gauss"]))
    npst = state["numpy"]
    np.random.set_state(
        (
            npst["kind"],
            npst["keys"].numpy().astype(np.uint32),
            npst["pos"],
            npst["has_gauss"],
            npst["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    cuda_states = state.get("cuda") or []
    if cuda_states and torch.cuda.is_available():
        for index in range(min(len(cuda_states), torch.cuda.device_count())):
            torch.cuda.set_rng_state(cuda_states[index], device=index)
