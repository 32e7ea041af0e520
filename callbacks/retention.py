"""Keep the checkpoints a retention policy selects, and what a resume or a scheduler still needs; delete the rest.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

import pyarrow.fs as pafs
from ray import tune
from ray.tune.experiment import Trial
from typing_extensions import override

from tunekit import _ray
from tunekit.checkpoint._manifest import MANIFEST_FILE, METADATA_FILE
from tunekit.experiment._snapshot_model import CheckpointSummary, ranked
from tunekit.checkpoint._trial_dir import CHECKPOINT_DIR, scan
from tunekit.callbacks.record import TunekitCallback, repair_final_checkpoints
from tunekit.errors import ConfigError
from tunekit.checkpoint._layout import TRAIN_DIR
from tunekit.experiment.retention import Policy, TrialCheckpoints, newest_first, plan, selected
from tunekit.storage import directory_bytes
from tunekit.table import format_bytes
from tunekit.trial.kind import declared

__all__ = ["KeepCheckpoints"]

logger = logging.getLogger(__name__)

class KeepCheckpoints(TunekitCallback):
    """A retention policy for the whole experiment, applied as the run goes.

    The checkpoints kept are the union of ``experiment_best`` (the best of the
    experiment by ``metric`` in ``mode``), ``trial_best`` (each trial's best)
    and ``trial_latest`` (each trial's newest); the others are deleted once a
    newer checkpoint is registered, and Ray's bookkeeping forgets them, so
    ``ResultGrid``, ``tunekit status``, ``resume`` and ``verify`` never name a
    deleted checkpoint. Never deleted, whatever the policy:

    * the newest complete checkpoint of a trial that has not finished (what a
      retry or ``tunekit resume`` restores), and the one it restores from if
      that is another trial's (a PBT exploit);
    * a checkpoint a scheduler may still restore: a paused trial's (PBT,
      HyperBand), the donors PBT's next exploit may pick;
    * a checkpoint being written, and the complete one before it.

    A multi-worker trial's (``tunekit.multiworker.train_trial``) Tune checkpoints point at its Ray Train
    checkpoints: when the policy deletes one, the Train checkpoint it named goes with it unless a Tune
    checkpoint still kept names it (a PBT clone's may name its donor's).

    ``max_bytes``: when the experiment's checkpoints (a multi-worker trial's Train checkpoints included,
    each once) exceed it, the
    lowest-ranked of those not needed as above go first, even selected ones
    (oldest first without a ``metric``); when none can go, one warning with
    the numbers, and training goes on. It composes with
    ``CheckpointConfig(num_to_keep=...)``, which Ray applies first, per trial.

    Args:
        experiment_best: How many of the experiment's best checkpoints to keep.
        trial_best: How many of each trial's best checkpoints to keep.
        trial_latest: How many of each trial's newest checkpoints to keep
            (default 1, when no selection is given).
        metric: The metric ``experiment_best``, ``trial_best`` and ``max_bytes`` rank by.
        mode: ``"max"`` or ``"min"``.
        max_bytes: A budget for the experiment's checkpoints, in bytes.
    """

    def __init__(self, *, experiment_best: int | None = None, trial_best: int | None = None,
                 trial_latest: int | None = None, metric: str | None = None,
                 mode: Literal["max", "min"] | None = None, max_bytes: int | None = None) -> None:
        if (experiment_best, trial_best, trial_latest) == (None, None, None):
            trial_latest = 1
        self.policy = Policy.checked("KeepCheckpoints", experiment_best=experiment_best, trial_best=trial_best,
                                     trial_latest=trial_latest, metric=metric, mode=mode)
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0):
            raise ConfigError(f"KeepCheckpoints(max_bytes={max_bytes!r}): expected a whole number of bytes > 0")
        self.max_bytes = max_bytes
        self._own_policy = dataclasses.replace(self.policy, experiment_best=None)  # a trial's own selections
        self._scheduler: Any = None
        self._forget_settled()
        self._order: dict[str, int] = {}
        self._sizes: dict[str, int] = {}
        self._whole: set[str] = set()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._warned = False
        #: Checkpoints deleted so far, and their bytes (when known).
        self.deleted = 0
        self.deleted_bytes = 0
        #: Trials settled so far in this run: finished, and never walked again (see ``_settle``).
        self.settled = 0

    def _forget_settled(self) -> None:
        """Walk every trial again (a new run, or trials this one did not see in order)."""
        self._settled: set[str] = set()  # see ``_settle``
        #: (trial order, position, trial id, checkpoint): the settled trials' best for experiment_best.
        self._settled_top: list[tuple[int, int, str, CheckpointSummary]] = []
        self._open: dict[str, Trial] = {}
        #: A multi-worker trial's Tune checkpoint (a pointer) -> the Train checkpoint it names; and by trainable
        #: name, whether its trials are multi-worker.
        self._targets: dict[str, str] = {}
        self._multi: dict[str, bool] = {}
        #: Trials Tune has queued, not started, with nothing registered: walked once they start (a search queues
        #: hundreds ahead of the CPUs).
        self._waiting: dict[str, Trial] = {}
        self._known = 0

    def _recorded_kwargs(self) -> dict[str, Any] | None:
        p = self.policy
        return {"experiment_best": p.experiment_best, "trial_best": p.trial_best, "trial_latest": p.trial_latest,
                "metric": p.metric, "mode": p.mode, "max_bytes": self.max_bytes}


    @override
    def on_checkpoint(self, iteration: int, trials: list[Trial], trial: Trial, checkpoint: tune.Checkpoint,
                      **info: Any) -> None:
        # Ray registers ``checkpoint`` after this call: until it is whole, the trial's newest stays.
        self._apply(trials, new=(trial, checkpoint))

    @override
    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        super().on_trial_start(iteration, trials, trial, **info)
        waiting = self._waiting.pop(trial.trial_id, None)  # (not a walk over the waiting trials each time)
        if waiting is not None:
            self._open[trial.trial_id] = waiting

    @override
    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        super().on_trial_complete(iteration, trials, trial, **info)
        self._apply(trials)

    @override
    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        repair_final_checkpoints(trials)  # before the policy counts them: a dead last write stands for nothing
        self._apply(trials, over=True)
        self.wait()
        super().on_experiment_end(trials, **info)

    # -- the policy ------------------------------------------------------------------
    def _apply(self, trials: list[Trial], new: tuple[Trial, tune.Checkpoint] | None = None, *,
               over: bool = False) -> None:
        self.wait()  # what the last call deleted is gone before anything is counted again
        open_trials = self._open_trials(trials, new, incremental=not over and self.max_bytes is None)
        by_trial: dict[str, list[CheckpointSummary]] = {}
        where: dict[str, tuple[Trial, Any]] = {}
        for trial in open_trials:
            entries = list(_ray.registered_checkpoints(trial))
            if new is not None and new[0] is trial:  # registered by Ray after this call: counted as the newest now
                entries.append((new[1], dict(trial.last_result or {})))
            by_trial[trial.trial_id] = []
            for ckpt, metrics in entries:
                iteration = metrics.get("training_iteration")
                by_trial[trial.trial_id].append(CheckpointSummary(
                    posixpath.basename(ckpt.path.rstrip("/")), ckpt.path,
                    iteration if isinstance(iteration, int) else None, metrics))
                where[ckpt.path] = (trial, ckpt)
                if ckpt.path not in self._targets and self._multi_worker(trial) and self._complete(ckpt):
                    self._targets[ckpt.path] = _train_target(ckpt)
        # The selections count only complete checkpoints: one being written, or whose write died, never makes
        # a whole one expendable (it is kept while newer than the newest whole one: ``_needed``). A settled
        # trial's best still compete for ``experiment_best``, in the trials' order.
        complete = {tid: [c for c in cs if self._complete(where[c.uri][1])] for tid, cs in by_trial.items()}
        settled: dict[str, list[CheckpointSummary]] = {}
        for _, _, tid, summary in self._settled_top:
            settled.setdefault(tid, []).append(summary)
        finished = {trial.trial_id: trial.status == Trial.TERMINATED for trial in open_trials}
        ids = sorted(dict.fromkeys([*finished, *settled]), key=lambda tid: self._order.get(tid, 0))
        counted = {tid: TrialCheckpoints([*complete.get(tid, []), *settled.get(tid, [])],
                                         finished=finished.get(tid, True)) for tid in ids}
        kept = plan(counted, self.policy, self._needed(open_trials, by_trial, where,
                                                       scheduler=None if over else self._scheduler))
        doomed = [path for path in where if path not in kept.keep]
        if self.max_bytes is not None:
            doomed += self._over_budget(by_trial, where, kept.keep - kept.needed, kept.needed, doomed)
        self._delete(doomed, where)
        if not over and self.max_bytes is None:
            self._settle(open_trials, by_trial, complete, set(doomed))

    # -- trials whose checkpoints can no longer change -------------------------------------
    # A finished trial whose checkpoints are all whole and all kept by its own selections (trial_latest,
    # trial_best), or which has none left (one ASHA stopped before its first save), is settled: nothing of it
    # is deleted again in this run, and only its best can still count (for experiment_best). It is left out
    # of the walk over the trials, which is then over the open trials only, not O(trials) per checkpoint
    # (2,000 trials: most of the sweep's time was this walk).
    def _open_trials(self, trials: list[Trial], new: tuple[Trial, Any] | None, *, incremental: bool) -> list[Trial]:
        if not incremental or len(trials) < self._known or (new is not None and new[0].trial_id in self._settled):
            self._forget_settled()
            if not incremental:
                self._order = {t.trial_id: k for k, t in enumerate(trials)}
                return list(trials)
        for k, trial in enumerate(trials[self._known:], start=self._known):
            self._order[trial.trial_id] = k
            if trial.status == Trial.PENDING and trial.checkpoint is None:
                self._waiting[trial.trial_id] = trial
            else:
                self._open[trial.trial_id] = trial
        self._known = len(trials)
        if new is not None and new[0].trial_id in self._waiting:  # (started: ``on_trial_start`` moves it first)
            self._open[new[0].trial_id] = self._waiting.pop(new[0].trial_id)
        return list(self._open.values())

    def _settle(self, open_trials: list[Trial], by_trial: dict[str, list[CheckpointSummary]],
                complete: dict[str, list[CheckpointSummary]], doomed: set[str]) -> None:
        own = self._own_policy
        for trial in open_trials:
            tid = trial.trial_id
            if trial.status != Trial.TERMINATED or len(complete[tid]) != len(by_trial[tid]):
                continue  # it may go on, or one of its checkpoints is being written (or its write died)
            left = [c for c in complete[tid] if c.uri not in doomed]  # (none: it never saved, or all go now)
            if left and selected({tid: left}, own) != {c.uri for c in left}:
                continue
            self._settled.add(tid)
            self.settled += 1
            del self._open[tid]
            if self.policy.experiment_best and self.policy.ranks:  # only the settled trials' best K can count
                order = self._order.get(tid, 0)
                entries = sorted(self._settled_top + [(order, k, tid, c) for k, c in enumerate(left)],
                                 key=lambda e: e[:2])
                best = {id(c) for c in ranked([e[3] for e in entries], self.policy.metric, self.policy.mode)
                        [:self.policy.experiment_best]}
                self._settled_top = [e for e in entries if id(e[3]) in best]

    def _needed(self, trials: list[Trial], by_trial: dict[str, list[CheckpointSummary]],
                where: dict[str, tuple[Trial, Any]], *, scheduler: Any) -> set[str]:
        """What the scheduler or an unfinished trial may still restore, and what is being written."""
        needed: set[str] = set()
        if scheduler is not None:  # (the run over, no scheduler restores anything)
            needed |= _ray.scheduler_checkpoints(scheduler)
        for trial in trials:
            if trial.checkpoint is not None and trial.status != Trial.TERMINATED:  # (an errored one may go on)
                needed.add(trial.checkpoint.path)  # what it restores: its own newest, or a donor's after an exploit
            # Any checkpoint newer than the newest whole one is being written (a finished trial's last one too:
            # its write goes on after Tune ended the trial).
            for summary in newest_first(by_trial[trial.trial_id]):
                if self._complete(where[summary.uri][1]):
                    break
                needed.add(summary.uri)
        return needed

    def _over_budget(self, by_trial: dict[str, list[CheckpointSummary]], where: dict[str, tuple[Trial, Any]],
                     deletable: set[str], needed: set[str], doomed: list[str]) -> list[str]:
        """The lowest-ranked deletable checkpoints whose deletion brings the experiment under ``max_bytes``."""
        assert self.max_bytes is not None
        left = [s for summaries in by_trial.values() for s in summaries if s.uri not in doomed]
        # a multi-worker trial's Train checkpoints count too, once each, while a pointer left names them
        namers: dict[str, list[str]] = {}
        for s in left:
            if self._train_of(s.uri):
                namers.setdefault(self._train_of(s.uri), []).append(s.uri)
        total = sum(self._size(where[s.uri][1]) for s in left)
        total += sum(self._train_bytes(where[uris[0]][1], target) for target, uris in namers.items())
        if total <= self.max_bytes:
            return []
        candidates = [s for s in left if s.uri in deletable]
        if self.policy.ranks:
            order = list(reversed(ranked(candidates, self.policy.metric, self.policy.mode)))  # worst first
        else:
            order = sorted(candidates, key=lambda s: (s.iteration or 0, s.name))
        out = []
        for summary in order:
            if total <= self.max_bytes:
                break
            out.append(summary.uri)
            total -= self._size(where[summary.uri][1])
            target = self._train_of(summary.uri)
            if target:
                namers[target].remove(summary.uri)
                if not namers[target]:  # its last namer: the Train checkpoint goes with it (``_delete``)
                    total -= self._train_bytes(where[summary.uri][1], target)
        if total > self.max_bytes and not self._warned:
            self._warned = True
            warnings.warn(
                f"KeepCheckpoints(max_bytes={self.max_bytes}): the experiment's checkpoints need "
                f"{format_bytes(total)} ({total} bytes) and none of the {len(needed)} left can go (each is "
                "needed to resume a trial, by the scheduler, or being written); training goes on over the budget",
                stacklevel=2)
        return out

    def _size(self, checkpoint: Any) -> int:
        if checkpoint.path not in self._sizes:
            size = directory_bytes(checkpoint.filesystem, checkpoint.path)
            if not self._complete(checkpoint):
                return size  # still being written: counted again next time
            self._sizes[checkpoint.path] = size
        return self._sizes[checkpoint.path]

    def _train_of(self, path: str) -> str:
        """The Train checkpoint of the experiment a multi-worker trial's Tune checkpoint names ("" if none)."""
        target = self._targets.get(path, "")
        return target if target and _in_experiment(target, path) else ""

    def _train_bytes(self, pointer: Any, target: str) -> int:
        key = f"train:{target}"
        if key not in self._sizes:
            self._sizes[key] = directory_bytes(pointer.filesystem, target)
        return self._sizes[key]

    def _complete(self, checkpoint: Any) -> bool:
        if checkpoint.path not in self._whole and _complete(checkpoint):
            self._whole.add(checkpoint.path)
        return checkpoint.path in self._whole

    def _delete(self, doomed: list[str], where: dict[str, tuple[Trial, Any]]) -> None:
        """Forget ``doomed`` in Ray's bookkeeping now; delete the directories on the policy's own thread.

        Deleting is I/O (milliseconds a checkpoint locally, round trips on S3): the Tune loop does not wait
        for it. The next ``_apply`` and the end of the run wait for what is still being deleted.
        """
        by_trial: dict[Trial, set[str]] = {}
        for path in dict.fromkeys(doomed):
            trial, checkpoint = where[path]
            self._whole.discard(path)
            self.deleted += 1
            self.deleted_bytes += self._sizes.pop(path, 0)
            by_trial.setdefault(trial, set()).add(path)
            self._pending.append(self._deleter().submit(_delete_dir, checkpoint.filesystem, path))
        for trial, paths in by_trial.items():
            _ray.forget_checkpoints(trial, paths)
        # A Train checkpoint a deleted pointer named, that no pointer left names (the trial's newest is named
        # by its newest pointer, kept): only within the experiment (``train_trial(storage_path=...)``: not ours)
        named = [(path, self._targets.pop(path, None)) for path in dict.fromkeys(doomed)]
        live = set(self._targets.values())
        for path, target in named:
            if target and target not in live and _in_experiment(target, path):
                live.add(target)  # (once)
                self.deleted_bytes += self._sizes.pop(f"train:{target}", 0)
                registered = {c.path for c, _ in _ray.registered_checkpoints(where[path][0])}
                self._pending.append(self._deleter().submit(_delete_train_checkpoint, where[path][1].filesystem,
                                                            target, posixpath.dirname(path.rstrip("/")), registered))

    def _multi_worker(self, trial: Trial) -> bool:
        if trial.trainable_name not in self._multi:
            try:
                cls = trial.get_trainable_cls()
            except Exception:  # noqa: BLE001 - not registered in this process: not one of train_trial's
                cls = None
            self._multi[trial.trainable_name] = declared(cls).multiworker
        return self._multi[trial.trainable_name]

    def _deleter(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunekit-retention")
        return self._executor

    def wait(self) -> None:
        """Wait until every deletion decided so far is done."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def __getstate__(self) -> dict[str, Any]:
        self.wait()  # (Ray keeps the callbacks in tuner.pkl: no thread in there, nor what a run settled)
        state = {**self.__dict__, "_executor": None, "_pending": [], "_order": {}}
        return {k: v for k, v in state.items() if k not in ("_settled", "_settled_top", "_open", "_waiting", "_known")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._own_policy = dataclasses.replace(self.policy, experiment_best=None)  # (a tuner.pkl written before it was kept)
        self._forget_settled()

    @override
    def setup(self, **info: Any) -> None:
        super().setup(**info)
        self._forget_settled()  # afresh
        self._order = {}


def _train_target(checkpoint: Any) -> str:
    """The Train checkpoint a multi-worker trial's Tune checkpoint names ("" when it names none)."""
    from tunekit.multiworker.trial import train_checkpoint_of

    return train_checkpoint_of(checkpoint) or ""


def _in_experiment(target: str, pointer: str) -> bool:
    """Whether ``target`` is a Train checkpoint of a trial of the experiment ``pointer`` is in:
    ``EXP/<trial>/train/<checkpoint>`` beside ``EXP/<trial>/<pointer>``."""
    train = posixpath.dirname(target.rstrip("/"))
    experiment = posixpath.dirname(posixpath.dirname(pointer.rstrip("/")))
    return posixpath.basename(train) == TRAIN_DIR and posixpath.dirname(posixpath.dirname(train)) == experiment


def _delete_train_checkpoint(fs: pafs.FileSystem, target: str, trial_dir: str, registered: set[str]) -> None:
    """Delete the Train checkpoint ``target``, and first the pointers of the trial in ``trial_dir`` that name it
    and that Ray never registered (written as Tune stopped the trial for PBT): nothing restores from them, and
    left, they would name a missing checkpoint. One newer than every pointer Ray registered is being written:
    then ``target`` stays."""
    newest = max((int(m[1]) for p in registered if (m := CHECKPOINT_DIR.match(posixpath.basename(p)))), default=-1)
    strays = []
    for entry in scan(fs, trial_dir, ("checkpoint",)):
        if entry.path in registered:
            continue
        if _train_target(tune.Checkpoint(entry.path, filesystem=fs)) == target:
            if entry.index > newest:
                return
            strays.append(entry.path)
    for stray in strays:
        _delete_dir(fs, stray)
    _delete_dir(fs, target)


def _delete_dir(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_dir(path)
    except FileNotFoundError:
        pass  # gone already (Ray's num_to_keep, a user)
    except OSError as exc:
        logger.warning("KeepCheckpoints: could not delete %s (%s); it stays on disk, forgotten by Ray "
                       "(`tunekit gc` lists it)", path, exc)


def _complete(checkpoint: Any) -> bool:
    """Whether a checkpoint directory is whole: tunekit's manifest is in it, or it is another writer's."""
    fs, path = checkpoint.filesystem, checkpoint.path
    manifest, metadata, directory = fs.get_file_info([posixpath.join(path, MANIFEST_FILE),
                                                      posixpath.join(path, METADATA_FILE), path])
    if manifest.type == pafs.FileType.File:
        return True
    if directory.type != pafs.FileType.Directory or metadata.type != pafs.FileType.NotFound:
        return False
    # No tunekit file: another writer's checkpoint, unless it is empty (announced by a two-phase save, unwritten).
    return bool(fs.get_file_info(pafs.FileSelector(path)))
