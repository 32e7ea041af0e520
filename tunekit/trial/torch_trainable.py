"""``TorchTrainable``: a Ray Tune class trainable whose checkpoints are complete.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

import torch
from ray import tune
from typing_extensions import override

from tunekit import _ray
from tunekit.trial.device import allocated_bytes, release_memory, trial_device
from tunekit.errors import ConfigError, ConfigTypeError
from tunekit.trial.hparams import DEFAULT_MUTABLE, apply_hyperparameters
from tunekit.trial.reuse import ReusableSlot, reusable_key
from tunekit.trial.rng import seed_everything
from tunekit.trial.state import TrainingState
from tunekit.trial._checkpointer import BACKGROUND_MIN_BYTES, TrialCheckpointer, TrialContent
from tunekit.trial._restoring import align_iteration, raise_failed_clone
from tunekit.trial._saving import trainable_spec, write_and_report

__all__ = ["TorchTrainable"]



class TorchTrainable(tune.Trainable):
    """Base class for PyTorch class trainables with bit-exact checkpoints.

    Subclasses implement two methods:

    * :meth:`build` returns a :class:`~tunekit.TrainingState` (models,
      optimizers, schedulers, scaler, data stream) built on ``self.device``;
    * :meth:`train_iteration` runs one iteration on ``self.state`` and returns
      its metrics.

    The base class seeds every RNG from ``config["seed"]`` (default 0), places
    the work on the GPU Ray assigned to the trial (else the CPU), saves and
    loads the *whole* state (see :mod:`tunekit.checkpoint._directory`), applies mutated
    hyperparameters on PBT exploits, rebuilds the state on ``reset_config`` so
    ``reuse_actors=True`` is safe, and frees GPU memory in ``cleanup``.

    Reuse: what depends on the config only through a few keys (a dataset on
    the device, buffers) may be declared reusable: list the keys in
    ``reusable_keys`` and build it in :meth:`build_reusable`; ``build`` reads
    it as ``self.reusable``. A reused worker keeps it while those keys keep
    their values (see :mod:`tunekit.trial.reuse`). ``reset_config`` costs a rebuild
    of the state and nothing else: no ``gc.collect()`` on the CPU, and on a
    GPU only when memory beyond the reusable objects is still allocated
    (:func:`tunekit.release_memory`).

    Hyperparameters in :data:`~tunekit.trial.hparams.DEFAULT_MUTABLE` (``lr``,
    ``momentum``, ``weight_decay``, ``batch_size``) plus those listed in
    ``mutable_hyperparameters`` may change during a trial; override
    :meth:`apply_hyperparameters` for the extra ones.

    Saves are two-phase on local storage (``background_saves``, on by
    default): :meth:`save` returns once the state is copied into reused CPU
    buffers (pinned ones from a GPU), and a helper thread writes the
    checkpoint while training goes on; at most one write is in flight, and
    restore, ``reset_config`` and ``cleanup`` wait for it. The extra memory
    is one copy of the state's tensors. See :mod:`tunekit.trial._saving`
    for what holds if the worker dies during such a write. Set
    ``background_saves = False`` in a subclass, or ``TUNEKIT_BACKGROUND_SAVES=0``
    in the workers' environment, to write before ``save`` returns. A state
    under ``background_saves_min_bytes`` of tensors (models and optimizers)
    is always written before ``save`` returns: a helper thread would cost it
    more than the write.

    When Ray asks again for the same iteration (say a PBT save and a
    ``checkpoint_frequency`` hit), the second checkpoint is a directory of
    hard links to the first one's files (:func:`~tunekit.trial._saving.save_again`).
    """

    #: Two-phase saves (see above); ``TUNEKIT_BACKGROUND_SAVES=0`` turns them off everywhere.
    background_saves: ClassVar[bool] = True
    #: States with fewer tensor bytes are written before ``save`` returns (0: every save two-phase).
    background_saves_min_bytes: ClassVar[int] = BACKGROUND_MIN_BYTES

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
        self._content = TrialContent(state, config, self.mutable(), self.apply_hyperparameters,
                                     trainable_spec(type(self)))
        # A warm start (config[WARM_START_KEY]) shapes the start; Tune's restore, if any, comes after.
        self._align_iteration = bool(self._content.warm_start(config))

    #: After a warm start that continues from iteration N: report N+1 next (Ray's counter starts at 0).
    _align_iteration = False

    @override
    def step(self) -> dict[str, Any]:
        raise_failed_clone(self)
        self._build_deferred()
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
        self._content.metrics = dict(metrics)  # what the trial reported, before Ray adds its fields
        keys = self._checkpointer.result_keys()  # the last save's cost; whose checkpoint a restore loaded
        return {**keys, **metrics} if keys else metrics

    _content: TrialContent

    @property
    def _checkpointer(self) -> TrialCheckpointer:
        checkpointer = self.__dict__.get("_tunekit_checkpointer")
        if checkpointer is None:
            checkpointer = TrialCheckpointer(self, background=type(self).background_saves)
            self.__dict__["_tunekit_checkpointer"] = checkpointer
        return checkpointer

    @override
    def save(self, checkpoint_dir: str | None = None) -> Any:
        return self._checkpointer.save(self._content, checkpoint_dir, fallback=self._save_through_ray)

    def _save_through_ray(self, checkpoint_dir: str | None) -> Any:
        """Where tunekit does not write the checkpoint in place (remote storage, a directory Ray named):
        written here and persisted by Ray, to remote storage with the manifest last."""
        if checkpoint_dir or _ray.trainable_storage(self) is None:
            return super().save(checkpoint_dir)
        return write_and_report(self, self.save_checkpoint)

    @override
    def save_checkpoint(self, checkpoint_dir: str) -> str:
        self._content.write(checkpoint_dir)
        return checkpoint_dir

    @override
    def restore(self, checkpoint_path: Any) -> None:
        try:
            self._checkpointer.restore(checkpoint_path, load=super().restore, afresh=self._start_afresh,
                                       direct=super().restore)
            align_iteration(self, self.state.counters.iteration, str(getattr(checkpoint_path, "checkpoint",
                                                                          checkpoint_path)))
        finally:
            self._checkpointer.loaded()

    def _start_afresh(self) -> None:
        """The trial's first checkpoint never completed: build the state anew, as if never saved."""
        self.__dict__.pop("state", None)
        self.__dict__.pop("_deferred_config", None)
        self._init_state(self.config)
        _ray.set_restored(self, {})

    def tunekit_sync_saves(self) -> None:
        """Every save of this worker completes its write before it returns (Ray's own PBT: see ``tunekit._ray``)."""
        self._checkpointer.sync_saves()

    def tunekit_sync_next_save(self) -> None:
        """Tune is ending this trial: its last save completes before it returns (see ``TrialCheckpointer``)."""
        self._checkpointer.sync_next_save()

    def tunekit_clone(self, config: dict[str, Any], checkpoint: Any, storage: Any) -> None:
        """A PBT exploit in this worker (tunekit's scheduler): reset to ``config``, then restore ``checkpoint``."""
        self._checkpointer.clone(config, checkpoint, storage)

    @override
    def load_checkpoint(self, checkpoint: Any) -> None:
        if not isinstance(checkpoint, str):
            raise ConfigError(
                f"{type(self).__name__}.load_checkpoint(): expected a checkpoint "
                f"directory, got {type(checkpoint).__name__}"
            )
        self._content.load(checkpoint, verify=self._checkpointer.must_verify(checkpoint))

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
        #
        # The rebuild is deferred to the new trial's first use of its state (its restore, step or save):
        # Tune's ``reset`` returns at once. A worker that dies while Tune waits for ``reset`` has its
        # death reported twice (the actor's and the task's), and Tune errors the trial it was starting
        # instead of retrying it; the shorter ``reset``, the rarer that is. For the same reason the
        # previous trial's write in flight is not waited for here (see ``TrialCheckpointer.reset``).
        self._checkpointer.reset()
        self.__dict__.pop("state", None)
        self.__dict__.pop("_content", None)
        owner = f"{type(self).__name__}.reusable_keys"
        if self._reusable_slot.key != reusable_key(new_config, type(self).reusable_keys, owner=owner):
            self._reusable_slot.clear()
            self.reusable = None
            self._kept_bytes = 0
        self.__dict__["_deferred_config"] = new_config
        return True

    def _build_deferred(self) -> None:
        """Build the state a reset deferred (nothing to do when there is none)."""
        config = self.__dict__.pop("_deferred_config", None)
        if config is not None:
            release_memory(self._kept_bytes)
            self._init_state(config)

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not set: ``state`` and ``_content`` after a reset, built on first use.
        if name in ("state", "_content") and "_deferred_config" in self.__dict__:
            self._build_deferred()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @override
    def cleanup(self) -> None:
        # The checkpoint write in flight completes (Tune gives a stopping worker minutes).
        if "_tunekit_checkpointer" in self.__dict__:
            self.__dict__.pop("_tunekit_checkpointer").close()
        self.__dict__.pop("state", None)
        self.__dict__.pop("_deferred_config", None)
        self._reusable_slot.clear()
        self.reusable = None
        release_memory()

