"""``tunekit gc``: delete the checkpoints an experiment no longer needs, after a preview.

The checkpoints kept are the union of three selections (:mod:`tunekit.experiment.retention`,
shared with :class:`tunekit.callbacks.KeepCheckpoints`). The
selections count only checkpoints that verify; one that does not is shown as
damage, left in place, and never makes a good one expendable. Whatever the
selections, the newest checkpoint that verifies of every unfinished trial is kept: what
``tunekit resume`` continues from. ``leftovers=True`` also deletes what
interrupted writes left (staging directories whose writer is gone), copies kept
while a newer checkpoint was written, and PBT pins of a finished run;
damaged checkpoints' copies that ``tunekit resume`` kept are left to the user.

A multi-worker trial (:mod:`tunekit.multiworker`) has two kinds: its Tune checkpoints (``checkpoint_NNNNNN``,
pointers that carry the iteration and metrics) and the Ray Train checkpoints they point at
(``train/checkpoint_<time>``, every rank's part). The selections count the Tune checkpoints; a Train
checkpoint stays while a kept Tune checkpoint of any trial points at it (a PBT clone's may point at its
donor's) and when it is its trial's newest (where Train's own restart begins), and goes otherwise: no
checkpoint kept can reach it.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow.fs as pafs

from tunekit.checkpoint._trial_dir import leftovers as hidden_dirs
from tunekit.checkpoint._uploads import CANNOT_LIST, abort_uploads, open_uploads
from tunekit.checkpoint._manifest import read_metadata
from tunekit.experiment._snapshot_model import INTERRUPTED, CheckpointSummary
from tunekit.errors import CheckpointError, ConfigError, ExperimentError, first_line
from tunekit.checkpoint._layout import POINTER_KEY, TRAIN_DIR, checkpoint_bytes, pointer_target
from tunekit.experiment.record import driver_running, read_record
from tunekit.experiment.retention import Policy, TrialCheckpoints, plan as retention_plan
from tunekit.experiment.snapshot import ExperimentSnapshot, read_experiment
from tunekit.storage._location import Storage, directory_bytes, resolve_storage
from tunekit.table import format_bytes

__all__ = ["Deletion", "GcPlan", "delete_planned", "plan_gc"]

#: Hidden directories ``leftovers=True`` deletes, and why each can go.
_LEFTOVERS = {
    "interrupted": "an interrupted write (its writer is gone)",
    "kept": "a copy kept while a newer checkpoint was written",
    "pinned": "a PBT donor's pin (the run is over)",
    "temporary": "a hard-linked copy left half made (the run is over)",
}


@dataclass(frozen=True)
class Deletion:
    """One directory ``tunekit gc`` deletes."""

    trial: str
    name: str
    bytes: int
    why: str


@dataclass
class GcPlan:
    """What ``tunekit gc`` deletes (``deletions``) and keeps (``kept``, checkpoints per trial)."""

    location: str
    deletions: list[Deletion] = field(default_factory=list)
    kept: dict[str, list[str]] = field(default_factory=dict)
    kept_bytes: int = 0
    #: Checkpoints that do not verify, one line each: left in place, never counted by a selection.
    damaged: list[str] = field(default_factory=list)
    #: Trials left without any checkpoint although they had one that verifies (only with ``everything``).
    emptied: list[str] = field(default_factory=list)
    #: Multipart uploads a kill left open on S3 (``leftovers``): (key in the experiment, upload id), aborted too.
    uploads: list[tuple[str, str]] = field(default_factory=list)
    #: Why the open uploads could not be listed (boto3 missing), else None.
    uploads_note: str | None = None

    @property
    def bytes(self) -> int:
        return sum(d.bytes for d in self.deletions)

    def lines(self) -> list[str]:
        """Per trial: what goes, with counts and bytes; then the totals."""
        out = []
        for trial in sorted({d.trial for d in self.deletions} | set(self.kept)):
            gone = [d for d in self.deletions if d.trial == trial]
            kept = self.kept.get(trial, [])
            line = f"{trial}: delete {len(gone)} ({format_bytes(sum(d.bytes for d in gone))})"
            if gone:
                line += f": {', '.join(d.name for d in gone)}"
            out.append(line + f"; keep {len(kept)}: {', '.join(kept) or '-'}")
        out += [f"damaged, left in place and not counted: {line}" for line in self.damaged]
        if self.emptied:
            out.append(f"--all: every checkpoint of {len(self.emptied)} trial(s) goes: {', '.join(self.emptied)}")
        if self.uploads:
            keys = [key for key, _ in self.uploads]
            out.append(f"{len(keys)} interrupted multipart upload(s) to abort: {', '.join(keys[:3])}"
                       + (f" and {len(keys) - 3} more" if len(keys) > 3 else ""))
        out += [self.uploads_note] if self.uploads_note else []
        out.append(f"{len(self.deletions)} directories, {format_bytes(self.bytes)}, to delete; "
                   f"{sum(len(k) for k in self.kept.values())} checkpoints ({format_bytes(self.kept_bytes)}) kept"
                   + (f", {len(self.damaged)} damaged left in place (`tunekit verify` says more)"
                      if self.damaged else ""))
        return out


def plan_gc(
    location: str | Storage,
    *,
    experiment_best: int | None = None,
    trial_best: int | None = None,
    trial_latest: int | None = None,
    metric: str | None = None,
    mode: Literal["max", "min"] | None = None,
    leftovers: bool = False,
    force: bool = False,
    everything: bool = False,
) -> GcPlan:
    """What ``tunekit gc`` would delete in the experiment at ``location``; nothing is deleted here.

    A selection that would leave a trial none of its checkpoints while it has one that verifies (say
    ``trial_latest=0``) is refused unless ``everything`` (``--all``), and the plan then says so per trial.

    Raises:
        ConfigError: no selection, a bad count, a ranking selection without ``metric`` and ``mode``, or a
            selection that empties a trial (without ``everything``).
        ExperimentError: not an experiment, or its driver is still running (unless ``force``).
    """
    policy = Policy.checked("plan_gc", experiment_best=experiment_best, trial_best=trial_best,
                            trial_latest=trial_latest, metric=metric, mode=mode, flags=True)
    if not policy.selects and not leftovers:
        raise ConfigError("say what to keep: --experiment-best N, --trial-best N and/or --trial-latest N "
                          "(or --leftovers alone)")
    experiment = resolve_storage(location)
    record, record_problem = read_record(experiment.filesystem, experiment.path)
    if record is None and record_problem and not record_problem.startswith("no ") and not force:
        raise ExperimentError(f"{experiment.uri}: {record_problem}, so gc cannot tell whether the run's driver is "
                              "still running and needs what it would delete (--force deletes anyway)")
    running = driver_running(record) if record else None
    if running and not force:
        raise ExperimentError(f"{experiment.uri} is in use: {running}; deleting now could take what it needs "
                              "(--force deletes anyway)")
    snapshot = read_experiment(experiment, keep_index=False)  # (a dry run writes nothing, not even the index)
    if policy.metric and (policy.experiment_best or policy.trial_best):
        snapshot.check_metric("--metric", policy.metric)
    damaged = _damaged(snapshot) if policy.selects or leftovers else {}
    keep = _kept(experiment, snapshot, policy, damaged) if policy.selects else None
    plan = GcPlan(experiment.uri, **(_open_uploads(experiment) if leftovers else {}))
    fs = experiment.filesystem
    sizes = checkpoint_bytes(experiment)
    for trial in snapshot.trials:
        where = experiment.join(trial.name)
        kept = []
        for ckpt in trial.checkpoints:
            size = sizes.get(f"{trial.name}/{ckpt.name}", 0)
            if ckpt.uri in damaged and damaged[ckpt.uri].startswith(INTERRUPTED):  # never completed: a leftover
                if leftovers:
                    plan.deletions.append(Deletion(trial.name, ckpt.name, size, _LEFTOVERS["interrupted"]))
                else:
                    plan.kept_bytes += size
            elif ckpt.uri in damaged:  # never counted, never deleted: shown, for the user to look at
                plan.damaged.append(f"{trial.name}/{ckpt.name}: {damaged[ckpt.uri]}")
                plan.kept_bytes += size
            elif keep is None or ckpt.uri in keep:
                kept.append(ckpt.name)
                plan.kept_bytes += size
            else:
                why = "no checkpoint kept points at it" if _is_train(ckpt) else "not selected"
                plan.deletions.append(Deletion(trial.name, ckpt.name, size, why))
        plan.kept[trial.name] = kept
        if keep is not None and not [k for k in kept if not k.startswith(f"{TRAIN_DIR}/")] and any(
                c.uri not in damaged and not _is_train(c) for c in trial.checkpoints):
            plan.emptied.append(trial.name)
        if leftovers:
            for name, kind in hidden_dirs(fs, where.path):
                if kind in _LEFTOVERS and not (kind in ("pinned", "temporary") and running):
                    size = directory_bytes(fs, posixpath.join(where.path, name))
                    plan.deletions.append(Deletion(trial.name, name, size, _LEFTOVERS[kind]))
    if plan.emptied and not everything:
        shown = ", ".join(plan.emptied[:3]) + (f" and {len(plan.emptied) - 3} more" if len(plan.emptied) > 3 else "")
        raise ConfigError(f"gc {experiment.uri}: this selection keeps no checkpoint of {len(plan.emptied)} trial(s) "
                          f"that have one that verifies ({shown}); keep at least one of each (--trial-latest 1), "
                          "or add --all to delete every checkpoint of those trials")
    return plan


def _open_uploads(experiment: Storage) -> dict[str, Any]:
    """``GcPlan``'s ``uploads`` and ``uploads_note`` for ``experiment``."""
    uploads = open_uploads(experiment)
    return {"uploads": uploads or [], "uploads_note": CANNOT_LIST if uploads is None else None}


def _damaged(snapshot: ExperimentSnapshot) -> dict[str, str]:
    """Checkpoint URI -> why it does not verify, for every checkpoint that does not (each verified once)."""
    out = {}
    for trial in snapshot.trials:
        for ckpt in trial.checkpoints:
            ok, why = snapshot.verdict(ckpt)
            if not ok:
                out[ckpt.uri] = why
    return out


def _kept(experiment: Storage, snapshot: ExperimentSnapshot, policy: Policy, damaged: dict[str, str]) -> set[str]:
    """URIs of the checkpoints to keep: the retention plan over the checkpoints that verify (a damaged newest
    never makes the good one before it expendable), and the Train checkpoints those point at."""
    good = {t.name: TrialCheckpoints([c for c in t.checkpoints if c.uri not in damaged and not _is_train(c)],
                                     finished=t.status == "TERMINATED") for t in snapshot.trials}
    keep = set(retention_plan(good, policy).keep)
    return keep | _train_kept(experiment, snapshot, keep)


def _is_train(checkpoint: CheckpointSummary) -> bool:
    """Whether ``checkpoint`` is a multi-worker trial's Ray Train checkpoint (not a Tune checkpoint)."""
    return checkpoint.name.startswith(f"{TRAIN_DIR}/")


def _train_kept(experiment: Storage, snapshot: ExperimentSnapshot, keep: set[str]) -> set[str]:
    """The Train checkpoints to keep (URIs): those a kept Tune checkpoint points at (any trial's), and each
    trial's newest (Train restarts its worker group from it). Nothing when no trial has Train checkpoints."""
    trains = {t.name: [c for c in t.checkpoints if _is_train(c)] for t in snapshot.trials}
    if not any(trains.values()):
        return set()
    out = {cs[-1].uri for cs in trains.values() if cs}  # (oldest first: named by time)
    by_path = {experiment.join(name, c.name).path.rstrip("/"): c.uri for name, cs in trains.items() for c in cs}
    for trial in snapshot.trials:
        for ckpt in trial.checkpoints:
            if ckpt.uri not in keep or _is_train(ckpt):
                continue
            where = experiment.join(trial.name, ckpt.name)
            try:
                value = read_metadata(where).get(POINTER_KEY)
            except CheckpointError:
                continue  # (damaged ones are shown as damage and kept)
            target = pointer_target(experiment.filesystem, where.path, value) if isinstance(value, str) else None
            if isinstance(target, str) and target.rstrip("/") in by_path:  # (another storage_path: not ours)
                out.add(by_path[target.rstrip("/")])
    return out


def delete_planned(plan: GcPlan) -> int:
    """Delete exactly what ``plan`` lists; return the bytes freed."""
    experiment = resolve_storage(plan.location)
    fs = experiment.filesystem
    for done, deletion in enumerate(plan.deletions):
        path = posixpath.join(experiment.path, deletion.trial, deletion.name)
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            raise ExperimentError(f"{plan.location}: {deletion.trial}/{deletion.name} is gone already; "
                                  "plan again (something else changed the experiment)")
        try:
            fs.delete_dir(path)
        except OSError as exc:  # read-only storage, no permission: said in one line, where it stopped
            raise ExperimentError(f"{plan.location}: cannot delete {deletion.trial}/{deletion.name} "
                                  f"({exc.strerror or first_line(exc)}); {done} of {len(plan.deletions)} "
                                  "deleted before it, nothing else changed") from None
    abort_uploads(experiment, plan.uploads)
    return plan.bytes
