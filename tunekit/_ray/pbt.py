"""Ray's PBT as tunekit extends it: a donor choice hook, in-place clones, pinned donor checkpoints.

Part of :mod:`tunekit._ray` (the one place Ray's private names are used; see
its docstring for the list). Private names here: ``PopulationBasedTraining``'s
hooks ``_checkpoint_or_exploit`` and ``_exploit``,
``_trial_state[trial].last_train_time`` and ``.last_checkpoint``, ``Trial.temporary_state.saving_to``,
``_FutureTrainingResult``; ``Trial.temporary_state.ray_actor``,
``_TrialInfo`` and the ``TRIAL_INFO``/``STDOUT_FILE``/``STDERR_FILE`` config keys;
the checkpoint manager's ``_latest_checkpoint_result``.
"""

from __future__ import annotations

from typing import Any

from ray import tune
from ray.train._internal.checkpoint_manager import _TrainingResult
from ray.train._internal.session import _FutureTrainingResult
from ray.tune.experiment import Trial
from ray.tune.schedulers import PopulationBasedTraining
from typing_extensions import override

from tunekit._keys import SAVE_BLOCKED_KEY, SAVE_WRITE_KEY

__all__ = [
    "PBTWithDonorChoice", "clone_in_place", "finish_next_save_in_place", "note_saves", "pin_donor_checkpoint",
    "supports_clone", "synchronous_saves"
]


# -- PBT -------------------------------------------------------------------------
class _NoPause:
    """The controller as Ray's ``_exploit`` sees it, with ``pause_trial`` doing nothing."""

    def __init__(self, controller: Any) -> None:
        self._controller = controller

    def pause_trial(self, trial: Any, should_checkpoint: bool = True) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._controller, name)


def supports_clone(trial: Any) -> bool:
    """Whether the trial's trainable can clone a donor in its own worker (tunekit trainables: ``tunekit_clone``).

    Asked of every trial Tune starts and ends: its worker's handle knows its methods (an unknown one is an
    AttributeError); without a worker, the class from Ray's registry (read and unpickled: milliseconds),
    the answer kept in the trial's temporary state, which Ray never saves."""
    state = trial.temporary_state
    if state.ray_actor is not None:
        return hasattr(state.ray_actor, "tunekit_clone")
    known = getattr(state, "tunekit_clones", None)
    if known is None:
        try:
            cls = trial.get_trainable_cls()
        except Exception:  # noqa: BLE001 - unknown or unregistered trainable: Ray's path
            cls = None
        known = state.tunekit_clones = isinstance(cls, type) and callable(getattr(cls, "tunekit_clone", None))
    return known


def clone_in_place(trial: Any) -> None:
    """Have a RUNNING trial's own worker take the trial's (new) config and restore ``trial.latest_checkpoint_result``.

    What Tune does to resume a paused trial in a reused worker (``reset``
    with the trial's config, then ``restore``), as one call on the worker
    (``tunekit_clone``), sent before Tune's next task for the trial: a worker
    runs one caller's calls in order. Tune does not track the call, so only
    its own task in flight can fail if the worker dies (one failure, retried
    from the trial's checkpoint - the donor's - with the new config; two
    tracked tasks failing at once would end the trial in ERROR). A clone
    that fails makes the trial's next step raise its error.
    """
    import copy

    from ray.tune.experiment.trial import _TrialInfo
    from ray.tune.result import STDERR_FILE, STDOUT_FILE, TRIAL_INFO

    extra = copy.deepcopy(trial.config)
    extra[TRIAL_INFO] = _TrialInfo(trial)
    extra[STDOUT_FILE], extra[STDERR_FILE] = trial.log_to_file
    trial.temporary_state.ray_actor.tunekit_clone.remote(extra, trial.latest_checkpoint_result, trial.storage)


def finish_next_save_in_place(trial: Any) -> None:
    """Have a tunekit trial's worker write its next checkpoint before ``save`` returns (``tunekit_sync_next_save``).

    Sent when Tune has decided to end the trial, before Tune asks for its
    last save: a worker ended with a write in flight is stopped, or cached
    and handed to another trial, while it writes; a death then (Ray reports
    it for the trial being started, whose ``reset`` fails) errors that other
    trial, and nothing retries the ended trial's last checkpoint. Untracked
    by Tune, like :func:`clone_in_place`. Sent once per result Tune handles
    (each tunekit callback of the run asks, and the scheduler before a
    pause): the trial's temporary state, never saved, remembers the worker
    and the result it was sent for. Not once per worker: a trial paused and
    resumed in the same worker (actor reuse) asks again at its end.
    """
    state = trial.temporary_state
    if getattr(state, "tunekit_saves_inline", False):  # each save is written before it returns: nothing to ask
        return
    actor = state.ray_actor
    asked = (actor, trial.last_result.get("training_iteration"))  # Tune updates last_result after the callbacks
    if actor is not None and getattr(state, "tunekit_ending", None) != asked and supports_clone(trial):
        actor.tunekit_sync_next_save.remote()
        state.tunekit_ending = asked


def note_saves(trial: Any, result: dict[str, Any]) -> None:
    """Whether the trial's worker writes each checkpoint before its ``save`` returns, from a result after a save:
    tunekit's trainables report ``tunekit/save_write_s`` only for a save whose write runs on after it returned
    (a large state's two-phase save). Kept in the trial's temporary state (never saved), for
    :func:`finish_next_save_in_place`: the last save of a trial whose saves are written at once needs no ask."""
    state = getattr(trial, "temporary_state", None)  # (None: a stand-in for a trial, as in a unit test)
    if state is not None and SAVE_BLOCKED_KEY in result:
        state.tunekit_saves_inline = SAVE_WRITE_KEY not in result


def synchronous_saves(trial: Any, scheduler: Any) -> None:
    """Under Ray's own ``PopulationBasedTraining`` (not tunekit's): every save of the trial's worker completes its
    write before it returns (``tunekit_sync_saves``). Ray's PBT saves a trial it is about to pause inside its own
    result handling and lets the worker go once that save returns; no hook comes before that save to ask for
    it alone (tunekit's scheduler asks, see :meth:`PBTWithDonorChoice.pauses`)."""
    if isinstance(scheduler, PopulationBasedTraining) and not isinstance(scheduler, PBTWithDonorChoice):
        actor = trial.temporary_state.ray_actor
        if actor is not None and supports_clone(trial):
            actor.tunekit_sync_saves.remote()


class PBTWithDonorChoice(PopulationBasedTraining):
    """Ray's PBT with public hooks for whom a trial may clone and how it is cloned.

    Ray decides "exploit or checkpoint" in the private ``_checkpoint_or_exploit``
    and clones in the private ``_exploit``; subclasses override
    :meth:`choose_quantiles` and :meth:`exploit_in_place` instead.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Trials exploited in place at the current result (the subclass answers NOOP for them).
        self.exploited_in_place: set = set()

    def choose_quantiles(self, trial: Any, upper: list, lower: list) -> tuple[list, list]:
        """The (upper, lower) quantiles Ray's exploit decision sees for ``trial``."""
        return upper, lower

    def exploit_in_place(self, trial: Any) -> bool:
        """Whether to clone the donor into ``trial`` in its running worker (default: Ray's pause)."""
        return False

    def pauses(self, tune_controller: Any, trial: Any) -> bool:
        """Whether the result being handled pauses ``trial`` (asked before Ray's PBT saves it, so that the save
        completes its write before the trial's worker is let go: :func:`finish_next_save_in_place`)."""
        return False

    def last_scored_time(self, trial: Any) -> float:
        """The ``time_attr`` of the trial's last score PBT recorded."""
        return self._trial_state[trial].last_train_time

    @override
    def _checkpoint_or_exploit(self, trial: Any, tune_controller: Any, upper_quantile: list,
                               lower_quantile: list) -> None:
        upper, lower = self.choose_quantiles(trial, upper_quantile, lower_quantile)
        if trial in lower:
            for donor in upper:
                self._paused_donor_checkpoint(donor)
        if trial.status == Trial.RUNNING and self.pauses(tune_controller, trial):
            finish_next_save_in_place(trial)  # ahead of the save Ray's PBT may ask for here
        super()._checkpoint_or_exploit(trial, tune_controller, upper, lower)

    def _paused_donor_checkpoint(self, donor: Any) -> None:
        """Give a paused upper-quantile donor the checkpoint it paused with, where Ray's PBT recorded none.

        Ray's PBT records a donor's checkpoint only when the donor itself ranked
        in the upper quantile at its last perturbation. A trial that ran ahead
        alone (its peers' workers still starting, or a population time-sharing
        a smaller cluster) ranked in no quantile then, and could never be
        cloned: the quickstart's 4 trials often ended with a trial stuck at 10%
        accuracy and no exploit. A paused trial's checkpoint is its state at the
        result PBT last scored (the pause saved it; Tune lists a paused trial
        waiting for its slot as pending); Ray takes the same one for a paused
        trial that ranks in the upper quantile.
        """
        state = self._trial_state[donor]
        if state.last_checkpoint or donor.status not in (Trial.PAUSED, Trial.PENDING):  # pending: to resume
            return
        saving = donor.temporary_state.saving_to
        state.last_checkpoint = saving if isinstance(saving, _FutureTrainingResult) else donor.checkpoint

    @override
    def _exploit(self, tune_controller: Any, trial: Any, trial_to_clone: Any) -> None:
        if trial.status != Trial.RUNNING or not supports_clone(trial) or not self.exploit_in_place(trial):
            super()._exploit(tune_controller, trial, trial_to_clone)
            if supports_clone(trial):
                pin_donor_checkpoint(trial)  # read when the paused trial resumes
            return
        # Ray's exploit (new config, tag, the donor's checkpoint as the trial's
        # latest), but the trial keeps its worker: reset + restore run there.
        super()._exploit(_NoPause(tune_controller), trial, trial_to_clone)
        pin_donor_checkpoint(trial)
        clone_in_place(trial)
        self.exploited_in_place.add(trial)


def pin_donor_checkpoint(trial: Any) -> None:
    """Make the donor checkpoint Ray's exploit gave ``trial`` a pinned copy, which ``num_to_keep`` never deletes.

    Between the scheduler's decision and the clone reading the checkpoint, the
    donor goes on training: its next checkpoint makes Ray delete the one
    chosen (``num_to_keep=1``). The trial is given the pin instead
    (:func:`tunekit.checkpoint._pins.pin_checkpoint`); the restore that reads it
    removes it.
    """
    from tunekit.checkpoint._pins import pin_checkpoint

    manager = trial.run_metadata.checkpoint_manager
    result = manager._latest_checkpoint_result
    checkpoint = getattr(result, "checkpoint", None)
    if checkpoint is None:
        return
    iteration = (result.metrics or {}).get("training_iteration")
    pinned = pin_checkpoint(checkpoint.filesystem, checkpoint.path, iteration if isinstance(iteration, int) else None)
    if pinned is not None:
        manager._latest_checkpoint_result = _TrainingResult(
            checkpoint=tune.Checkpoint(pinned, filesystem=checkpoint.filesystem), metrics=result.metrics
        )


