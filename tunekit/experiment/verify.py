"""Verify every checkpoint of every trial of an experiment, local or remote.

Example:
    >>> import tempfile
    >>> from tunekit import verify_experiment
    >>> verify_experiment(tempfile.mkdtemp())  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    tunekit.errors.ExperimentError: ...: not a Ray Tune experiment directory ...
"""

from __future__ import annotations

import os
import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow.fs as pafs
from typing import Any, Callable, Literal

from tunekit.experiment._index import ExperimentIndex
from tunekit.experiment._listed import listed_storage
from tunekit.experiment.results import result_file_problems
from tunekit.checkpoint._interrupted import INTERRUPTED_WRITE, interrupted_write
from tunekit.checkpoint._manifest import NOT_WRITTEN, TUNEKIT_FILES
from tunekit.checkpoint._trial_dir import CHECKPOINT_DIR, leftovers, scan
from tunekit.checkpoint._directory import (
    CheckpointReport, is_tunekit_checkpoint, read_metadata, verify_checkpoint
)
from tunekit.errors import CheckpointError, TunekitError
from tunekit.checkpoint._layout import POINTER_KEY, TRAIN_DIR, find_trials, pointer_target
from tunekit.storage._location import Storage, resolve_storage

__all__ = ["CheckpointCheck", "ExperimentCheck", "FOREIGN", "checkpoint_at", "experiment_file_problems",
           "open_for_verify", "result_file_problems", "verify_experiment", "verify_one", "verify_opened"]


@dataclass(frozen=True)
class CheckpointCheck:
    """The verdict on one checkpoint directory of one trial."""

    trial: str
    checkpoint: str
    iteration: int | None
    status: Literal["good", "incomplete", "corrupt", "unsupported", "unverified", "interrupted"]
    problems: tuple[str, ...] = ()

    @property
    def bad(self) -> bool:
        return self.status in ("incomplete", "corrupt")

    def as_dict(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "checkpoint": self.checkpoint,
            "iteration": self.iteration,
            "status": self.status,
            "problems": list(self.problems),
        }


@dataclass
class ExperimentCheck:
    """The verdicts on all checkpoints of an experiment."""

    location: str
    trials: int = 0
    checks: list[CheckpointCheck] = field(default_factory=list)
    #: Damage to the experiment's own files: a torn ``tuner.pkl`` or experiment state, one line each.
    problems: list[str] = field(default_factory=list)
    #: Whether every file's bytes were hashed (else its size alone was checked against the manifest).
    hashed: bool = True

    @property
    def ok(self) -> bool:
        """True when every checkpoint could be checked, none is incomplete or corrupt, and Ray's files are whole.

        A checkpoint written by a newer tunekit (``unsupported``) is not
        damaged, but this tunekit cannot vouch for it either.
        """
        return not self.problems and not any(c.bad or c.status == "unsupported" for c in self.checks)

    def counts(self) -> dict[str, int]:
        out = {"good": 0, "incomplete": 0, "corrupt": 0, "unsupported": 0, "unverified": 0}
        for check in self.checks:  # ("interrupted" only when there is one: a write a kill cut short)
            out[check.status] = out.get(check.status, 0) + 1
        return out

    def summary(self) -> str:
        counts = self.counts()
        parts = ", ".join(
            f"{n} {status}" for status, n in counts.items()
            if n or status not in ("unverified", "unsupported", "interrupted")
        )
        lines = [f"{len(self.checks)} checkpoints in {self.trials} trials: {parts}"]
        lines.append("checked: every file's size and hash against its manifest" if self.hashed else
                     "checked: every file's size against its manifest, no file's bytes read "
                     "(tunekit verify --full hashes every file)")
        return "\n".join(lines + [f"damaged: {p}" for p in self.problems])


def _being_written(trial: Any, name: str) -> bool:
    """Whether a live process is writing checkpoint ``name`` of ``trial`` (its staging directory says so)."""
    where = trial.location
    return any(e.checkpoint == name for e in scan(where.filesystem, where.path, ("writing",)))


def _metadata(location: Storage) -> dict[str, Any]:
    try:
        return read_metadata(location)
    except CheckpointError:
        return {}


def _iteration(location: Storage, metadata: dict[str, Any] | None = None) -> int | None:
    value = (_metadata(location) if metadata is None else metadata).get("iteration")
    return value if isinstance(value, int) else None


def _pointer_gone(experiment: Storage, trial: Any, target: Any) -> str | None:
    """What to say of a multi-worker trial's Tune checkpoint (a pointer, :mod:`tunekit.multiworker`) whose
    Train checkpoint ``target`` is missing on storage; None when it is there, or not this experiment's."""
    if not isinstance(target, str):
        return None
    target = target.rstrip("/")
    if target in {c.location.path.rstrip("/") for c in trial.checkpoints}:
        return None
    try:  # (Train's storage_path elsewhere: looked for on the experiment's storage, where a copy would be)
        if experiment.filesystem.get_file_info(target).type != pafs.FileType.NotFound:
            return None
    except OSError:
        return None
    return (f"points at the multi-worker checkpoint {target}, which is missing on storage: a PBT clone or a "
            "resume from it cannot start (keep every Train checkpoint a Tune checkpoint points at)")


#: Why a checkpoint directory with files, none of them tunekit's, is ``unverified`` (another writer's).
FOREIGN = "not a tunekit checkpoint"


def checkpoint_at(location: str | Storage, index: ExperimentIndex | None = None) -> Storage | None:
    """``location`` when it is one checkpoint directory (holding a tunekit file, or named ``checkpoint_N``):
    what ``tunekit verify`` checks alone; None otherwise (an experiment, or nothing there). One listing; with
    ``index`` (the location's, remote), the recursive one the experiment's verification reads anyway."""
    try:
        where = resolve_storage(location)
        if index is not None:
            dirs, names = index.top()
            present = bool(dirs or names)
        else:
            entries = where.filesystem.get_file_info(pafs.FileSelector(where.path, allow_not_found=True))
            names = [e.base_name for e in entries if e.type == pafs.FileType.File]
            present = bool(entries)
    except (TunekitError, OSError, ValueError):  # (not storage tunekit can read: verify_experiment says why)
        return None
    if not present and not (where.is_local and os.path.isdir(where.path)):  # (an empty local directory is one)
        return None
    named = CHECKPOINT_DIR.match(posixpath.basename(where.path.rstrip("/")))
    return where if named or any(name in TUNEKIT_FILES for name in names) else None


def verify_one(checkpoint: Storage) -> tuple[str, list[str]]:
    """The verdict on one checkpoint directory, in :func:`verify_experiment`'s words: ``unverified`` for
    another writer's (files, none of them tunekit's), ``incomplete`` for an empty one (:data:`NOT_WRITTEN`)."""
    report = verify_checkpoint(checkpoint)
    if report.problems != [NOT_WRITTEN] and not is_tunekit_checkpoint(checkpoint):
        return "unverified", [FOREIGN]
    return report.status, list(report.problems)


def open_for_verify(location: str | Storage, filesystem: Any = None, full: bool | None = None
                    ) -> tuple[Storage, ExperimentIndex | None, bool]:
    """The storage at ``location`` as :func:`verify_experiment` reads it, its index (remote: read from one listing
    and the index, see :mod:`tunekit.experiment._index`; None on a local disk), and whether to hash every file
    (default: on a local disk, where reading is cheap). Lists nothing yet."""
    where = resolve_storage(location, filesystem=filesystem)
    hashed = where.is_local if full is None else full
    return where, None if where.is_local else ExperimentIndex(where), hashed


def _read_all(experiment: Storage, trials: list[Any],
              hashes: bool) -> tuple[list[tuple[Any, Any, bool]], dict[str, CheckpointReport]]:
    """Each checkpoint with whether tunekit wrote it; on remote storage each one's report too, many read at once
    (each file read is a request of its own: one after another they add up to minutes on a large experiment)."""
    pairs = [(trial, ckpt) for trial in trials for ckpt in trial.checkpoints]
    if experiment.is_local or len(pairs) < 2:
        return [(t, c, is_tunekit_checkpoint(c.location)) for t, c in pairs], {}
    with ThreadPoolExecutor(max_workers=16, thread_name_prefix="tunekit-verify") as pool:
        ours = list(pool.map(lambda pair: is_tunekit_checkpoint(pair[1].location), pairs))
        reports = dict(zip([c.location.path for _, c in pairs],
                           pool.map(lambda pair: verify_checkpoint(pair[1].location, hashes=hashes), pairs)))
    return [(t, c, mine) for (t, c), mine in zip(pairs, ours)], reports


def verify_experiment(
    location: str | Storage,
    *,
    filesystem: Any = None,
    on_check: Callable[[CheckpointCheck], None] | None = None,
    full: bool | None = None,
) -> ExperimentCheck:
    """Verify every checkpoint of every trial of the experiment at ``location``.

    Checkpoints written by tunekit are checked against their manifests: each file's size and, with ``full``, its
    hash; remote ones from one listing and the experiment's index (:mod:`tunekit.experiment._index`). In an experiment that
    holds tunekit checkpoints, a checkpoint directory without any tunekit file is *incomplete* (for instance
    half-copied). Checkpoints of other trainables cannot be verified and are reported as *unverified*.

    Args:
        location: The experiment directory: path, URI or Storage.
        filesystem: A pyarrow/fsspec filesystem ``location`` is a path on.
        on_check: Called with each verdict as soon as it is known (progress).
        full: Hash every file, or check sizes alone (False). Default: hash on a local disk, sizes on remote.

    Raises:
        ExperimentError: ``location`` is not an experiment directory.
        StorageError: the storage cannot be read.
    """
    return verify_opened(*open_for_verify(location, filesystem, full), on_check=on_check)


def verify_opened(where: Storage, index: ExperimentIndex | None, hashed: bool, *,
                  on_check: Callable[[CheckpointCheck], None] | None = None) -> ExperimentCheck:
    """:func:`verify_experiment` of what :func:`open_for_verify` returned."""
    experiment = where if index is None else listed_storage(index)
    trials = find_trials(experiment)
    result = ExperimentCheck(location=experiment.uri, trials=len(trials), hashed=hashed)
    found, reports = _read_all(experiment, trials, hashed)  # (a Train checkpoint verified once, for both uses)
    any_tunekit = any(is_ours for _, _, is_ours in found)
    registered: list[Any] = []  # (Ray's registered checkpoints, read once when a checkpoint has no manifest)
    pointed: set[str] = set()  # Train checkpoints a Tune checkpoint points at (pointers come first in a trial)

    def add(check: CheckpointCheck) -> None:
        result.checks.append(check)
        if on_check is not None:
            on_check(check)

    def report_of(location: Storage) -> CheckpointReport:
        if location.path not in reports:
            reports[location.path] = verify_checkpoint(location, hashes=hashed)
        return reports[location.path]

    for trial, ckpt, is_ours in found:
        report: CheckpointReport = report_of(ckpt.location)
        if report.problems == [NOT_WRITTEN]:  # announced by a two-phase save: in flight, or its writer died
            check = CheckpointCheck(trial.name, ckpt.name, None, "unverified", ("being written by a live process",)) \
                if _being_written(trial, ckpt.name) else CheckpointCheck(
                    trial.name, ckpt.name, None, "incomplete",
                    (NOT_WRITTEN, "its writer is gone: the trial restores from its newest good checkpoint"))
        elif interrupted_write(report, ckpt.location) and (
                ckpt.location.path.rstrip("/") not in pointed if ckpt.name.startswith(f"{TRAIN_DIR}/")
                else _never_registered(experiment, trial.name, ckpt.name, registered)):
            check = CheckpointCheck(trial.name, ckpt.name, None, "interrupted", (INTERRUPTED_WRITE,))
        elif is_ours or any_tunekit:
            meta = _metadata(ckpt.location) if is_ours else {}
            status, problems = report.status, tuple(report.problems) if is_ours else ("no tunekit files in it",)
            value = meta.get(POINTER_KEY)
            target = pointer_target(experiment.filesystem, ckpt.location.path, value) if isinstance(value, str) \
                else None
            if target:
                pointed.add(target.rstrip("/"))
            gone = _pointer_gone(experiment, trial, target) if status == "good" else None
            if gone is not None:
                status, problems = "incomplete", (gone,)
            train = next((c for c in trial.checkpoints if target and c.location.path.rstrip("/") == target), None)
            if status == "good" and train is not None and not report_of(train.location).ok:
                bad = report_of(train.location)  # one checkpoint, one truth: the pointer is what it points at
                status, problems = bad.status, (f"points at {train.name}, which is {bad.status}: "
                                                f"{'; '.join(bad.problems)}",)
            check = CheckpointCheck(trial.name, ckpt.name, _iteration(ckpt.location, meta) if is_ours else None,
                                    status, problems)
        else:
            check = CheckpointCheck(trial.name, ckpt.name, None, "unverified", (FOREIGN,))
        add(check)
    return _whole_experiment(experiment, index, trials, result, add)


def _whole_experiment(experiment: Storage, index: ExperimentIndex | None, trials: list[Any], result: ExperimentCheck,
                      add: Callable[[CheckpointCheck], None]) -> ExperimentCheck:
    """``result`` with what :func:`verify_opened` checks after the trials' checkpoints: what two-phase saves leave
    behind when a worker is killed mid-write, the checkpoints Ray registered, the experiment's own files."""
    record = _record_facts(experiment, index)
    for check in [c for trial in trials for c in _leftover_checks(trial)] + _registered_checks(experiment, trials,
                                                                                              record):
        add(check)
    result.problems.extend(experiment_file_problems(experiment, [t.name for t in trials], index=index, record=record))
    result.problems.extend(result_file_problems(experiment, trials))
    if index is not None:
        index.save()
    return result


def _never_registered(experiment: Storage, trial: str, name: str, known: list[Any]) -> bool:
    """Whether Ray's experiment state shows that it never registered checkpoint ``name`` of ``trial``
    (``known``: where the answer for the experiment is kept once read)."""
    from tunekit.experiment.snapshot import registered_in_state

    if not known:
        known.append(registered_in_state(experiment) or {})
    names = known[0].get(trial)
    return names is not None and name not in names


def _record_facts(experiment: Storage, index: ExperimentIndex | None) -> tuple[dict[str, Any] | None, str | None]:
    """What verify uses of tunekit's record (whether its driver may run, each trial's registered checkpoint) and
    why it cannot be read; on remote storage from the index while the listing shows the record unchanged."""
    from tunekit.experiment.record import RECORD_NAME, read_record

    def read() -> list[Any]:
        record, problem = read_record(experiment.filesystem, experiment.path)
        return [None if record is None else {**{k: record.get(k) for k in ("ended", "driver", "updated")}, "trials": [
            {"dir": e.get("dir"), "checkpoint": e.get("checkpoint")} for e in record.get("trials") or []
            if isinstance(e, dict)]}, problem]

    facts = read() if index is None else index.cached("\0record", index.root_stamp([RECORD_NAME]), read)
    return facts[0], facts[1]


def _registered_checks(experiment: Storage, trials: list[Any],
                       facts: tuple[dict[str, Any] | None, str | None]) -> list[CheckpointCheck]:
    """The checkpoint Ray registered as each trial's newest (tunekit's record names it) must be on storage.

    Checked once the run is over (its driver gone): while it runs, the record
    may lag the checkpoints by a second. A registered checkpoint that is a
    trial's own or a pin is verified above already; here only its absence.
    ``facts``: :func:`_record_facts`.
    """
    from tunekit.experiment.record import driver_running

    record = facts[0]
    if record is None or driver_running(record):
        return []
    names = {t.name for t in trials}
    out = []
    for entry in record.get("trials") or []:
        registered = entry.get("checkpoint") if isinstance(entry, dict) else None
        if not isinstance(registered, str) or entry.get("dir") not in names:
            continue
        path = posixpath.join(experiment.path, registered)
        if experiment.filesystem.get_file_info(path).type == pafs.FileType.NotFound:
            out.append(CheckpointCheck(entry["dir"], registered, None, "incomplete", (
                "registered by Ray as the trial's newest checkpoint (its Result.checkpoint, what a resume "
                "restores) but missing on storage",)))
    return out


def experiment_file_problems(experiment: Storage, trial_dirs: list[str] | None = None, *,
                             index: ExperimentIndex | None = None,
                             record: tuple[Any, str | None] | None = None) -> list[str]:
    """Damage to Ray's own files of the experiment (``tuner.pkl``, experiment state, search algorithm and
    callback state) and to tunekit's record, read as data only; given the trial directories found, a started
    trial's missing one. ``index``: the experiment's (remote), whose summary of Ray's experiment state (the one
    ``tunekit status`` keeps) stands while the listing shows the state files unchanged; ``record``: what
    :func:`_record_facts` read already."""
    from tunekit.experiment._pickles import driver_state_damage, tuner_pickle_problem
    from tunekit.experiment.record import read_record
    from tunekit.experiment.snapshot import read_state_problems, state_problems_from_index

    torn = tuner_pickle_problem(experiment)
    problems = [f"{torn}; `tunekit resume` can still continue the trials"] if torn else []
    driver = driver_state_damage(experiment)
    found, record_problem = record if record is not None else read_record(experiment.filesystem, experiment.path)
    if found is None and record_problem and not record_problem.startswith("no "):  # (there, but unreadable)
        problems.append(f"{record_problem}: tunekit's record of the run is lost")
    state = read_state_problems(experiment, trial_dirs) if index is None else \
        state_problems_from_index(experiment, index, trial_dirs)
    return problems + ([driver] if driver else []) + state


#: Hidden copies of whole checkpoints (``tunekit.checkpoint._trial_dir.leftovers``' kinds) and what each is.
_COPIES = {
    "kept": "kept while a newer checkpoint was written",
    "pinned": "a PBT donor's checkpoint pinned for a clone that has not read it yet (a paused trial's resume reads it)",
    "damaged": "a damaged checkpoint's copy kept by tunekit resume",
}


def _leftover_checks(trial: Any) -> list[CheckpointCheck]:
    where = trial.location
    out = []
    for name, kind in leftovers(where.filesystem, where.path):
        location = Storage(where.filesystem, posixpath.join(where.path, name), f"{where.uri.rstrip('/')}/{name}")
        if kind in _COPIES:  # a whole checkpoint's copy: verified like any checkpoint
            report = verify_checkpoint(location)
            out.append(CheckpointCheck(trial.name, name, _iteration(location), report.status,
                                       (*report.problems, _COPIES[kind])))
        elif kind == "writing":
            out.append(CheckpointCheck(trial.name, name, None, "unverified",
                                       ("being written by a live process",)))
        elif kind == "temporary":
            out.append(CheckpointCheck(trial.name, name, None, "interrupted", (
                "a hard-linked copy left half made (its worker was killed while making it; not damage: `tunekit gc "
                "--leftovers` or the trial's next save removes it)",)))
        else:
            out.append(CheckpointCheck(trial.name, name, None, "interrupted", (
                "an interrupted checkpoint write (its writer is gone; not damage: `tunekit gc --leftovers` or the "
                "trial's next save removes it)",)))
    return out
