"""PyTorch Lightning trials with complete checkpoints: :func:`fit` instead of ``trainer.fit``.

Example (a training function given to :func:`tunekit.function_trainable`):

.. code-block:: python

    import lightning.pytorch as pl
    import tunekit
    from tunekit.integrations import lightning as tk_lightning

    def train(config):
        tunekit.seed_everything(config.get("seed", 0))
        model = MyModule(lr=config["lr"])          # a LightningModule
        data = MyDataModule(batch_size=32)         # or dataloaders
        trainer = pl.Trainer(max_epochs=config["epochs"], logger=False,
                             enable_checkpointing=False, enable_progress_bar=False)
        tk_lightning.fit(trainer, model, datamodule=data, config=config)

    tuner = tune.Tuner(tunekit.function_trainable(train), param_space={...},
                       run_config=tune.RunConfig(checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2)))

What a trial does:

* One Tune iteration is one epoch (default) or ``every_n_steps`` optimizer
  steps. Metrics logged with ``self.log`` (``trainer.callback_metrics``,
  validation ones included) plus ``epoch`` and ``step`` are reported.
* Its checkpoints hold Lightning's own checkpoint contents (weights,
  optimizers, LR schedulers, loop progress, callbacks' states, the precision
  plugin/grad scaler, the datamodule's state) and every RNG stream; they are
  taken whenever Tune asks (``CheckpointConfig`` frequency and at-end,
  ``should_checkpoint`` from callbacks, PBT), two-phase like every tunekit
  save.
* Resume (a retry, ``tunekit resume``, a PBT exploit, a ``"continue"`` warm
  start) hands those contents to ``trainer.fit(ckpt_path=...)`` and sets the
  RNG streams before Lightning builds the epoch's data iterator, so the run
  goes on bit-exactly at epoch boundaries; the resumed ``fit`` skips the
  sanity check (the trial ran it when it started).
* A PBT exploit's ``lr``/``momentum``/``weight_decay`` are set on Lightning's
  optimizers after Lightning restored the donor's (schedulers keep their
  schedule on the new base rate); everything else in the config is read by
  the training function, which runs again from the start.

Limits: with ``every_n_steps``, a resume in the middle of an epoch is exact
only if the train dataloader is stateful (has ``state_dict``/``load_state_dict``,
such as torchdata's ``StatefulDataLoader``); Lightning restarts a plain
dataloader's epoch from its first batch. Set ``enable_checkpointing=False``
(Lightning's own ``ModelCheckpoint`` would write a second, blocking copy).
"""

from __future__ import annotations

import inspect
import os
import tempfile
from typing import Any, Mapping

import torch

from tunekit.errors import ConfigTypeError
from tunekit.trial.function import FunctionSession
from tunekit.integrations._common import (
    Reporter, apply_optimizer_values, make_session, new_state, plain_metrics, require
)
from tunekit.trial.rng import restore_rng

__all__ = ["MUTABLE", "dump_checkpoint", "fit"]

#: Hyperparameters a PBT exploit changes in place on Lightning's optimizers.
MUTABLE = ("lr", "momentum", "weight_decay")


def _framework(trainer: Any) -> Any:
    """``lightning.pytorch``, or ``pytorch_lightning`` when the trainer is one of its."""
    if type(trainer).__module__.startswith("pytorch_lightning"):
        return require("pytorch_lightning", extra="lightning", what="PyTorch Lightning")
    return require("lightning.pytorch", extra="lightning", what="PyTorch Lightning")


def dump_checkpoint(trainer: Any) -> dict[str, Any]:
    """Lightning's complete checkpoint contents, without the weights (tunekit saves them as the model).

    The one use of a Lightning internal (``trainer._checkpoint_connector``;
    ``trainer.save_checkpoint`` only writes a file, and a checkpoint taken in
    memory is what makes the save two-phase); ``tests/integrations`` checks it.
    """
    checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
    checkpoint.pop("state_dict", None)
    return checkpoint


_CALLBACKS: dict[str, type] = {}


def _callback_class(pl: Any) -> type:
    """The trial's callback for this Lightning package (``lightning.pytorch`` or ``pytorch_lightning``)."""
    cls = _CALLBACKS.get(pl.__name__)
    if cls is not None:
        return cls

    # A Checkpoint callback: Lightning runs its on_train_epoch_end after the
    # LightningModule's, so metrics logged there are reported too.
    class TunekitCallback(pl.callbacks.Checkpoint):
        def __init__(self, reporter: Reporter, state: Any, ckpt_file: str | None) -> None:
            self.reporter, self.state, self.ckpt_file = reporter, state, ckpt_file

        @property
        def state_key(self) -> str:
            return "TunekitCallback"

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            self.state.dump = lambda: dump_checkpoint(trainer)
            if self.state.pending_rng is not None:  # before fit builds the train data iterator
                restore_rng(self.state.pending_rng)
                self.state.pending_rng = None

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            # Lightning has restored its optimizers from the checkpoint by now.
            if self.ckpt_file is not None:
                _remove(self.ckpt_file)
                self.ckpt_file = None
            if self.state.pending_changes:
                schedulers = [c.scheduler for c in trainer.lr_scheduler_configs]
                apply_optimizer_values(list(trainer.optimizers), schedulers, self.state.pending_changes,
                                       previous=self.state.hparams)
                self.state.pending_changes = {}

        def _metrics(self, trainer: Any) -> dict[str, Any]:
            metrics = plain_metrics(trainer.callback_metrics)
            metrics.update(epoch=trainer.current_epoch, step=trainer.global_step)
            return metrics

        # Reported where Lightning's own ModelCheckpoint saves (the end of an epoch, after
        # validation and the module's hook; the end of a batch), which is what Lightning
        # knows how to resume from.
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.reporter.step_done(trainer.global_step, lambda: self._metrics(trainer))
            self.reporter.fire(epoch=trainer.current_epoch, step=trainer.global_step)

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            self.reporter.epoch_done(lambda: self._metrics(trainer))
            self.reporter.fire(epoch=trainer.current_epoch + 1, step=trainer.global_step)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self.reporter.final(trainer.global_step, lambda: self._metrics(trainer))
            self.reporter.fire(epoch=trainer.current_epoch, step=trainer.global_step)

    _CALLBACKS[pl.__name__] = TunekitCallback
    return TunekitCallback


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _restore_through_lightning(trainer: Any, model: Any, state: Any) -> tuple[str | None, dict[str, Any]]:
    """What Tune restored (or a "continue" warm start) as a ``ckpt_path`` Lightning restores: (file, fit kwargs)."""
    if state.restored is None:
        return None, {}
    contents = dict(state.restored, state_dict=model.state_dict())
    fd, ckpt_file = tempfile.mkstemp(prefix="tunekit-lightning-", suffix=".ckpt")
    os.close(fd)
    torch.save(contents, ckpt_file)
    state.restored = None
    trainer.num_sanity_val_steps = 0  # ran when the trial started; it would draw random numbers now
    kwargs: dict[str, Any] = {"ckpt_path": ckpt_file}
    if "weights_only" in inspect.signature(trainer.fit).parameters:
        kwargs["weights_only"] = True  # it passed tunekit's weights_only load already
    return ckpt_file, kwargs


def fit(
    trainer: Any,
    model: Any,
    *,
    config: Mapping[str, Any],
    train_dataloaders: Any = None,
    val_dataloaders: Any = None,
    datamodule: Any = None,
    every_n_steps: int | None = None,
    mutable: tuple[str, ...] = MUTABLE,
    name: str | None = None,
) -> FunctionSession:
    """Run ``trainer.fit(model, ...)`` as this Tune trial, with complete checkpoints.

    Call it inside a training function given to :func:`tunekit.function_trainable`,
    where you would call ``trainer.fit``. See the module doc for what it does.

    Args:
        trainer: A ``lightning.pytorch.Trainer`` (or ``pytorch_lightning.Trainer``).
        model: The ``LightningModule``.
        config: The trial's config.
        train_dataloaders, val_dataloaders, datamodule: As for ``Trainer.fit``.
        every_n_steps: One Tune iteration per this many optimizer steps
            (default None: one per epoch).
        mutable: Hyperparameters a PBT exploit sets on the live optimizers.
        name: Recorded in the checkpoints' metadata (default: the training function).

    Returns:
        The trial's :class:`~tunekit.FunctionSession` (after training).

    Raises:
        ImportError: Lightning is not installed (says what to install).
        ConfigTypeError: ``trainer`` or ``model`` is not Lightning's.
    """
    pl = _framework(trainer)
    if not isinstance(trainer, pl.Trainer):
        raise ConfigTypeError(f"tunekit.integrations.lightning.fit(trainer={type(trainer).__name__}): "
                              f"expected a {pl.__name__}.Trainer")
    if not isinstance(model, pl.LightningModule):
        raise ConfigTypeError(f"tunekit.integrations.lightning.fit(model={type(model).__name__}): "
                              f"expected a {pl.__name__}.LightningModule")
    state = new_state("lightning", model)
    session = make_session(state, config=config, mutable=mutable, name=name)
    reporter = Reporter(session, state, every_n_steps)
    ckpt_file, kwargs = _restore_through_lightning(trainer, model, state)
    callback = _callback_class(pl)(reporter, state, ckpt_file)
    trainer.callbacks.append(callback)
    try:
        trainer.fit(model, train_dataloaders=train_dataloaders, val_dataloaders=val_dataloaders,
                    datamodule=datamodule, **kwargs)
    finally:
        trainer.callbacks.remove(callback)
        if ckpt_file is not None:
            _remove(ckpt_file)
    return session
