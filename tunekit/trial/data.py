"""A resumable, deterministic mini-batch stream over in-memory tensors.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from tunekit._checks import integer_at_least
from tunekit.errors import ConfigError

__all__ = ["ShuffledBatches"]


class ShuffledBatches:
    """Endless shuffled mini-batches whose position is part of the checkpoint.

    Each epoch's order is a permutation drawn from ``seed`` and the epoch
    number alone (on the CPU), so it is the same on every device and after any
    restore. ``state_dict()`` records the epoch and the offset of the next
    sample; after ``load_state_dict()`` the next batch is exactly the batch that
    would have come next. ``batch_size`` may change between batches (PBT): the
    stream goes on from the same sample offset.

    Example:
        >>> x, y = torch.arange(10.0).unsqueeze(1), torch.arange(10)
        >>> stream = ShuffledBatches(x, y, batch_size=4, seed=0)
        >>> xb, yb = stream.next_batch()
        >>> tuple(xb.shape)
        (4, 1)
    """

    def __init__(
        self,
        *tensors: torch.Tensor,
        batch_size: int,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if not tensors:
            raise ConfigError("ShuffledBatches(): needs at least one tensor")
        n = len(tensors[0])
        if any(len(t) != n for t in tensors):
            raise ConfigError(
                "ShuffledBatches(): all tensors must have the same length, "
                f"got {[len(t) for t in tensors]}"
            )
        if n == 0:
            raise ConfigError("ShuffledBatches(): tensors are empty")
        self.tensors = tensors
        self.num_samples = n
        self.batch_size = batch_size
        self.seed = int(seed)
        self.drop_last = drop_last
        self.epoch = 0
        self.offset = 0
        self.samples_seen = 0
        self._perm: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        integer_at_least("ShuffledBatches", "batch_size", value)
        self._batch_size = value

    def _permutation(self) -> torch.Tensor:
        if self._perm is None:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            self._perm = torch.randperm(self.num_samples, generator=gen)
        return self._perm

    def next_batch(self) -> tuple[torch.Tensor, ...]:
        """Return the next mini-batch, moving to a new epoch when one ends."""
        remaining = self.num_samples - self.offset
        if remaining <= 0 or (self.drop_last and remaining < self.batch_size):
            self.epoch += 1
            self.offset = 0
            self._perm = None
        idx = self._permutation()[self.offset : self.offset + self.batch_size]
        self.offset += len(idx)
        self.samples_seen += len(idx)
        device_idx = idx.to(self.tensors[0].device)
        return tuple(t[device_idx] for t in self.tensors)

    def epoch_batches(self) -> Iterator[tuple[torch.Tensor, ...]]:
        """Yield the batches left in the current epoch (all of the next if it ended)."""
        while True:
            yield self.next_batch()
            left = self.num_samples - self.offset
            if left <= 0 or (self.drop_last and left < self.batch_size):
                return

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "samples_seen": self.samples_seen,
            "seed": self.seed,
            "num_samples": self.num_samples,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("num_samples", self.num_samples) != self.num_samples:
            raise ConfigError(
                f"ShuffledBatches.load_state_dict(): checkpoint holds a position in "
                f"{state['num_samples']} samples, this stream has {self.num_samples}"
            )
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
        self.samples_seen = int(state["samples_seen"])
        self.seed = int(state["seed"])
        self._perm = None
