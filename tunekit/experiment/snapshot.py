"""Read a Ray Tune experiment directory without Ray and without unpickling anything.

Works on experiments written by tunekit and by plain Ray Tune, local or on any
storage :func:`tunekit.resolve_storage` accepts. Sources, all plain JSON:

* the newest ``experiment_state-*.json``: trial ids, configs, statuses, last
  results, failure counts. Ray embeds cloudpickle blobs in it (storage
  context, placement groups, checkpoint manager); they are skipped, never
  decoded;
* each trial directory: ``params.json``, ``result.json`` (every iteration,
  deduplicated after restores), ``error.txt`` and ``checkpoint_*``
  directories (with ``tunekit.json`` when tunekit wrote them).

``tuner.pkl``, ``*.pkl`` searcher and callback states, ``params.pkl`` and
``error.pkl`` are never opened.

Example:
    >>> import tempfile
    >>> read_experiment(tempfile.mkdtemp())  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    tunekit.errors.ExperimentError: ...: not a Ray Tune experiment directory ...
"""

from __future__ import annotations

import posixpath
from typing import Any

from tunekit.checkpoint._layout import (TRAIN_DIR, check_experiment_dir, checkpoint_files, not_an_experiment,
                                       pointer_target, scan_experiment)
from tunekit.checkpoint._manifest import size_problems
from tunekit.experiment._experiment_state import (missing_dirs, read_state_problems, registered_in_state, state_files,
                                                  state_summary)
from tunekit.experiment._exploit_log import PBT_LOG, Exploit, id_in_name, read_exploits, tag_of, trial_tags
from tunekit.experiment._index import INDEX_NAME, ExperimentIndex
from tunekit.experiment._pickles import driver_state_damage, tuner_pickle_problem
from tunekit.experiment._snapshot_model import (RAY_KEYS, BestCheckpoint, CheckpointSummary, ExperimentSnapshot,
                                                RowsText, TrialSnapshot, format_counts, ranked)
from tunekit.experiment._trial_files import error_message, structure_summary, trial_summary
from tunekit.experiment.record import interrupted_trials, read_record
from tunekit.experiment.results import exploits_by_trial, rows_lost
from tunekit.storage._files import gc_paused
from tunekit.storage._location import Storage, resolve_storage

__all__ = [
    "BestCheckpoint", "CheckpointSummary", "ExperimentSnapshot", "Exploit", "PBT_LOG", "RAY_KEYS", "TrialSnapshot",
    "check_storage", "error_message", "format_counts", "ranked", "read_experiment", "read_exploits",
    "read_state_problems", "registered_checkpoints", "registered_in_state", "state_problems_from_index", "trial_tags",
]

def check_storage(snapshot: ExperimentSnapshot) -> dict[str, int]:
    """What ``status`` and ``report`` check beyond the record, damage into ``problems``: every tunekit checkpoint's
    files against its manifest's sizes (listed, not hashed: a missing or cut file) and Ray's newest
    search-algorithm and callback states (torn: Ray would start over). Returns trial id -> its checkpoints' bytes."""
    experiment = snapshot.storage or resolve_storage(snapshot.location)
    files = snapshot.listed_files if snapshot.listed_files is not None else \
        checkpoint_files(experiment, [f"{t.name}/{c.name}" for t in snapshot.trials for c in t.checkpoints])
    sizes: dict[str, int] = {}
    for trial in snapshot.trials:
        sizes[trial.trial_id] = 0
        for ckpt in trial.checkpoints:
            listed = files.get(f"{trial.name}/{ckpt.name}", {})
            sizes[trial.trial_id] += sum(listed.values())
            if ckpt.manifest is None or ckpt.name.startswith(f"{TRAIN_DIR}/"):
                continue  # (none yet: a write in flight, for verify)
            wrong = [ckpt.manifest] if isinstance(ckpt.manifest, str) else size_problems(ckpt.manifest, listed)
            if wrong:
                snapshot.record_damage(ckpt, f"corrupt: {'; '.join(wrong)}")
    if torn := driver_state_damage(experiment, snapshot.root_files):
        snapshot.problems.append(torn)
    return sizes


def _structure_state(experiment: Storage, files: list[str]) -> dict[str, Any]:
    """:func:`~tunekit.experiment._experiment_state.state_summary` without runtimes (last results, failures): from
    the index where it holds the state files as they are (parsing Ray's state is most of such a read)."""
    def build() -> dict[str, Any]:
        return state_summary(experiment, files, runtimes=False)

    state = ExperimentIndex(experiment).stored(_STATE, state_files(files), build) if INDEX_NAME in files else build()
    none = {"last_result": None, "num_failures": None}
    return {**state, "trials": {key: {"trial": entry["trial"], "runtime": none} for key, entry in state["trials"].items()}}


def _infer_status(newest: dict[str, Any] | None, error: str | None) -> str:
    if error:
        return "ERROR"
    if not newest:
        return "PENDING"
    return "TERMINATED" if newest.get("done") else "RUNNING"


def _mark_registered(experiment: Storage, trials: list[TrialSnapshot]) -> None:
    """Whether Ray registered each tunekit checkpoint that has no manifest (else: a write that never completed),
    asked only where there is one (its experiment state's checkpoint lists are read then); a multi-worker
    trial's Train checkpoint counts as registered when a Tune checkpoint points at it."""
    unmarked = [(t, c) for t in trials for c in t.checkpoints  # (a Train checkpoint's ranks may lack theirs)
                if (c.manifest is None and c.tunekit) or c.name.startswith(f"{TRAIN_DIR}/")]
    if not unmarked:
        return
    pointed = {c.points_at.rstrip("/") for t in trials for c in t.checkpoints if c.points_at}
    registered = registered_in_state(experiment) or {} \
        if any(not c.name.startswith(f"{TRAIN_DIR}/") for _, c in unmarked) else {}
    for trial, ckpt in unmarked:
        if ckpt.name.startswith(f"{TRAIN_DIR}/"):  # (Ray Train's: Tune holds it by a pointer, or not at all)
            ckpt.registered = ckpt.location.path.rstrip("/") in pointed
            continue
        names = registered.get(trial.name)
        ckpt.registered = None if names is None else ckpt.name in names


def read_experiment(location: str | Storage, *, filesystem: Any = None, results: bool = True,
                    keep_index: bool = True) -> ExperimentSnapshot:
    """Read the experiment at ``location``: trials, statuses, results, checkpoints.

    A damaged state or result file does not stop the reading: what can be read
    is returned and :attr:`ExperimentSnapshot.problems` says what could not.
    ``results=False`` reads the experiment's structure only (trials, configs,
    statuses, PBT exploits, the state file's damage): no result rows, last
    results, failure counts or checkpoints, for readers that take those from elsewhere
    (:func:`tunekit.analysis._load.load_results` reads the rows itself). With results, the experiment is read from
    one listing and the index the readers keep (:mod:`tunekit.experiment._index`): only trials the listing shows
    changed since are read from their files; ``keep_index=False`` writes no index.

    Raises:
        ExperimentError: ``location`` is not an experiment directory.
        StorageError: the storage cannot be read.
    """
    with gc_paused():
        return _read_experiment(resolve_storage(location, filesystem=filesystem), results, keep_index)


#: The index's entry for Ray's experiment state (:func:`~tunekit.experiment._experiment_state.state_summary`).
_STATE = "\0state"


def _state_of(experiment: Storage, index: ExperimentIndex, files: list[str]) -> dict[str, Any]:
    """:func:`~tunekit.experiment._experiment_state.state_summary` with runtimes, from ``index`` while the listing
    shows the state files as it recorded them."""
    return index.cached(_STATE, index.root_stamp(state_files(files)),
                        lambda: state_summary(experiment, files, runtimes=True))


def state_problems_from_index(experiment: Storage, index: ExperimentIndex, trial_dirs: list[str] | None) -> list[str]:
    """:func:`read_state_problems` from the summary of Ray's experiment state that ``index`` keeps (what
    ``tunekit status`` reads), read again only when the listing shows a state file changed."""
    state = _state_of(experiment, index, index.top()[1])
    problems = list(state["problems"])
    return problems if trial_dirs is None else problems + missing_dirs(state["trials"], set(trial_dirs))


def _read_experiment(experiment: Storage, results: bool, keep_index: bool) -> ExperimentSnapshot:
    problems: list[str] = []
    if results:  # (every trial's files: read from one listing and the index, see tunekit.experiment._index)
        index: ExperimentIndex | None = ExperimentIndex(experiment)
        check_experiment_dir(experiment)
        names, files = index.top()
        state = _state_of(experiment, index, files)
        per_file = None if experiment.is_local else index  # (remote: a changed trial's unchanged files unread)
        summaries = [(name, index.trial(name, lambda name=name: trial_summary(experiment, name, index, per_file)))
                     for name in names]
        summaries = [(name, summary) for name, summary in summaries if summary is not None]
        if not summaries and not state_files(files):
            raise not_an_experiment(experiment)
    else:
        index = per_file = None
        trial_dirs, files = scan_experiment(experiment, checkpoints=False)
        state = _structure_state(experiment, files)
        summaries = [(d.name, structure_summary(experiment, d, state["trials"].get(d.name))) for d in trial_dirs]
    problems += state["problems"]
    pickle_damage = tuner_pickle_problem(experiment)
    if pickle_damage:
        problems.append(f"{pickle_damage}; `tunekit resume` can still continue the trials")
    recorded = state["trials"]
    start_time = state["start_time"]

    trials = []
    for name, summary in summaries:
        problems += summary["problems"]
        rows = RowsText(summary["rows"]) if index is None else RowsText(
            lambda name=name, summary=summary: index.trial_rows(  # type: ignore[union-attr]
                name, summary, lambda: trial_summary(experiment, name, index, per_file)))
        trials.append(_trial_snapshot(experiment, name, summary, recorded.get(name, {}), rows))
    seen = {name for name, _ in summaries}
    problems += missing_dirs(recorded, seen)
    for key, entry in recorded.items():  # trials that never got a directory (or lost it)
        if key in seen:
            continue
        trial, runtime = entry["trial"], entry["runtime"]
        last = runtime.get("last_result") or {}
        trials.append(
            TrialSnapshot(
                trial_id=str(trial.get("trial_id") or key),
                name=key,
                trainable_name=trial.get("trainable_name"),
                config=trial.get("config") or {},
                status=str(trial.get("status") or "PENDING"),
                iterations=int(last.get("training_iteration") or 0),
                last_result=last,
                error=None,
                num_failures=int(runtime.get("num_failures") or 0),
                checkpoints=[],
            )
        )
    if start_time is None:
        starts = [summary["started"] for _, summary in summaries]
        numbers = [s for s in starts if isinstance(s, (int, float))]
        start_time = min(numbers) if numbers else None
    trials.sort(key=lambda t: t.trial_id)
    _mark_registered(experiment, trials)
    exploits = read_exploits(experiment, trial_tags(trials), files)
    record, record_problem = read_record(experiment.filesystem, experiment.path)
    if record is None and record_problem and not record_problem.startswith("no "):  # (there, but unreadable)
        problems.append(f"{record_problem}: tunekit's record of the run (its trials' ends, its driver) is lost; "
                        "`tunekit gc` refuses without it")
    interrupted = interrupted_trials(experiment.filesystem, experiment.path, trials, record) if record else []
    clones = exploits_by_trial(exploits)
    lineages = {name: summary["lineage"] for name, summary in summaries}
    for t in (t for t in trials if lineages.get(t.name)):  # (no rows, none lost)
        iterations, restored = zip(*lineages[t.name])
        t.missing_iterations = rows_lost(list(iterations), list(restored), own=t.name,
                                         exploits=clones.get(t.trial_id, []), continued=t.continued)
    if index is not None and keep_index:
        index.save()
    return ExperimentSnapshot(
        listed_files=index.checkpoint_files() if index is not None else None, root_files=files,
        name=posixpath.basename(experiment.path.rstrip("/")),
        location=experiment.uri,
        start_time=start_time,
        state_file=state["file"],
        trials=trials,
        problems=problems,
        exploits=exploits,
        damaged_state_files=state["damaged"], tuner_pickle_damage=pickle_damage,
        interrupted=interrupted,
        registered=registered_checkpoints(record),
        storage=experiment,
    )


def _trial_snapshot(experiment: Storage, name: str, summary: dict[str, Any], entry: dict[str, Any],
                    rows: RowsText) -> TrialSnapshot:
    """The trial of directory ``name`` from its :func:`~tunekit.experiment._trial_files.trial_summary` (its rows
    given apart: ``rows``) and its entry in :func:`~tunekit.experiment._experiment_state.state_summary`."""
    trial, runtime = entry.get("trial", {}), entry.get("runtime", {})
    newest, error = summary["last_row"], summary["error"]
    last = runtime.get("last_result") or newest or {}
    if newest and newest.get("training_iteration", 0) >= last.get("training_iteration", 0):
        last = newest
    checkpoints = []
    for c in summary["checkpoints"]:
        location = experiment.join(f"{name}/{c['name']}")  # (a Train checkpoint's name holds a "/")
        pointer = c["pointer"]
        checkpoints.append(CheckpointSummary(
            c["name"], location.uri, c["iteration"], c["metrics"], c["unsupported"], tunekit=c["tunekit"],
            manifest=c["manifest"], location=location,
            points_at=pointer_target(location.filesystem, location.path, pointer) if isinstance(pointer, str)
            else None))
    iterations = max([int(last.get("training_iteration") or 0)]
                     + [c.iteration for c in checkpoints if isinstance(c.iteration, int)])
    status = trial.get("status") or _infer_status(newest, error)
    # Without the state file's record, the config of the newest row is the
    # trial's current one (params.json keeps the first, before any exploit).
    config = trial.get("config") if "config" in trial else (
        newest["config"] if newest and isinstance(newest.get("config"), dict) else (summary["params"] or {}))
    if status == "PENDING" and iterations:
        status = "RUNNING"  # the state file is older than the trial's progress
    return TrialSnapshot(
        trial_id=str(trial.get("trial_id") or last.get("trial_id") or id_in_name(name)),
        name=name,
        trainable_name=trial.get("trainable_name"),
        config=config,
        status=status,
        iterations=iterations,
        last_result=last,
        error=error,
        num_failures=int(runtime.get("num_failures") or 0),
        checkpoints=checkpoints,
        results=rows,
        tag=tag_of(trial, name),
    )


def registered_checkpoints(record: dict[str, Any] | None) -> dict[str, str]:
    """Trial id -> the checkpoint tunekit's ``record`` says the trial was registered at (its path in the
    experiment: a PBT clone's may be its donor's pin)."""
    return {t.get("trial_id"): t["checkpoint"] for t in (record or {}).get("trials") or []
            if isinstance(t, dict) and isinstance(t.get("checkpoint"), str)}
