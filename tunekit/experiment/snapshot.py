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

import json
import posixpath
from typing import Any, Callable

from tunekit._checks import as_number
from tunekit.experiment._exploit_log import PBT_LOG, id_in_name, read_exploits, tag_of, trial_tags
from tunekit.experiment._index import RemoteIndex
from tunekit.checkpoint._manifest import MANIFEST_FILE, manifest_sizes, size_problems
from tunekit.checkpoint._directory import METADATA_FILE as METADATA_NAME
from tunekit.checkpoint._directory import read_metadata
from tunekit.errors import CheckpointError
from tunekit.checkpoint._layout import (POINTER_KEY, TRAIN_DIR, CheckpointDir, TrialDir, checkpoint_files, pointer_target,
                                    scan_experiment)
from tunekit.experiment.record import interrupted_trials, read_record
from tunekit._keys import RESTORED_FROM_KEY
from tunekit.experiment.results import dedupe_lineage, exploits_by_trial, parse_result_lines, rows_lost
from tunekit.storage._files import gc_paused, read_text
from tunekit.experiment._pickles import driver_state_damage, tuner_pickle_problem
from tunekit.storage._location import Storage, resolve_storage
from tunekit.experiment._experiment_state import (missing_dirs, read_state, read_state_problems, registered_in_state,
                                       trials_from_state)

from tunekit.experiment._snapshot_model import (RAY_KEYS, BestCheckpoint, CheckpointSummary, ExperimentSnapshot, Exploit,
                                     TrialSnapshot, format_counts, ranked)
__all__ = [
    "BestCheckpoint", "CheckpointSummary", "ExperimentSnapshot", "Exploit", "PBT_LOG", "RAY_KEYS", "TrialSnapshot",
    "check_storage", "error_message", "format_counts", "ranked", "read_experiment", "read_exploits",
    "read_state_problems", "registered_checkpoints", "registered_in_state", "trial_tags",
]

_PICKLED = "CLOUDPICKLE_FALLBACK"


def _clean(value: Any) -> Any:
    """JSON from Ray's encoder with its pickled blobs replaced by a marker."""
    if isinstance(value, dict):
        if value.get("_type") == _PICKLED:
            return "<pickled: not read>"
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def check_storage(snapshot: ExperimentSnapshot) -> dict[str, int]:
    """What ``status`` and ``report`` check beyond the record, damage into ``problems``: every tunekit checkpoint's
    files against its manifest's sizes (listed, not hashed: a missing or cut file) and Ray's newest
    search-algorithm and callback states (torn: Ray would start over). Returns trial id -> its checkpoints' bytes."""
    experiment = snapshot.storage or resolve_storage(snapshot.location)
    files = snapshot.listed_files if snapshot.listed_files is not None else \
        checkpoint_files(experiment, [f"{t.name}/{c.name}" for t in snapshot.trials for c in t.checkpoints])
    for trial in snapshot.trials:
        for ckpt in trial.checkpoints:
            if ckpt.manifest is None or ckpt.name.startswith(f"{TRAIN_DIR}/"):
                continue  # (none yet: a write in flight, for verify)
            wrong = [ckpt.manifest] if isinstance(ckpt.manifest, str) else \
                size_problems(ckpt.manifest, files.get(f"{trial.name}/{ckpt.name}", {}))
            if wrong:
                snapshot.record_damage(ckpt, f"corrupt: {'; '.join(wrong)}")
    if torn := driver_state_damage(experiment, snapshot.root_files):
        snapshot.problems.append(torn)
    return {t.trial_id: sum(sum(files.get(f"{t.name}/{c.name}", {}).values()) for c in t.checkpoints)
            for t in snapshot.trials}


def error_message(text: str | None) -> str | None:
    """The line of an ``error.txt`` that says what went wrong: the last ``Type: message`` line.

    Ray's error files end with the exception raised in the trial, often
    after its traceback and Ray's wrapping; a tunekit error there is named
    with its own one line.
    """
    if not text:
        return None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("tunekit.errors.")]
    if ours:
        return ours[-1].removeprefix("tunekit.errors.")
    return lines[-1] if lines else None


def _read(experiment: Storage, trial: TrialDir, name: str, index: RemoteIndex | None,
          parse: Callable[[str | None], Any] = lambda text: text) -> Any:
    """``parse`` of the text of the trial's file ``name`` (None: no such file), from the index where it holds it."""
    def read() -> Any:
        return parse(read_text(experiment.filesystem, posixpath.join(trial.location.path, name)))

    return read() if index is None else index.value(f"{trial.name}/{name}", read,
                                                    absent=parse(None))


def _read_params(experiment: Storage, trial: TrialDir, problems: list[str],
                 index: RemoteIndex | None = None) -> dict[str, Any] | None:
    params_text = _read(experiment, trial, "params.json", index)
    if not params_text:
        return None
    try:
        return json.loads(params_text)
    except ValueError:
        problems.append(f"{trial.name}/params.json is damaged")
        return None


def _read_trial_dir(
    experiment: Storage, trial: TrialDir, problems: list[str], index: RemoteIndex | None = None
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], str | None]:
    params = _read_params(experiment, trial, problems, index)
    rows, bad = _read(experiment, trial, "result.json", index, lambda text: parse_result_lines(text or ""))
    if bad:
        problems.append(f"{trial.name}/result.json: {bad} damaged line(s) skipped")
    error = _read(experiment, trial, "error.txt", index, error_message)
    return params, rows, error


def _metadata(ckpt: CheckpointDir) -> dict[str, Any] | str:
    """A checkpoint's ``tunekit.json``, or why it cannot be read."""
    try:
        return read_metadata(ckpt.location)
    except CheckpointError as exc:
        return str(exc)


def _checkpoint_files(trial: TrialDir, ckpt: CheckpointDir, index: RemoteIndex | None) -> tuple[Any, Any]:
    """A checkpoint's ``tunekit.json`` (or why not) and :func:`manifest_sizes`, from the index where it holds them."""
    if index is None:
        return _metadata(ckpt), manifest_sizes(ckpt.location)
    where = f"{trial.name}/{ckpt.name}"
    meta = index.value(f"{where}/{METADATA_NAME}", lambda: _metadata(ckpt),
                       absent=f"not a tunekit checkpoint (no {METADATA_NAME})")
    unsupported, listed = index.value(f"{where}/{MANIFEST_FILE}",
                                      lambda: list(manifest_sizes(ckpt.location)), absent=[None, None])
    return meta, (unsupported, listed)


def _checkpoints(
    trial: TrialDir, raw_rows: list[dict[str, Any]], rows: list[dict[str, Any]], problems: list[str],
    index: RemoteIndex | None = None,
) -> list[CheckpointSummary]:
    by_name = {}
    for row in raw_rows:  # the newest row naming a checkpoint wins
        name = row.get("checkpoint_dir_name")
        if isinstance(name, str):
            by_name[name] = row
    out = []
    for ckpt in trial.checkpoints:
        row = by_name.get(ckpt.name, {})
        iteration = row.get("training_iteration")
        meta, (unsupported, listed) = _checkpoint_files(trial, ckpt, index)
        if not isinstance(meta, dict):
            if "unreadable" in meta or "expected a JSON object" in meta:
                problems.append(f"checkpoint {ckpt.location.uri} is corrupt: {METADATA_NAME} cannot be read")
            meta = {}
        meta_iteration = meta.get("iteration")
        if isinstance(meta_iteration, int):
            iteration = meta_iteration
        if not row and iteration is not None:  # class trainables save after the result
            row = next((r for r in rows if r.get("training_iteration") == iteration), {})
        # tunekit checkpoints carry their iteration's metrics too: Ray's result.json can lose rows (a resumed trial's)
        saved = meta.get("metrics") if isinstance(meta.get("metrics"), dict) else {}
        metrics = {
            k: v for k, v in {**saved, **row}.items()
            if as_number(v) is not None and k != "training_iteration"
        }
        # (tunekit.json lost, the manifest lists it: damage)
        if not meta and not isinstance(listed, dict):  # (neither file tunekit's: another writer's checkpoint)
            unsupported, listed = None, None
        value = meta.get(POINTER_KEY)
        out.append(CheckpointSummary(ckpt.name, ckpt.location.uri, iteration, metrics, unsupported,
                                     tunekit=bool(meta) or isinstance(listed, dict),
                                     manifest=listed, location=ckpt.location,
                                     points_at=pointer_target(ckpt.location.filesystem, ckpt.location.path, value)
                                     if isinstance(value, str) else None))
    return out


def _mark_registered(experiment: Storage, trials: list[TrialSnapshot], recorded: dict[str, Any] | None) -> None:
    """Whether Ray registered each tunekit checkpoint that has no manifest (else: a write that never completed),
    asked only where there is one (its experiment state's checkpoint lists are read then); a multi-worker
    trial's Train checkpoint counts as registered when a Tune checkpoint points at it."""
    unmarked = [(t, c) for t in trials for c in t.checkpoints  # (a Train checkpoint's ranks may lack theirs)
                if (c.manifest is None and c.tunekit) or c.name.startswith(f"{TRAIN_DIR}/")]
    if not unmarked:
        return
    pointed = {c.points_at.rstrip("/") for t in trials for c in t.checkpoints if c.points_at}
    registered = registered_in_state(experiment, recorded) or {} \
        if any(not c.name.startswith(f"{TRAIN_DIR}/") for _, c in unmarked) else {}
    for trial, ckpt in unmarked:
        if ckpt.name.startswith(f"{TRAIN_DIR}/"):  # (Ray Train's: Tune holds it by a pointer, or not at all)
            ckpt.registered = ckpt.location.path.rstrip("/") in pointed
            continue
        names = registered.get(trial.name)
        ckpt.registered = None if names is None else ckpt.name in names


def _infer_status(rows: list[dict[str, Any]], error: str | None) -> str:
    if error:
        return "ERROR"
    if not rows:
        return "PENDING"
    return "TERMINATED" if rows[-1].get("done") else "RUNNING"


def read_experiment(location: str | Storage, *, filesystem: Any = None, results: bool = True,
                    keep_index: bool = True) -> ExperimentSnapshot:
    """Read the experiment at ``location``: trials, statuses, results, checkpoints.

    A damaged state or result file does not stop the reading: what can be read
    is returned and :attr:`ExperimentSnapshot.problems` says what could not.
    ``results=False`` reads the experiment's structure only (trials, configs,
    statuses, PBT exploits, the state file's damage): no result rows, last
    results, failure counts or checkpoints, for readers that take those from elsewhere
    (:func:`tunekit.analysis._load.load_results` reads the rows itself). A remote experiment is read from one
    listing and the index the readers keep (:mod:`tunekit.experiment._index`); ``keep_index=False`` writes no index.

    Raises:
        ExperimentError: ``location`` is not an experiment directory.
        StorageError: the storage cannot be read.
    """
    with gc_paused():
        return _read_experiment(resolve_storage(location, filesystem=filesystem), results, keep_index)


def _read_experiment(experiment: Storage, results: bool, keep_index: bool) -> ExperimentSnapshot:
    index = RemoteIndex(experiment) if results and not experiment.is_local else None  # (listed once asked)
    trial_dirs, files = scan_experiment(experiment, checkpoints=results,
                                        listed=index.children if index is not None else None)
    problems: list[str] = []
    damaged_states: list[str] = []
    state_file, state = read_state(experiment, problems, damaged_states, files)
    pickle_damage = tuner_pickle_problem(experiment)
    if pickle_damage:
        problems.append(f"{pickle_damage}; `tunekit resume` can still continue the trials")
    recorded = trials_from_state(state, problems, runtimes=results)
    start_time = (state.get("stats") or {}).get("start_time")

    trials = []
    seen = set()
    for trial_dir in trial_dirs:
        seen.add(trial_dir.name)
        entry = recorded.get(trial_dir.name, {})
        trial, runtime = entry.get("trial", {}), entry.get("runtime", {})
        if results:
            params, raw_rows, error = _read_trial_dir(experiment, trial_dir, problems, index)
        else:
            params, raw_rows, error = _read_params(experiment, trial_dir, problems) if "config" not in trial else None, [], None
        for copy in trial_dir.damaged_copies:
            problems.append(f"{trial_dir.name}/{copy}: a damaged checkpoint's copy that tunekit resume kept "
                            "(`tunekit verify` says what is wrong with it)")
        rows = dedupe_lineage(raw_rows)
        last = _clean(runtime.get("last_result")) or (rows[-1] if rows else {})
        if rows and rows[-1].get("training_iteration", 0) >= last.get("training_iteration", 0):
            last = rows[-1]
        checkpoints = _checkpoints(trial_dir, raw_rows, rows, problems, index) if results else []
        iterations = max(
            [int(last.get("training_iteration") or 0)]
            + [c.iteration for c in checkpoints if isinstance(c.iteration, int)]
        )
        status = trial.get("status") or _infer_status(rows, error)
        # Without the state file's record, the config of the newest row is the
        # trial's current one (params.json keeps the first, before any exploit).
        config = _clean(trial.get("config")) if "config" in trial else (
            rows[-1]["config"] if rows and isinstance(rows[-1].get("config"), dict) else (params or {}))
        if status == "PENDING" and iterations:
            status = "RUNNING"  # the state file is older than the trial's progress
        trials.append(
            TrialSnapshot(
                trial_id=str(trial.get("trial_id") or last.get("trial_id") or id_in_name(trial_dir.name)),
                name=trial_dir.name,
                trainable_name=trial.get("trainable_name"),
                config=config,
                status=status,
                iterations=iterations,
                last_result=last,
                error=error,
                num_failures=int(runtime.get("num_failures") or 0),
                checkpoints=checkpoints,
                results=rows,
                tag=tag_of(trial, trial_dir.name),
            )
        )
    problems += missing_dirs(recorded, seen)
    for key, entry in recorded.items():  # trials that never got a directory (or lost it)
        if key in seen:
            continue
        trial, runtime = entry["trial"], entry["runtime"]
        last = _clean(runtime.get("last_result")) or {}
        trials.append(
            TrialSnapshot(
                trial_id=str(trial.get("trial_id") or key),
                name=key,
                trainable_name=trial.get("trainable_name"),
                config=_clean(trial.get("config") or {}),
                status=str(trial.get("status") or "PENDING"),
                iterations=int(last.get("training_iteration") or 0),
                last_result=last,
                error=None,
                num_failures=int(runtime.get("num_failures") or 0),
                checkpoints=[],
            )
        )
    if start_time is None:
        starts = [r.get("timestamp") for t in trials for r in t.results[:1]]
        numbers = [s for s in starts if isinstance(s, (int, float))]
        start_time = min(numbers) if numbers else None
    trials.sort(key=lambda t: t.trial_id)
    _mark_registered(experiment, trials, recorded if results else None)
    exploits = read_exploits(experiment, trial_tags(trials), files)
    record, record_problem = read_record(experiment.filesystem, experiment.path)
    if record is None and record_problem and not record_problem.startswith("no "):  # (there, but unreadable)
        problems.append(f"{record_problem}: tunekit's record of the run (its trials' ends, its driver) is lost; "
                        "`tunekit gc` refuses without it")
    interrupted = interrupted_trials(experiment.filesystem, experiment.path, trials, record) if record else []
    clones = exploits_by_trial(exploits)
    for t in (t for t in trials if t.results):  # (no rows, none lost)
        t.missing_iterations = rows_lost([r.get("training_iteration") for r in t.results],
                                         [r.get(RESTORED_FROM_KEY) for r in t.results], own=t.name,
                                         exploits=clones.get(t.trial_id, []), continued=t.continued)
    if index is not None and keep_index:
        index.save()
    return ExperimentSnapshot(
        listed_files=index.checkpoint_files() if index is not None else None, root_files=files,
        name=posixpath.basename(experiment.path.rstrip("/")),
        location=experiment.uri,
        start_time=start_time,
        state_file=state_file,
        trials=trials,
        problems=problems,
        exploits=exploits,
        damaged_state_files=damaged_states, tuner_pickle_damage=pickle_damage,
        interrupted=interrupted,
        registered=registered_checkpoints(record),
        storage=experiment,
    )


def registered_checkpoints(record: dict[str, Any] | None) -> dict[str, str]:
    """Trial id -> the checkpoint tunekit's ``record`` says the trial was registered at (its path in the
    experiment: a PBT clone's may be its donor's pin)."""
    return {t.get("trial_id"): t["checkpoint"] for t in (record or {}).get("trials") or []
            if isinstance(t, dict) and isinstance(t.get("checkpoint"), str)}
