"""The 8x8 handwritten digits of scikit-learn (1,797 images, shipped in the package).
"""

from __future__ import annotations

import gzip
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

import torch
from torch import nn

from tunekit import ShuffledBatches, TrainingState
from tunekit._checks import integer_at_least, number_at_least

__all__ = [
    "DEFAULTS", "DigitsData", "build_digits_state", "digits_model", "digits_on_device", "evaluate",
    "load_digits_data", "train_steps"
]

#: Default hyperparameters of the digits trainables.
DEFAULTS: dict[str, Any] = {
    "lr": 0.05,
    "momentum": 0.9,
    "weight_decay": 0.0,
    "hidden_size": 64,
    "batch_size": 64,
    "seed": 0,
    "steps_per_iteration": None,  # None: one epoch per iteration
}


@dataclass(frozen=True)
class DigitsData:
    """Train and validation tensors (features scaled to [0, 1])."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor


@lru_cache(maxsize=1)
def load_digits_data(val_fraction: float = 0.25, split_seed: int = 1234) -> DigitsData:
    """Load scikit-learn's digits and split them; the split is fixed by ``split_seed``."""
    pixels, target = _digits_arrays()
    x = torch.tensor(pixels, dtype=torch.float32) / 16.0
    y = torch.tensor(target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(split_seed))
    n_val = int(len(x) * val_fraction)
    val, train = perm[:n_val], perm[n_val:]
    return DigitsData(x[train], y[train], x[val], y[val])


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The pixels and labels of ``sklearn.datasets.load_digits()``, read from the file scikit-learn ships.

    Found without importing scikit-learn, whose import costs each trial's worker process seconds of CPU;
    the file is parsed as ``load_digits`` parses it. Falls back to ``load_digits`` where the file is not
    where scikit-learn keeps it.
    """
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz") if spec else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return bunch.data, bunch.target
    with gzip.open(path, mode="rt", encoding="utf-8") as fh:
        table = np.loadtxt(fh, delimiter=",")
    return table[:, :-1], table[:, -1].astype(int, copy=False)


def digits_model(hidden_size: int) -> nn.Module:
    """A two-layer MLP for 64 pixels -> 10 classes."""
    return nn.Sequential(nn.Linear(64, hidden_size), nn.ReLU(), nn.Linear(hidden_size, 10))


def _check_config(config: dict[str, Any]) -> dict[str, Any]:
    merged = {**DEFAULTS, **config}
    for key in ("lr", "momentum", "weight_decay"):
        number_at_least("digits config", key, merged[key])
    for key in ("hidden_size", "batch_size"):
        integer_at_least("digits config", key, merged[key])
    integer_at_least("digits config", "steps_per_iteration", merged["steps_per_iteration"], allow_none=True)
    return merged


def digits_on_device(device: torch.device) -> DigitsData:
    """The digits split, moved to ``device`` (depends on no hyperparameter: reusable across trials)."""
    data = load_digits_data()
    if data.x_train.device == device:
        return data
    return DigitsData(*(t.to(device) for t in (data.x_train, data.y_train, data.x_val, data.y_val)))


def build_digits_state(config: dict[str, Any], device: torch.device, data: DigitsData | None = None) -> TrainingState:
    """Model, SGD optimizer and a resumable batch stream for ``config``.

    ``data``: the split already on ``device`` (:func:`digits_on_device`), e.g.
    kept by a reused worker; loaded when None.
    """
    cfg = _check_config(config)
    data = data if data is not None else digits_on_device(device)
    model = digits_model(cfg["hidden_size"]).to(device)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"], weight_decay=cfg["weight_decay"]
    )
    stream = ShuffledBatches(
        data.x_train.to(device), data.y_train.to(device), batch_size=cfg["batch_size"], seed=cfg["seed"]
    )
    state = TrainingState(models={"model": model}, optimizers={"optimizer": optimizer}, data=stream)
    return state


def train_steps(state: TrainingState, steps: int | None) -> float:
    """Run ``steps`` SGD steps (or the rest of the epoch if None); return the mean loss."""
    model, optimizer, stream = state.model, state.optimizer, state.data
    assert isinstance(stream, ShuffledBatches)
    model.train()
    losses = []
    batches = stream.epoch_batches() if steps is None else (stream.next_batch() for _ in range(steps))
    for xb, yb in batches:
        # Dropout-free model, but draw from torch's RNG each step so that a
        # checkpoint without the RNG state cannot resume bit-exactly.
        noise = torch.randn(xb.shape, device=xb.device) * 0.01
        loss = nn.functional.cross_entropy(model(xb + noise), yb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
        state.counters.step += 1
    state.counters.samples_seen = stream.samples_seen
    state.counters.epoch = stream.epoch
    return float(torch.stack(losses).mean())


@torch.no_grad()
def evaluate(model: nn.Module, device: torch.device, data: DigitsData | None = None) -> dict[str, float]:
    """Validation loss and accuracy (``data``: the split on ``device``, loaded when None)."""
    data = data if data is not None else load_digits_data()
    model.eval()
    logits = model(data.x_val.to(device))
    y = data.y_val.to(device)
    return {
        "loss": float(nn.functional.cross_entropy(logits, y)),
        "accuracy": float((logits.argmax(dim=1) == y).float().mean()),
    }
