"""Hugging Face ``Trainer`` trials with complete checkpoints: :func:`train` instead of ``trainer.train()``.

Example (a training function given to :func:`tunekit.function_trainable`):

.. code-block:: python

    import transformers
    import tunekit
    from tunekit.integrations import transformers as tk_transformers

    def train(config):
        model = transformers.AutoModelForSequenceClassification.from_config(my_config)
        args = transformers.TrainingArguments(
            output_dir="hf", learning_rate=config["lr"], num_train_epochs=config["epochs"],
            eval_strategy="epoch", logging_strategy="epoch", save_strategy="no", report_to="none")
        trainer = transformers.Trainer(model=model, args=args, train_dataset=..., eval_dataset=...)
        tk_transformers.train(trainer, config=config)

    tuner = tune.Tuner(tunekit.function_trainable(train), param_space={...})

What a trial does:

* One Tune iteration is one epoch (default) or ``every_n_steps`` optimizer
  steps. What the Trainer logs (``on_log``: training loss, learning rate,
  ``eval_*`` metrics) since the last iteration is reported, with ``epoch``
  and ``step``.
* Its checkpoints hold what the Trainer's own checkpoint holds (model
  weights, optimizer, LR scheduler, grad scaler, ``trainer_state.json``
  including stateful callbacks) and every RNG stream, as a tunekit checkpoint
  (``state.pt`` with a manifest), taken whenever Tune asks, two-phase like
  every tunekit save.
* Resume (a retry, ``tunekit resume``, a PBT exploit, a ``"continue"`` warm
  start) writes those contents as a Trainer checkpoint directory (the
  files the Trainer writes; :func:`to_trainer_checkpoint` does it for any
  checkpoint of such a trial) and
  calls ``trainer.train(resume_from_checkpoint=...)``: the Trainer skips the
  batches already trained and restores the RNG streams itself, so the run
  goes on bit-exactly, at epoch ends and within an epoch.
* A PBT exploit's ``lr``/``learning_rate``/``weight_decay`` are set on the
  optimizer after the Trainer restored the donor's; the LR scheduler keeps
  its schedule (warm-up, decay) on the new base rate.

Set ``save_strategy="no"``: the Trainer's own checkpoints would be a second,
blocking copy of what tunekit already saves.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import shutil
import tempfile
from typing import Any, Mapping

import numpy as np
import torch

from tunekit.errors import CheckpointError, ConfigTypeError
from tunekit.trial.function import FunctionSession
from tunekit.integrations._common import (
    Reporter, apply_optimizer_values, make_session, new_state, plain_metrics, require
)
from tunekit.trial.rng import capture_rng, restore_rng

__all__ = ["MUTABLE", "dump_trainer", "to_trainer_checkpoint", "train"]

logger = logging.getLogger(__name__)

#: Hyperparameters a PBT exploit changes in place on the Trainer's optimizer.
MUTABLE = ("lr", "learning_rate", "weight_decay")


def dump_trainer(trainer: Any) -> dict[str, Any]:
    """What a Trainer checkpoint holds besides the weights and RNG streams (tunekit saves those itself)."""
    contents: dict[str, Any] = {
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.lr_scheduler.state_dict() if trainer.lr_scheduler is not None else None,
        "trainer_state": _trainer_state(trainer),
    }
    scaler = getattr(getattr(trainer, "accelerator", None), "scaler", None)
    if scaler is not None:
        contents["scaler"] = scaler.state_dict()
    # The Trainer's running sums since its last log (not in its own checkpoints: a run it resumes
    # mid-way logs a different average loss); tunekit keeps those this Trainer has, so what is
    # reported after a resume is what the uninterrupted run reports.
    contents["running"] = {name: (value.detach().clone() if isinstance(value, torch.Tensor) else value)
                           for name in (*_RUNNING, *_RUNNING_NEWER) if hasattr(trainer, name)
                           for value in [getattr(trainer, name)]}
    return contents


#: The Trainer's private running sums kept in a checkpoint (tests/integrations checks they exist), and
#: those only newer Trainers have (transformers 5.17 has no ``_initial_global_step``; requiring it kept
#: none of the sums there, and a resumed run logged another average loss, seen on an H100).
_RUNNING = ("_tr_loss", "_total_loss_scalar", "_globalstep_last_logged", "current_flos")
_RUNNING_NEWER = ("_initial_global_step",)


def _restore_running(trainer: Any, running: Mapping[str, Any]) -> None:
    for name, value in running.items():
        live = getattr(trainer, name, None)
        if isinstance(live, torch.Tensor) and isinstance(value, torch.Tensor):
            live.copy_(value)  # the Trainer keeps a reference to this tensor
        else:
            setattr(trainer, name, value)


def _trainer_state(trainer: Any) -> dict[str, Any]:
    """``trainer_state.json``'s content, with the stateful callbacks' current state (as the Trainer saves it)."""
    from transformers.trainer_callback import ExportableState

    callbacks: dict[str, Any] = {}
    for callback in [*trainer.callback_handler.callbacks, trainer.control]:
        if isinstance(callback, ExportableState):
            name, value = type(callback).__name__, callback.state()
            if name in callbacks:
                before = callbacks[name]
                callbacks[name] = [*(before if isinstance(before, list) else [before]), value]
            else:
                callbacks[name] = value
    content = dataclasses.asdict(trainer.state)
    content["stateful_callbacks"] = callbacks
    return json.loads(json.dumps(content))  # plain JSON values, as in the file


def _hf_rng(rng: dict[str, Any], distributed: bool = False) -> dict[str, Any]:
    """tunekit's RNG capture in the Trainer's ``rng_state.pth`` form (set, read, and put back).

    The CUDA part as the Trainer writes and reads it: every device's state in a distributed run, else the
    current device's alone (a list there made its ``set_rng_state`` fail, logged, and the run went on with
    another dropout stream: a GPU resume that was not bit-exact, seen on an H100)."""
    mine = capture_rng()
    try:
        restore_rng(rng)
        out: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                               "cpu": torch.random.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            cuda = torch.cuda.random
            out["cuda"] = cuda.get_rng_state_all() if distributed else cuda.get_rng_state()
        return out
    finally:
        restore_rng(mine)


def _write_trainer_checkpoint(contents: Mapping[str, Any], weights: Mapping[str, Any], rng: dict[str, Any] | None,
                              directory: str, distributed: bool = False) -> str:
    os.makedirs(directory, exist_ok=True)
    torch.save(dict(weights), os.path.join(directory, "pytorch_model.bin"))
    torch.save(contents["optimizer"], os.path.join(directory, "optimizer.pt"))
    if contents.get("scheduler") is not None:
        torch.save(contents["scheduler"], os.path.join(directory, "scheduler.pt"))
    if contents.get("scaler") is not None:
        torch.save(contents["scaler"], os.path.join(directory, "scaler.pt"))
    with open(os.path.join(directory, "trainer_state.json"), "w") as fh:
        json.dump(contents["trainer_state"], fh, indent=2, sort_keys=True)
    if rng is not None:
        torch.save(_hf_rng(rng, distributed), os.path.join(directory, "rng_state.pth"))
    return directory


def to_trainer_checkpoint(checkpoint: Any, directory: str) -> str:
    """Write a tunekit checkpoint of a Transformers trial out as a Trainer checkpoint directory.

    The files the Trainer writes and ``Trainer.train(resume_from_checkpoint=directory)``
    reads: ``pytorch_model.bin``, ``optimizer.pt``, ``scheduler.pt``,
    ``scaler.pt`` (with a grad scaler), ``trainer_state.json``,
    ``rng_state.pth``. (No ``config.json``: save the model's config with it
    to load it with ``from_pretrained``.)

    Args:
        checkpoint: A tunekit checkpoint (path, URI or ``tune.Checkpoint``); verified as it is read.
        directory: Where to write (created).

    Raises:
        CheckpointError: it is damaged, or not a Transformers trial's checkpoint.
    """
    from tunekit.checkpoint._directory import read_state
    from tunekit.integrations._common import KEY_PREFIX, framework_of

    state = read_state(checkpoint)
    if framework_of(state) != "transformers":
        kind = framework_of(state) or "plain tunekit trainable"
        raise CheckpointError(f"to_trainer_checkpoint({checkpoint}): a {kind} checkpoint; expected one "
                              "written by tunekit.integrations.transformers")
    return _write_trainer_checkpoint(state["extras"][KEY_PREFIX + "transformers"], state["models"]["model"],
                                     state["rng"], directory)


_CALLBACKS: dict[str, type] = {}


def _begin_training(callback: Any) -> None:
    """``on_train_begin``: restore the running metrics, apply PBT's pending values to the restored optimizer."""
    trainer, state = callback.trainer, callback.state
    state.dump = lambda: dump_trainer(trainer)
    if callback.running:  # set just before this hook by the Trainer: zero
        _restore_running(trainer, callback.running)
        callback.running = None
    if state.pending_changes:  # the Trainer restored the donor's optimizer and scheduler by now
        schedulers = [trainer.lr_scheduler] if trainer.lr_scheduler is not None else []
        apply_optimizer_values([trainer.optimizer], schedulers, state.pending_changes, previous=state.hparams)
        state.pending_changes = {}


def _callback_class(transformers: Any) -> type:
    cls = _CALLBACKS.get("transformers")
    if cls is not None:
        return cls

    class TunekitCallback(transformers.TrainerCallback):
        """Reports iterations to Tune and hands PBT's values to the optimizer.

        An iteration is reported at the next step's or epoch's *start*: by then
        the Trainer has logged, evaluated and stepped its scheduler for the
        iteration, and has not yet drawn the next random numbers; that is where
        a run resumed by the Trainer from a checkpoint of that step restores
        its RNG streams.
        """

        def __init__(self, reporter: Reporter, state: Any, trainer: Any, resume_dir: str | None,
                     running: Mapping[str, Any] | None) -> None:
            self.reporter, self.state, self.trainer, self.resume_dir = reporter, state, trainer, resume_dir
            self.running = running
            self.logged: dict[str, Any] = {}

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            _begin_training(self)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            self.logged.update(plain_metrics(logs or {}))

        def _metrics(self, state: Any) -> dict[str, Any]:
            # The latest value of everything logged so far: an iteration that
            # ends between two logs (every_n_steps not a multiple of
            # logging_steps) reports the newest loss rather than none.
            metrics = dict(self.logged)
            metrics.update(epoch=state.epoch, step=state.global_step)
            return metrics

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.resume_dir is not None:  # the Trainer has read it (its RNG file at the latest by now)
                shutil.rmtree(self.resume_dir, ignore_errors=True)
                self.resume_dir = None
            self.reporter.step_done(state.global_step, lambda: self._metrics(state))

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.reporter.epoch_done(lambda: self._metrics(state))

        def _fire(self, state: Any) -> None:
            self.reporter.fire(epoch=int(round(state.epoch or 0)), step=state.global_step)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._fire(state)

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._fire(state)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.reporter.final(state.global_step, lambda: self._metrics(state))
            self._fire(state)

    _CALLBACKS["transformers"] = TunekitCallback
    return TunekitCallback


def train(
    trainer: Any,
    *,
    config: Mapping[str, Any],
    every_n_steps: int | None = None,
    mutable: tuple[str, ...] = MUTABLE,
    name: str | None = None,
) -> FunctionSession:
    """Run ``trainer.train()`` as this Tune trial, with complete checkpoints.

    Call it inside a training function given to :func:`tunekit.function_trainable`,
    where you would call ``trainer.train()``. See the module doc for what it does.

    Args:
        trainer: A ``transformers.Trainer`` (or a subclass).
        config: The trial's config.
        every_n_steps: One Tune iteration per this many optimizer steps
            (default None: one per epoch).
        mutable: Hyperparameters a PBT exploit sets on the live optimizer.
        name: Recorded in the checkpoints' metadata (default: the training function).

    Returns:
        The trial's :class:`~tunekit.FunctionSession` (after training).

    Raises:
        ImportError: transformers is not installed (says what to install).
        ConfigTypeError: ``trainer`` is not a ``transformers.Trainer``.
    """
    transformers = require("transformers", extra="transformers", what="Hugging Face Transformers")
    if not isinstance(trainer, transformers.Trainer):
        raise ConfigTypeError(f"tunekit.integrations.transformers.train(trainer={type(trainer).__name__}): "
                              "expected a transformers.Trainer")
    if str(getattr(trainer.args, "save_strategy", "no")).split(".")[-1].lower() != "no":
        logger.warning("tunekit: TrainingArguments(save_strategy=%r) makes the Trainer write its own checkpoints "
                       "as well; tunekit's are complete: set save_strategy='no'", trainer.args.save_strategy)
    state = new_state("transformers", trainer.model)
    session = make_session(state, config=config, mutable=mutable, name=name)
    reporter = Reporter(session, state, every_n_steps)
    resume_dir = running = None
    if state.restored is not None:  # Tune's checkpoint or a "continue" warm start: the Trainer restores it
        running = state.restored.get("running")
        distributed = getattr(trainer.args.parallel_mode, "value", None) == "distributed"  # as it saves RNG
        resume_dir = _write_trainer_checkpoint(state.restored, trainer.model.state_dict(), state.pending_rng,
                                               tempfile.mkdtemp(prefix="tunekit-hf-"), distributed)
        state.restored = state.pending_rng = None
    callback = _callback_class(transformers)(reporter, state, trainer, resume_dir, running)
    trainer.add_callback(callback)
    try:
        trainer.train(resume_from_checkpoint=resume_dir)
    finally:
        trainer.remove_callback(callback)
        if resume_dir is not None:
            shutil.rmtree(resume_dir, ignore_errors=True)
    return session
