"""``TorchTrainable``: a Ray Tune class trainable whose checkpoints are complete."""

from __future__ import annotations

import logging
import os
from abc import abstractmethod
from typing import Any, ClassVar

import torch
from ray import tune
from typing_extensions import override

from tunekit import _ray
from tunekit.device import allocated_bytes, release_memory, trial_device
from tunekit.errors import CheckpointError, ConfigError, ConfigTypeError
from tunekit.hparams import DEFAULT_MUTABLE, apply_hyperparameters
from tunekit.reuse import ReusableSlot, reusable_key
from tunekit.rng import seed_everything
from tunekit.state import TrainingState
from tunekit._restoring import (
    checkpoint_metrics,
    clone_in_worker,
    local_request,
    prepare_restore,
    raise_failed_clone,
    remove_temps,
    restore_trial_state,
)
from tunekit._saving import (
    BackgroundSaves,
    background_saves_enabled,
    confirm_remote_upload,
    save_again,
    save_in_place,
    save_snapshot,
    save_trial_state,
    trainable_spec,
    trial_payload,
)
from tunekit.warm import apply_warm_start

__all__ = ["TorchTrainable"]

logger = logging.getLogger(__name__)


class TorchTrainable(tune.Trainable):
    """Base class for PyTorch class trainables with bit-exact checkpoints.

    Subclasses implement two methods:

    * :meth:`build` returns a :class:`~tunekit.TrainingState` (models,
      optimizers, schedulers, scaler, data stream) built on ``self.device``;
    * :meth:`train_iteration` runs one iteration on ``self.state`` and returns
      its metrics.

    The base class seeds every RNG from ``config["seed"]`` (default 0), places
    the work on the GPU Ray assigned to the trial (else the CPU), saves and
    loads the *whole* state (see :mod:`tunekit.checkpoint`), applies mutated
    hyperparameters on PBT exploits, rebuilds the state on ``reset_config`` so
    ``reuse_actors=True`` is safe, and frees GPU memory in ``cleanup``.

    Reuse: what depends on the config only through a few keys (a dataset on
    the device, buffers) may be declared reusable: list the keys in
    ``reusable_keys`` and build it in :meth:`build_reusable`; ``build`` reads
    it as ``self.reusable``. A reused worker keeps it while those keys keep
    their values (see :mod:`tunekit.reuse`). ``reset_config`` costs a rebuild
    of the state and nothing else: no ``gc.collect()`` on the CPU, and on a
    GPU only when memory beyond the reusable objects is still allocated
    (:func:`tunekit.release_memory`).

    Hyperparameters in :data:`~tunekit.hparams.DEFAULT_MUTABLE` (``lr``,
    ``momentum``, ``weight_decay``, ``batch_size``) plus those listed in
    ``mutable_hyperparameters`` may change during a trial; override
    :meth:`apply_hyperparameters` for the extra ones.

    Saves are two-phase on local storage (``background_saves``, on by
    default): :meth:`save` returns once the state is copied into reused CPU
    buffers (pinned ones from a GPU), and a helper thread writes the
    checkpoint while training goes on; at most one write is in flight, and
    restore, ``reset_config`` and ``cleanup`` wait for it. The extra memory
    is one copy of the state's tensors. See :mod:`tunekit._saving`
    for what holds if the worker dies during such a write. Set
    ``background_saves = False`` in a subclass, or ``TUNEKIT_BACKGROUND_SAVES=0``
    in the workers' environment, to write before ``save`` returns.

    When Ray asks again for the same iteration (say a PBT save and a
    ``checkpoint_frequency`` hit), the second checkpoint is a directory of
    hard links to the first one's files (:func:`~tunekit._saving.save_again`).
    """

    #: Two-phase saves (see above); ``TUNEKIT_BACKGROUND_SAVES=0`` turns them off everywhere.
    background_saves: ClassVar[bool] = True

    mutable_hyperparameters: ClassVar[tuple[str, ...]] = ()
    #: Config keys :meth:`build_reusable` depends on (``()``: on none).
    reusable_keys: ClassVar[tuple[str, ...]] = ()

    #: What :meth:`build_reusable` returned for the current trial's config.
    reusable: Any = None

    state: TrainingState
    device: torch.device

    # -- to implement -------------------------------------------------------
    @abstractmethod
    def build(self, config: dict[str, Any]) -> TrainingState:
        """Build models, optimizers and data for ``config`` on ``self.device``."""

    @abstractmethod
    def train_iteration(self) -> dict[str, Any]:
        """Run one training iteration on ``self.state``; return its metrics."""

    # -- may override -------------------------------------------------------
    def build_reusable(self, config: dict[str, Any]) -> Any:
        """Build what later trials in this worker may share (default: nothing).

        Depends on ``config`` only through ``reusable_keys``; must not be
        changed by training nor draw random numbers (it is built before the
        trial's RNGs are seeded). Built on ``self.device``.
        """
        return None

    @classmethod
    def mutable(cls) -> tuple[str, ...]:
        """All hyperparameters this trainable can change in place."""
        extra = tuple(k for k in cls.mutable_hyperparameters if k not in DEFAULT_MUTABLE)
        return DEFAULT_MUTABLE + extra

    def apply_hyperparameters(self, changed: dict[str, Any]) -> None:
        """Apply mutated hyperparameters to the live state (PBT exploit)."""
        unhandled = apply_hyperparameters(self.state, changed)
        if unhandled:
            raise ConfigError(
                f"{type(self).__name__}: hyperparameters {unhandled} are declared "
                "mutable but apply_hyperparameters() does not handle them"
            )

    # -- Ray Trainable API --------------------------------------------------
    @override
    def setup(self, config: dict[str, Any]) -> None:
        self.device = trial_device()
        self._init_state(config)

    def _init_state(self, config: dict[str, Any]) -> None:
        seed = config.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"{type(self).__name__}(config['seed']={seed!r}): must be an int")
        owner = f"{type(self).__name__}.reusable_keys"
        key = reusable_key(config, type(self).reusable_keys, owner=owner)
        self.reusable = self._reusable_slot.get(key, lambda: self.build_reusable(config))
        self._kept_bytes = allocated_bytes()
        seed_everything(seed)
        state = self.build(config)
        if not isinstance(state, TrainingState):
            raise ConfigError(
                f"{type(self).__name__}.build() must return a tunekit.TrainingState, "
                f"got {type(state).__name__}"
            )
        self.state = state
        self._saved: tuple[int, Any] | None = None
        # A warm start (config[WARM_START_KEY]) shapes the start; Tune's restore, if any, comes after.
        started = apply_warm_start(state, config, mutable=self.mutable(), apply=self.apply_hyperparameters)
        self._align_iteration = bool(started)

    #: After a warm start that continues from iteration N: report N+1 next (Ray's counter starts at 0).
    _align_iteration = False

    @override
    def step(self) -> dict[str, Any]:
        raise_failed_clone(self)
        metrics = self.train_iteration()
        if not isinstance(metrics, dict):
            raise ConfigTypeError(
                f"{type(self).__name__}.train_iteration() must return a dict, "
                f"got {type(metrics).__name__}"
            )
        self.state.counters.iteration += 1
        if self._align_iteration:
            self._align_iteration = False
            _ray.set_iteration(self, self.state.counters.iteration - 1)  # Ray adds the 1
        self._metrics = dict(metrics)  # what the trial reported, before Ray adds its fields
        return metrics

    _metrics: dict[str, Any] | None = None

    @property
    def _saves(self) -> BackgroundSaves:
        saves = self.__dict__.get("_background")
        if saves is None:
            saves = self.__dict__["_background"] = BackgroundSaves()
        return saves

    def _wait_for_saves(self) -> None:
        if "_background" in self.__dict__:
            self._saves.wait()

    @override
    def save(self, checkpoint_dir: str | None = None) -> Any:
        result = None
        if not checkpoint_dir and self._saved is not None and self._saved[0] == self.iteration:
            self._wait_for_saves()
            result = save_again(self, self._saved[1])  # saved already at this iteration: links, no rewrite
        if result is None and not checkpoint_dir and background_saves_enabled(self, type(self).background_saves):
            result = save_snapshot(self, self._saves, lambda buffers: trial_payload(
                self.state, config=self.config, mutable=self.mutable(),
                trainable=trainable_spec(type(self)), metrics=self._metrics,
                into=buffers,
            ))
        elif result is None and not checkpoint_dir:  # into local storage: write once, in place
            self._durable = False
            try:
                result = save_in_place(self, self.save_checkpoint)
            finally:
                self._durable = True
        if result is None:
            result = super().save(checkpoint_dir)
            confirm_remote_upload(result)
        self._saved = (self.iteration, result)
        return result

    _durable = True

    @override
    def save_checkpoint(self, checkpoint_dir: str) -> str:
        save_trial_state(
            checkpoint_dir,
            self.state,
            config=self.config,
            mutable=self.mutable(),
            trainable=trainable_spec(type(self)),
            metrics=self._metrics,
            durable=self._durable,
        )
        return checkpoint_dir

    @override
    def restore(self, checkpoint_path: Any) -> None:
        self._wait_for_saves()  # it may be this worker's own write in flight
        # A local checkpoint is verified while it loads (one pass over the bytes).
        request = local_request(checkpoint_path)
        if request is not None:
            try:
                return super().restore(request)
            except CheckpointError:
                pass  # damaged: find what to restore instead, below
        # Verify first, falling back to the trial's newest good checkpoint.
        result, temps = prepare_restore(checkpoint_path, trial_dir=_ray.local_trial_dir(self))
        if result is None:  # the trial's first checkpoint never completed: start afresh
            self.__dict__.pop("state", None)
            self._init_state(self.config)  # forgets what was saved, too
            _ray.set_restored(self, {})
            return None
        try:
            self._verified = result.checkpoint.path
            super().restore(result)
        finally:
            self._verified = None
            remove_temps(temps)

    _verified: str | None = None

    def tunekit_clone(self, config: dict[str, Any], checkpoint: Any, storage: Any) -> None:
        """A PBT exploit in this worker (tunekit's scheduler): reset to ``config``, then restore ``checkpoint``."""
        clone_in_worker(self, config, checkpoint, storage)

    @override
    def load_checkpoint(self, checkpoint: Any) -> None:
        if not isinstance(checkpoint, str):
            raise ConfigError(
                f"{type(self).__name__}.load_checkpoint(): expected a checkpoint "
                f"directory, got {type(checkpoint).__name__}"
            )
        restore_trial_state(
            checkpoint,
            self.state,
            config=self.config,
            mutable=self.mutable(),
            apply=self.apply_hyperparameters,
            verify=os.path.abspath(checkpoint) != os.path.abspath(self._verified or ""),
        )
        self._saved = None
        self._metrics = checkpoint_metrics(checkpoint)  # what a save before the next step records

    @property
    def _reusable_slot(self) -> ReusableSlot:
        slot = self.__dict__.get("_slot")
        if slot is None:
            slot = self.__dict__["_slot"] = ReusableSlot()
        return slot

    _kept_bytes = 0

    @override
    def reset_config(self, new_config: dict[str, Any]) -> bool:
        # Nothing of the previous trial survives but the declared reusable
        # objects (kept only if their keys are unchanged) and the save buffers
        # (overwritten whole by the next save): rebuild the state. The
        # previous trial's checkpoint write completes first.
        try:
            self._wait_for_saves()
        except CheckpointError as exc:  # the previous trial's; it falls back to its kept checkpoint
            logger.error("tunekit: %s", exc)
        self.__dict__.pop("state", None)
        self._metrics = None
        owner = f"{type(self).__name__}.reusable_keys"
        if self._reusable_slot.key != reusable_key(new_config, type(self).reusable_keys, owner=owner):
            self._reusable_slot.clear()
            self.reusable = None
            self._kept_bytes = 0
        release_memory(self._kept_bytes)
        self._init_state(new_config)
        return True

    @override
    def cleanup(self) -> None:
        # The checkpoint write in flight completes (Tune gives a stopping
        # worker minutes); no wait for background fsyncs: the checkpoint is
        # complete in the page cache and registered already; the fsync only
        # narrows the window in which a machine crash could lose it.
        if "_background" in self.__dict__:
            self.__dict__.pop("_background").close()
        self.__dict__.pop("state", None)
        self._reusable_slot.clear()
        self.reusable = None
        release_memory()

