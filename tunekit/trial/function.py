"""Checkpoint-complete function trainables.

Ray Tune refuses ``CheckpointConfig(checkpoint_frequency=..., checkpoint_at_end=...)``
for function trainables, and a callback's ``should_checkpoint`` does nothing
for them: the driver asks the worker to save, and the worker has nothing to
save. tunekit closes the gap with two pieces:

* :class:`FunctionSession`, used *inside* the training function: it owns the
  :class:`~tunekit.TrainingState`, restores it from ``tune.get_checkpoint()``
  and reports metrics (``report(metrics, checkpoint=True)`` checkpoints now);
* :func:`function_trainable`, which wraps the training function into a
  trainable that Tune treats like a class trainable. Whenever Tune asks the
  trial to save (checkpoint frequency, at end, a callback or the trainable
  setting ``should_checkpoint``, PBT), the wrapper writes the state of the
  session *at the iteration just reported*. That is safe: Tune's function
  runner blocks the training thread inside ``tune.report`` until the driver
  lets it continue, so the state is exactly that of the reported iteration.

Semantics, compared with the class API (:class:`~tunekit.TorchTrainable`):

* ``checkpoint_frequency=N``: checkpoints after iterations N, 2N, ... - same.
* ``checkpoint_at_end``: after the last iteration - same; like class
  trainables, it defaults to ``True`` when left unset.
* ``result["should_checkpoint"] = True`` set by a callback: a checkpoint of
  that very iteration - same.
* The training code asks with ``session.report(metrics, checkpoint=True)``:
  the checkpoint is reported with those metrics - same as a class trainable's
  ``should_checkpoint`` in its result.
* One iteration is written once: a second save of it (PBT's save and the
  frequency at one result) is a checkpoint of hard links to the first -
  same.
* On local storage a save returns after an in-memory snapshot of the state
  and the checkpoint is written on a helper thread (two-phase saves, see
  :mod:`tunekit.trial._saving`) - same.
* Without the wrapper (a plain function given to Tune) only checkpoints the
  training code asks for are taken; Ray refuses frequency and at-end then.
"""

from __future__ import annotations

import inspect
import shutil
import tempfile
from typing import Any, Callable, Mapping

from ray import tune
from ray.tune.result import RESULT_DUPLICATE
from typing_extensions import override

from tunekit import _ray
from tunekit.trial.kind import TrainableKind
from tunekit.trial._checkpointer import TrialCheckpointer, TrialContent
from tunekit.trial._restoring import align_iteration, raise_failed_clone
from tunekit.checkpoint._pins import unpinned
from tunekit.trial._saving import write_and_report
from tunekit.errors import CheckpointError, ConfigError, ConfigTypeError
from tunekit.trial.hparams import DEFAULT_MUTABLE, apply_hyperparameters
from tunekit.trial.state import TrainingState

__all__ = ["FunctionSession", "function_trainable"]

#: The adapter of each trial whose training function runs in this process, by trial id: a
#: :class:`FunctionSession` made by that function attaches itself to it (:meth:`_CheckpointingFunctionTrainable.attach`).
_RUNNING: dict[str, "_CheckpointingFunctionTrainable"] = {}


def _running_adapter() -> "_CheckpointingFunctionTrainable | None":
    """The adapter running the training function that calls this, if any (by Tune's trial id)."""
    if not _RUNNING:  # not inside a wrapped function (plain Ray, a test): don't ask Tune
        return None
    return _RUNNING.get(tune.get_context().get_trial_id())


class FunctionSession:
    """Owns a function trainable's training state: restore, report, checkpoint.

    Create it after building the state; it restores from
    ``tune.get_checkpoint()`` when Tune resumes the trial.

    Example:
        .. code-block:: python

            def train(config):
                state = TrainingState(models={"model": model}, optimizers={"opt": opt})
                session = FunctionSession(state, config=config)
                while session.iteration < config["iterations"]:
                    loss = train_one_epoch(state)
                    session.report({"loss": loss})

    Args:
        state: The training state to checkpoint.
        config: The trial's config (records hyperparameters; mutated ones are
            applied after a PBT exploit).
        mutable: Hyperparameters that may change in place (default ``lr``,
            ``momentum``, ``weight_decay``, ``batch_size``).
        apply: How to apply changed hyperparameters (default handles those four).
        name: Name recorded in the checkpoint metadata (default: the training
            function's ``module:qualname``, which ``tunekit resume`` imports).
    """

    def __init__(
        self,
        state: TrainingState,
        *,
        config: Mapping[str, Any] | None = None,
        mutable: tuple[str, ...] = DEFAULT_MUTABLE,
        apply: Callable[[dict[str, Any]], None] | None = None,
        name: str | None = None,
    ) -> None:
        if not isinstance(state, TrainingState):
            raise ConfigError(
                f"FunctionSession(state={type(state).__name__}): expected a tunekit.TrainingState"
            )
        self.state = state
        self.config = dict(config or {})
        self.mutable = tuple(mutable)
        adapter = _running_adapter()
        if name is None and adapter is not None:
            fn = type(adapter).tunekit_trainable.train_fn
            name = f"{fn.__module__}:{fn.__qualname__}"
        if name is None:
            name = "function"
        self.name = name
        self.content = TrialContent(state, self.config, self.mutable, apply or self._default_apply, name)
        self.restored_from: str | None = None
        checkpoint = tune.get_checkpoint()
        if checkpoint is not None:
            self._restore(checkpoint, adapter)
        else:
            # A warm start in the trial's config (tunekit.warm_start), when not restoring.
            started = self.content.warm_start({**(getattr(adapter, "config", None) or {}), **self.config})
            if started and adapter is not None:
                _ray.set_iteration(adapter, started)  # Ray's counter goes on from the checkpoint's iteration
        if adapter is not None:
            adapter.attach(self)
        self._adapter = adapter

    def _restore(self, checkpoint: tune.Checkpoint, adapter: Any) -> None:
        """Load what Tune hands back: the adapter verified it already (``prepare_restore``), so in one pass."""
        with checkpoint.as_directory() as directory:
            verify = adapter is None or adapter.checkpointer.must_verify(checkpoint.path)
            self.content.load(directory, verify=verify)
        self.restored_from = unpinned(checkpoint.path)  # a PBT donor's: its checkpoint, not the pin read
        if adapter is not None:  # loaded: its temporary copies (a pinned donor's too) can go
            adapter.checkpointer.loaded()
            align_iteration(adapter, self.state.counters.iteration, checkpoint.path)

    def _default_apply(self, changed: dict[str, Any]) -> None:
        unhandled = apply_hyperparameters(self.state, changed)
        if unhandled:
            raise ConfigError(
                f"FunctionSession: hyperparameters {unhandled} are declared mutable "
                "but no apply= function handles them"
            )

    @property
    def iteration(self) -> int:
        """Iterations reported so far, restored ones included."""
        return self.state.counters.iteration

    def save(self, directory: str, *, durable: bool = True) -> None:
        """Write a tunekit checkpoint of the current state into ``directory``.

        ``durable=False``: see :func:`tunekit.checkpoint._directory.write_checkpoint`.
        """
        self.content.write(directory, durable=durable)

    def payload(self, into: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(state dict, metadata)`` of a checkpoint of the current state (``into``: snapshot buffers)."""
        return self.content.payload(into=into)

    def report(self, metrics: dict[str, Any], *, checkpoint: bool = False) -> None:
        """Count one iteration and report ``metrics`` to Tune.

        Args:
            metrics: The iteration's metrics.
            checkpoint: Write a checkpoint of this iteration and report it.
        """
        self.state.counters.iteration += 1
        self.content.metrics = dict(metrics)  # what the trial reported, before Ray adds its fields
        keys = self._adapter.checkpointer.result_keys() if self._adapter is not None else None
        metrics = {**keys, **metrics} if keys else metrics  # the last save's cost; whose checkpoint was restored
        if not checkpoint:
            return tune.report(metrics)
        directory = tempfile.mkdtemp(prefix="tunekit-ckpt-")
        try:
            self.save(directory)
            _ray.report_with_checkpoint(metrics, directory)  # (to remote storage: its manifest last)
        finally:
            shutil.rmtree(directory, ignore_errors=True)


@_ray.adopt_function_runner
class _CheckpointingFunctionTrainable(tune.Trainable):
    """Runs a training function like Ray's FunctionTrainable, but can save on request.

    Deliberately *not* a subclass of ``FunctionTrainable``: Tune then accepts
    ``checkpoint_frequency``/``checkpoint_at_end`` and asks it to save, and
    ``save`` writes the state of the function's :class:`FunctionSession`.
    Ray's function runner (``setup``, ``step``, ``execute``) is reused as is
    (:func:`tunekit._ray.adopt_function_runner`).
    """

    #: What this trainable is: a function trainable, its training function (set by :func:`function_trainable`).
    tunekit_trainable: TrainableKind

    #: The running training function's session, once it made one (it attaches itself).
    _session: FunctionSession | None = None

    @property
    def checkpointer(self) -> TrialCheckpointer:
        """This trial's :class:`~tunekit.trial._checkpointer.TrialCheckpointer`."""
        checkpointer = self.__dict__.get("_tunekit_checkpointer")
        if checkpointer is None:
            checkpointer = self.__dict__["_tunekit_checkpointer"] = TrialCheckpointer(self)
        return checkpointer

    def attach(self, session: FunctionSession) -> None:
        """The training function's session registers: saves now write its state."""
        self._session = session

    def _trainable_func(self, config: dict[str, Any]) -> Any:
        trial_id = self.trial_id
        _RUNNING[trial_id] = self
        try:
            output = type(self).tunekit_trainable.train_fn(config)
        finally:
            if _RUNNING.get(trial_id) is self:  # (not a newer worker of its id: a stopped one's thread may end late)
                del _RUNNING[trial_id]
        if isinstance(output, dict) and output:
            _ray.session_report(output)
        elif self.iteration == 0 and _ray.last_reported(self) is None:  # (nothing reported, nothing restored)
            fn = type(self).tunekit_trainable.train_fn
            raise ConfigError(f"{fn.__module__}.{fn.__qualname__}: the training function returned without reporting "
                              "anything; report each iteration (FunctionSession.report or tune.report)")
        _ray.session_report({RESULT_DUPLICATE: True})
        return output

    @override
    def save(self, checkpoint_dir: str | None = None) -> Any:
        self._finish_reset()
        reported = _ray.last_reported(self)
        if reported is not None and reported.checkpoint is not None:
            reported.metrics.update(_ray.last_result(self))  # the training code's own checkpoint
        else:
            reported = None
        content = self._session.content if self._session is not None else None
        return self.checkpointer.save(content, checkpoint_dir, fallback=self._save_elsewhere, reported=reported)

    def _save_elsewhere(self, checkpoint_dir: str | None) -> Any:
        """Into a directory Ray named, or written to a temporary one that Ray uploads."""
        write = self._elsewhere_writer()
        if write is None:  # nothing to save
            return _ray.TrainingResult(checkpoint=None, metrics=_ray.last_result(self))
        if not checkpoint_dir:
            return write_and_report(self, write)
        write(checkpoint_dir)
        return _ray.report_checkpoint_dir(self, checkpoint_dir)

    def _elsewhere_writer(self) -> Callable[[str], Any] | None:
        """What writes this trial's checkpoint into a directory; None before the function made its session."""
        return None if self._session is None else self._session.save

    def tunekit_sync_saves(self) -> None:
        """Every save of this worker completes its write before it returns (Ray's own PBT: see ``tunekit._ray``)."""
        self.checkpointer.sync_saves()

    def tunekit_sync_next_save(self) -> None:
        """Tune is ending this trial: its last save completes before it returns (see ``TrialCheckpointer``)."""
        self.checkpointer.sync_next_save()

    def tunekit_clone(self, config: dict[str, Any], checkpoint: Any, storage: Any) -> None:
        """A PBT exploit in this worker (tunekit's scheduler): reset to ``config``, then restore ``checkpoint``."""
        self.checkpointer.clone(config, checkpoint, storage)

    @override
    def train(self) -> dict[str, Any]:
        raise_failed_clone(self)
        self._finish_reset()
        return super().train()

    @override
    def restore(self, checkpoint_path: Any) -> None:
        self._finish_reset()
        # Verified (falling back to the trial's newest good checkpoint) and
        # local; the session loads it when the training function starts.
        self.checkpointer.restore(checkpoint_path, load=self._hand_to_session,
                                  afresh=lambda: _ray.set_restored(self, {}))

    def _hand_to_session(self, result: Any) -> None:
        _ray.set_restored(self, result.metrics)
        _ray.give_session_checkpoint(result.checkpoint)

    @override
    def cleanup(self) -> None:
        self.__dict__.pop("_deferred_reset", None)
        _ray.function_runner_cleanup(self)
        self.checkpointer.close()

    @override
    def reset_config(self, new_config: dict[str, Any]) -> bool:
        # The training function runs again from the start on the new config; objects it declared with
        # tunekit.reusable() stay if their keys match. Ray's reset of its function runner (it stops the
        # previous trial's thread) is deferred to the new trial's first call, and the previous trial's write
        # in flight is not waited for: Tune's ``reset`` returns at once (a worker that dies while Tune waits
        # for it errors the trial being started; see ``TorchTrainable.reset_config``).
        self.checkpointer.reset()
        self._session = None
        _ray.clear_last_reported(self)
        self.__dict__["_deferred_reset"] = new_config
        return True

    def _finish_reset(self) -> None:
        """Reset Ray's function runner for the config a reset deferred (nothing when there is none)."""
        config = self.__dict__.pop("_deferred_reset", None)
        if config is not None and not _ray.function_runner_reset(self, config):
            raise CheckpointError(f"{type(self).__name__}: the previous trial's training function did not stop "
                                  "within TUNE_FUNCTION_THREAD_TIMEOUT_S seconds; this worker cannot take a new trial")


def function_trainable(
    train_fn: Callable[[dict[str, Any]], Any], *, name: str | None = None, mutable: tuple[str, ...] | None = None
) -> type[tune.Trainable]:
    """Wrap a training function that uses :class:`FunctionSession` into a trainable.

    The result goes to ``tune.Tuner`` like any trainable and honours
    ``CheckpointConfig(checkpoint_frequency=..., checkpoint_at_end=...)``,
    ``should_checkpoint`` from callbacks, and PBT saves.

    Args:
        train_fn: ``train_fn(config)``, reporting through a FunctionSession.
        name: The trainable's name (default: the function's name).
        mutable: The hyperparameters the function's session changes in place
            (what :func:`tunekit.schedule.pbt.pbt_setup` accepts as mutations; default
            :data:`~tunekit.trial.hparams.DEFAULT_MUTABLE`). A function that trains through a
            framework integration declares the integration's: ``mutable=tk_lightning.MUTABLE``.

    Raises:
        TypeError: ``train_fn`` is not a function of exactly one argument.
    """
    if not callable(train_fn):
        raise ConfigTypeError(f"function_trainable({train_fn!r}): expected a function")
    if isinstance(train_fn, type) and issubclass(train_fn, tune.Trainable):
        raise ConfigTypeError(
            f"function_trainable({train_fn.__name__}): {train_fn.__name__} is a Trainable class already; "
            "give it to tune.Tuner as it is (function_trainable wraps a training function)"
        )
    params = list(inspect.signature(train_fn).parameters.values())
    if len(params) != 1 or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise ConfigTypeError(
            f"function_trainable({getattr(train_fn, '__name__', train_fn)}): the function "
            "must take exactly one argument, config"
        )
    label = name or getattr(train_fn, "__name__", "function")
    namespace: dict[str, Any] = {"tunekit_trainable": TrainableKind(train_fn), "_name": label, "__module__": __name__}
    if mutable is not None:
        if isinstance(mutable, str) or not all(isinstance(k, str) for k in mutable):
            raise ConfigTypeError(f"function_trainable(mutable={mutable!r}): expected a tuple of config keys")
        keys = tuple(mutable)
        namespace["mutable"] = classmethod(lambda cls: keys)
    return type(label, (_CheckpointingFunctionTrainable,), namespace)
