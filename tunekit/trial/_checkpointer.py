"""One trial's checkpointing, shared by both trainables: :class:`TrialCheckpointer` and :class:`TrialContent`.

Implementation tier. :class:`tunekit.TorchTrainable` and the function adapter
(:func:`tunekit.function_trainable`) each own one :class:`TrialCheckpointer`
and supply only what differs between them: the :class:`TrialContent` to save
(what the trial's checkpoint holds), how a restored checkpoint reaches the
trial (loaded at once, or handed to the training function's session), and
how to save where tunekit does not write in place (remote storage).

Call order a trainable follows (Ray's ``Trainable`` method on the left):

* ``save``: :meth:`TrialCheckpointer.save`. It waits for the write in flight,
  then takes the first of: a second save of an iteration saved already (hard
  links, :func:`tunekit.trial._saving.save_again`); a checkpoint the training code
  reported itself; a two-phase save (:func:`tunekit.trial._saving.save_snapshot`);
  a write in place into local storage (:func:`tunekit.trial._saving.save_in_place`);
  the trainable's ``fallback`` (remote storage), whose upload is confirmed.
* ``restore``: :meth:`TrialCheckpointer.restore`, then
  :meth:`TrialCheckpointer.loaded` once the state is loaded. A local
  checkpoint may be loaded ``direct``-ly, verified while it loads
  (:meth:`TrialContent.load` with :meth:`TrialCheckpointer.must_verify`); any
  other, or a damaged one, is resolved by :func:`tunekit.trial._restoring.prepare_restore`
  (verified, falling back to the trial's newest good checkpoint) and given to
  ``load``; a trial whose first write never completed starts ``afresh``.
* a PBT exploit in the worker (``tunekit_clone``): :meth:`TrialCheckpointer.clone`.
* ``reset_config``: :meth:`TrialCheckpointer.reset` before the new trial's state is built.
* ``cleanup``: :meth:`TrialCheckpointer.close`.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from ray import tune

from tunekit import _env, _ray
from tunekit.trial._restoring import clone_in_worker, local_request, prepare_restore, remove_temps, writer_trial
from tunekit.trial._saving import (
    BackgroundSaves, Durability, background_saves_enabled, confirm_remote_upload, release_remote_pin, save_again,
    save_in_place, save_snapshot
)
from tunekit.checkpoint._directory import read_metadata, read_state, write_checkpoint
from tunekit._keys import SAVE_BLOCKED_KEY, SAVE_WRITE_KEY
from tunekit.trial.device import trial_device
from tunekit.errors import CheckpointError
from tunekit.trial.hparams import changed_hyperparameters
from tunekit._keys import RESTORED_FROM_KEY
from tunekit.trial.state import StateBuffers, TrainingState
from tunekit.trial.warm import apply_warm_start

__all__ = ["BACKGROUND_MIN_BYTES", "ORIGIN", "TrialCheckpointer", "TrialContent"]

#: The metadata key of :attr:`TrialContent.origin`.
ORIGIN = "restored_from"

logger = logging.getLogger(__name__)


@dataclass
class TrialContent:
    """What one trial's checkpoints hold, and how one is loaded back into the trial.

    Attributes:
        state: The training state (models, optimizers, ..., counters, RNGs).
        config: The trial's config; its ``mutable`` keys are recorded as the
            checkpoint's hyperparameters.
        mutable: Hyperparameters that may change in place (PBT).
        apply: Applies changed hyperparameters to the live state.
        name: The trainable, ``module:qualname`` (what ``tunekit resume`` imports).
        metrics: The reported metrics of the iteration the state is at (kept
            in the checkpoint's metadata, so it says how good it is).
    """

    state: TrainingState
    config: Mapping[str, Any]
    mutable: tuple[str, ...]
    apply: Callable[[dict[str, Any]], None]
    name: str
    metrics: dict[str, Any] | None = None
    #: Whose checkpoint the state was last restored from, while no result has said so yet (a PBT clone saved
    #: before it reports): kept in the checkpoint, so that a restore of it says so again.
    origin: str | None = None

    def payload(self, into: StateBuffers | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(state dict, metadata)`` of a checkpoint of the state now (``into``: snapshot buffers, reused)."""
        sd = self.state.state_dict(into=into)
        hparams = {k: self.config[k] for k in self.mutable if k in self.config}
        sd["hparams"] = hparams
        metadata = {
            "iteration": self.state.counters.iteration,
            "epoch": self.state.counters.epoch,
            "trainable": self.name,
            "config": dict(self.config),
            "hparams": hparams,
            "device": str(trial_device()),
            "models": sorted(self.state.models),
            "metrics": dict(self.metrics or {}),
        }
        if self.origin:
            metadata[ORIGIN] = self.origin
        return sd, metadata

    def write(self, directory: str | os.PathLike[str], *, durable: bool = True, staged: bool = False) -> None:
        """Write a checkpoint of the state now into ``directory`` (``durable``, ``staged``: see
        :func:`tunekit.write_checkpoint`)."""
        sd, metadata = self.payload()
        write_checkpoint(directory, sd, metadata=metadata, durable=durable, staged=staged)

    def load(self, directory: str | os.PathLike[str], *, verify: bool = True) -> dict[str, Any]:
        """Load a checkpoint into the state, then apply the hyperparameters that changed since.

        A PBT exploit restores the donor's optimizer (with the donor's ``lr``)
        into a trial whose config was just mutated: the mutated values win.
        The checkpoint's metrics become the trial's until it reports again, so
        a save before then (PBT saving a trial just cloned) records them.

        Returns:
            The hyperparameters that differed from the checkpoint and were applied.
        """
        sd = read_state(directory, verify=verify)
        self.state.load_state_dict(sd)
        changed = changed_hyperparameters(sd.get("hparams") or {}, self.config, self.mutable)
        if changed:
            self.apply(changed)
        self.metrics = _recorded_metrics(directory)
        return changed

    def warm_start(self, config: Mapping[str, Any]) -> int | None:
        """Apply the warm start ``config`` names, if any (see :func:`tunekit.trial.warm.apply_warm_start`)."""
        return apply_warm_start(self.state, config, mutable=self.mutable, apply=self.apply)


#: Default of ``background_saves_min_bytes`` (a trainable class may set its own; 0: every local save two-phase).
BACKGROUND_MIN_BYTES = 1 << 20


def _smaller_than(state: TrainingState, limit: int) -> bool:
    """Whether the state's models and optimizers hold fewer than ``limit`` bytes of tensors (stops counting there)."""
    total = 0
    tensors = itertools.chain(
        (t for m in state.models.values() for t in itertools.chain(m.parameters(), m.buffers())),
        (v for o in state.optimizers.values() for s in o.state.values() for v in s.values() if isinstance(v, torch.Tensor)),
    )
    for tensor in tensors:
        total += tensor.numel() * tensor.element_size()
        if total >= limit:
            return False
    return True


def _recorded_metrics(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    try:
        metrics = read_metadata(os.fspath(directory)).get("metrics")
    except CheckpointError:
        return None
    return dict(metrics) if isinstance(metrics, dict) and metrics else None


class TrialCheckpointer:
    """One trial's checkpoints: save, restore with fallback, clone, reset, close (see the module docstring).

    Owns the trial's background saves (at most one write in flight), the last
    save (a second save of its iteration is links), the checkpoint a restore
    verified (loaded without a second pass), the temporary directories of a
    restore, and the trial's :class:`~tunekit.trial._saving.Durability`.

    Args:
        trainable: The Ray trainable this checkpointer saves for.
        background: Two-phase saves on local storage (off as well with
            ``TUNEKIT_BACKGROUND_SAVES=0``).
    """

    def __init__(self, trainable: tune.Trainable, *, background: bool = True) -> None:
        _env.check_all()  # a bad TUNEKIT_* value fails the trial at its start, in one line, not hours later
        self.trainable = trainable
        self.background = background
        #: A state of fewer tensor bytes is written before its save returns (see :meth:`_save_locally`).
        self.background_min_bytes = int(getattr(type(trainable), "background_saves_min_bytes", BACKGROUND_MIN_BYTES))
        self.durability = Durability()
        self.saves: BackgroundSaves | None = None
        self._last: tuple[int, Any] | None = None
        self._verified: str | None = None
        self._temps: list[str] = []
        #: The next save completes its write before it returns (Tune is ending the trial: :meth:`sync_next_save`).
        self._sync_next = False
        #: Every save does (Ray's own PBT, which may pause a trial with its own save: :meth:`sync_saves`).
        self._sync_all = False
        #: What the last save cost (:data:`~tunekit._keys.SAVE_BLOCKED_KEY`, ``SAVE_WRITE_KEY``): the
        #: trainables add it to their next result, for :class:`~tunekit.callbacks.CheckpointAutopilot`.
        self.costs: dict[str, float] = {}
        #: The trial directory whose checkpoint the last restore loaded, until the next result reports it.
        self.restored_from: str | None = None
        #: The trial's local saves go through :attr:`saves` (two-phase), not in place; its state is small.
        self._in_background, self._small = False, False

    def result_keys(self) -> dict[str, Any]:
        """What the trainables add to a result: once after each save, its cost (so each save is one
        measurement) and, once after a restore, whose checkpoint it was
        (:data:`~tunekit._keys.RESTORED_FROM_KEY`)."""
        keys: dict[str, Any] = self.costs
        self.costs = {}
        if self.restored_from is not None:
            keys[RESTORED_FROM_KEY], self.restored_from = self.restored_from, None
        return keys

    def sync_saves(self) -> None:
        """Every save returns once its checkpoint is written (see :func:`tunekit._ray.synchronous_saves`)."""
        self._sync_all = True

    def sync_next_save(self) -> None:
        """The next save returns once its checkpoint is written (the trial's last: see
        :func:`tunekit._ray.finish_next_save_in_place`)."""
        self._sync_next = True

    # -- saving ------------------------------------------------------------------
    def wait(self) -> None:
        """Block until the write in flight (if any) is complete; raise its error."""
        if self.saves is not None:
            self.saves.wait()

    def save(
        self,
        content: TrialContent | None,
        checkpoint_dir: str | None = None,
        *,
        fallback: Callable[[str | None], Any],
        reported: Any = None,
    ) -> Any:
        """Save the trial's checkpoint; returns what Ray's ``Trainable.save`` returns.

        Args:
            content: What to save (None: nothing of tunekit's to save yet).
            checkpoint_dir: A directory Ray named (then ``fallback`` writes there).
            fallback: ``fallback(checkpoint_dir)`` saves as Ray would (remote
                storage, or a directory Ray named); its upload is confirmed.
            reported: A checkpoint the training code reported itself, saved as is.
        """
        iteration, start = self.trainable.iteration, time.perf_counter()
        self.wait()
        result, waits = None, self._sync_next or self._sync_all  # this save returns once its write is done
        if content is not None:
            content.origin = self.restored_from  # (not reported yet: see :meth:`_carried_origin`)
            # (a state under background_min_bytes is written before its save returns: :meth:`_save_locally`)
            self._small = _smaller_than(content.state, self.background_min_bytes)
            self._in_background = background_saves_enabled(self.trainable, self.background) and not self._small
        if not checkpoint_dir and self._last is not None and self._last[0] == iteration:
            result = save_again(self.trainable, self._last[1], durability=self.durability)
        if result is None and reported is not None:
            result = reported
        if result is None and content is not None and not checkpoint_dir:
            result = self._save_locally(content, urgent=waits)
        if result is None:
            result = fallback(checkpoint_dir)
            confirm_remote_upload(result)
            release_remote_pin(self.trainable, result)
        self._last = (iteration, result)
        if waits:
            self._sync_next = False
            self.wait()
        blocked = time.perf_counter() - start
        self.costs = {SAVE_BLOCKED_KEY: blocked}
        if self._in_background:  # (a save written before it returns has no write of its own to report)
            written = self.saves.last_write_s if self.saves is not None else None
            self.costs[SAVE_WRITE_KEY] = blocked if written is None else written
        return result

    def _save_locally(self, content: TrialContent, *, urgent: bool) -> Any:
        """Two-phase or in place into local storage; None when the trial's storage is not local. ``urgent``:
        the save waits for its write (the same two-phase path, at training's priority: see ``BackgroundSaves``).

        A state under :attr:`background_min_bytes` of tensors is written in place, before the save returns:
        its write takes about as long as handing a snapshot to the helper thread, and the helper's thread
        switches, the kept copy of the previous checkpoint and the announcement cost more CPU than it saves.
        It reaches the disk with one ``syncfs`` (see :mod:`tunekit.checkpoint._durability`).
        """
        if self._in_background:
            if self.saves is None:
                self.saves = BackgroundSaves()
            self.saves.urgent = urgent
            return save_snapshot(self.trainable, self.saves, content.payload, durability=self.durability)
        return save_in_place(self.trainable, lambda d: content.write(d, durable=False, staged=True),
                             durability=self.durability, whole_filesystem=self._small)

    # -- restoring ---------------------------------------------------------------
    def restore(
        self,
        checkpoint: Any,
        *,
        load: Callable[[Any], None],
        afresh: Callable[[], None],
        direct: Callable[[Any], None] | None = None,
    ) -> None:
        """Restore ``checkpoint`` (what Ray's ``Trainable.restore`` is given); then call :meth:`loaded`.

        Args:
            load: Loads a verified, local result (its checkpoint is the one
                :meth:`must_verify` says need not be verified again).
            afresh: Starts the trial afresh: its first checkpoint never completed.
            direct: Loads a local checkpoint as it is, verifying while it loads;
                a :class:`~tunekit.CheckpointError` falls back to ``load``'s path.
        """
        self.wait()  # it may be this trial's own write in flight
        self.loaded()
        self._last = None
        self.restored_from = writer_trial(checkpoint)
        if direct is not None and (request := local_request(checkpoint)) is not None:
            try:
                self._carried_origin(request.checkpoint.path)
                return direct(request)
            except CheckpointError:
                pass  # damaged: find what to restore instead, below
        storage = _ray.trainable_storage(self.trainable)
        result, self._temps = prepare_restore(checkpoint, trial_dir=_ray.local_trial_dir(self.trainable),
                                              trial_path=storage.trial_fs_path if storage is not None else None)
        if result is None:
            self.restored_from = None
            return afresh()
        self._carried_origin(result.checkpoint.path)
        self._verified = result.checkpoint.path
        load(result)

    def _carried_origin(self, directory: str) -> None:
        """Restoring the trial's own checkpoint ``directory``: if it was saved after a PBT clone that no result
        had reported yet (its ``restored_from``), the next result reports the donor, not the trial itself.
        Else the exploit is not in the trial's rows when the driver that saw it was killed, and its jump in
        iterations reads as rows lost."""
        storage = _ray.trainable_storage(self.trainable)
        if storage is None or self.restored_from != getattr(storage, "trial_dir_name", None):
            return
        try:
            origin = read_metadata(directory).get(ORIGIN)
        except CheckpointError:
            return
        if isinstance(origin, str) and origin:
            self.restored_from = origin

    def must_verify(self, directory: str | os.PathLike[str]) -> bool:
        """Whether loading ``directory`` must verify it (not the checkpoint :meth:`restore` verified)."""
        return self._verified is None or os.path.abspath(directory) != os.path.abspath(self._verified)

    def loaded(self) -> None:
        """The restored state is loaded: remove the restore's temporary directories."""
        self._verified = None
        remove_temps(self._temps)

    def clone(self, config: dict[str, Any], checkpoint: Any, storage: Any) -> None:
        """A PBT exploit in this worker: reset to ``config``, then restore ``checkpoint``."""
        clone_in_worker(self.trainable, config, checkpoint, storage)

    # -- lifetime ----------------------------------------------------------------
    def reset(self) -> None:
        """Before the worker takes a new trial: nothing of the previous one is kept but its write in flight,
        which goes on (:meth:`~tunekit.trial._saving.BackgroundSaves.hand_over`; the new trial's first save or
        restore waits for it)."""
        if self.saves is not None:
            self.saves.hand_over()
        self._last = None
        self._sync_next = False
        self.loaded()

    def close(self) -> None:
        """At cleanup: the write in flight completes (its error logged), buffers and temporaries go.

        No wait for background fsyncs: the checkpoint is complete in the page
        cache and registered already; the fsync only narrows the window in
        which a machine crash could lose it.
        """
        if self.saves is not None:
            self.saves.close()
            self.saves = None
        self.loaded()
