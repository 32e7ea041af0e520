"""What a reused worker may keep from one trial to the next.

With ``reuse_actors=True`` (``pbt_setup`` turns it on) Ray Tune runs the next
trial, or a trial PBT resumes, in a worker that has already run another one:
``reset_config`` replaces the trial's config in the live process. tunekit's
trainables then rebuild the training state from the new config, so nothing of
the previous trial survives - except what the trainable *declares* reusable:
resources that depend on the config only through named keys (a dataset loaded
and moved to the device, allocated buffers, a tokenizer). Those are built once
per worker and kept while the named keys keep their values.

* Class trainables (:class:`~tunekit.TorchTrainable`) declare
  ``reusable_keys`` and implement ``build_reusable(config)``; ``build`` reads
  ``self.reusable``.
* Function trainables call :func:`reusable` inside the training function.

What is kept must not be changed by training (it is shared by every trial the
worker runs) and must not draw from the trial's random streams: it is built
before the trial's RNGs are seeded, so a reused worker and a fresh one train
bit-identically.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Hashable, Mapping, TypeVar

from tunekit.errors import ConfigError, ConfigTypeError

__all__ = ["ReusableSlot", "reusable", "reusable_key", "reusable_slot"]

T = TypeVar("T")


def reusable_key(config: Mapping[str, Any], keys: tuple[str, ...] | list[str], *, owner: str) -> tuple:
    """The values of ``keys`` in ``config``, as a hashable key (missing keys count as None)."""
    if isinstance(keys, str) or not all(isinstance(k, str) for k in keys):
        raise ConfigTypeError(f"{owner}: reusable keys must be a tuple of config key names, got {keys!r}")
    values = []
    for key in keys:
        value = config.get(key)
        try:
            hash(value)
        except TypeError:
            raise ConfigError(
                f"{owner}: config[{key!r}]={value!r} is not hashable; reusable keys must name "
                "hashable config values (numbers, strings, tuples)"
            ) from None
        values.append((key, value))
    return tuple(values)


class ReusableSlot:
    """One reusable object and the key it was built for."""

    def __init__(self) -> None:
        self.key: Hashable | None = None
        self.value: Any = None
        self.builds = 0  # how often it was (re)built: tests and benchmarks read it

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        """The kept value if it was built for ``key``, else a new one (the old one is dropped first)."""
        if self.builds and self.key == key:
            return self.value
        self.clear()
        self.value = build()
        self.key = key
        self.builds += 1
        return self.value

    def clear(self) -> None:
        self.key, self.value = None, None


_slots: dict[str, ReusableSlot] = {}
_slots_lock = threading.Lock()


def reusable(name: str, config: Mapping[str, Any], keys: tuple[str, ...], build: Callable[[], T]) -> T:
    """A worker-wide object for function trainables, rebuilt only when ``config[keys]`` change.

    Example:
        .. code-block:: python

            def train(config):
                data = tunekit.reusable("digits", config, ("batch_size",),
                                        lambda: load_data(config["batch_size"]).to(device))
                seed_everything(config["seed"])
                ...

    Args:
        name: Names the object within the worker (one kept object per name).
        config: The trial's config.
        keys: The config keys the object depends on; ``()`` if it depends on none.
        build: Builds the object (called with no arguments).
    """
    if not isinstance(name, str) or not name:
        raise ConfigTypeError(f"reusable(name={name!r}): expected a non-empty string")
    key = reusable_key(config, keys, owner=f"reusable({name!r})")
    with _slots_lock:
        slot = _slots.setdefault(name, ReusableSlot())
    return slot.get(key, build)


def reusable_slot(name: str) -> ReusableSlot | None:
    """The slot :func:`reusable` keeps under ``name`` in this worker, if any."""
    return _slots.get(name)
