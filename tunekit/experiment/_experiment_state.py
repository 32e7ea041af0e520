"""Ray's experiment state (``experiment_state-*.json``) read as data: the newest whole one, its trials, what it
says Ray registered, and the trial directories it names that storage lacks. No Ray, nothing unpickled (the
checkpoint manager's pickle is read by its opcodes: :func:`tunekit.experiment._pickles.registered_names`).

Implementation tier of :mod:`tunekit.experiment.snapshot`, which re-exports :func:`read_state_problems` and
:func:`registered_in_state`.
"""

from __future__ import annotations

import posixpath
from typing import Any, Iterable

from tunekit.checkpoint._layout import root_files
from tunekit.experiment.record import read_record
from tunekit.storage._files import loads, read_bytes
from tunekit.storage._location import Storage

__all__ = ["missing_dirs", "read_state", "read_state_problems", "registered_in_state", "state_files", "state_summary",
           "trials_from_state"]


def read_state(experiment: Storage, problems: list[str], damaged: list[str],
                files: list[str] | None = None) -> tuple[str | None, dict[str, Any]]:
    """The newest experiment state that reads whole; newer damaged ones are named in ``problems`` and ``damaged``.
    ``files``: the experiment's top-level files (:func:`~tunekit.checkpoint._layout.root_files`), when listed already."""
    why = []
    files = root_files(experiment) if files is None else files
    for name in reversed([f for f in files if f.startswith("experiment_state") and f.endswith(".json")]):
        text = read_bytes(experiment.filesystem, posixpath.join(experiment.path, name)) or b""
        try:
            state = loads(text)
            if not isinstance(state, dict) or not isinstance(state.get("trial_data", []), list):
                raise ValueError("not a Ray Tune experiment state")
        except ValueError as exc:
            damaged.append(name)
            why.append(f"{name} is damaged ({exc})")
            continue
        if why:
            problems.append(f"{'; '.join(why)}; read {name}, the newest one that is whole")
        return name, state
    if why:
        problems.append(f"{'; '.join(why)}; no older one is whole: showing what the trial directories say")
        return damaged[0], {}
    return None, {}


def registered_in_state(experiment: Storage, recorded: dict[str, Any] | None = None
                           ) -> dict[str, set[str] | None] | None:
    """Trial directory -> the names of the checkpoints Ray's newest whole experiment state lists for it (read as
    data, see :func:`tunekit.experiment._pickles.registered_names`), the one tunekit's record names as its newest added;
    None without an experiment state. A checkpoint Ray registered is never an interrupted write.
    ``recorded``: the state's trials (:func:`trials_from_state`, with runtimes), when read already."""
    from tunekit.experiment._pickles import registered_names

    if recorded is None:
        name, state = read_state(experiment, [], [])
        recorded = trials_from_state(state, []) if name is not None and state else None
    if not recorded:
        return None
    out = {key: registered_names(entry["runtime"].get("checkpoint_manager"), key) for key, entry in recorded.items()}
    record, _ = read_record(experiment.filesystem, experiment.path)
    for entry in (record or {}).get("trials") or []:
        newest = entry.get("checkpoint") if isinstance(entry, dict) else None
        if isinstance(newest, str) and isinstance(out.get(str(entry.get("dir")), None), set):
            out[str(entry["dir"])].add(newest.rpartition("/")[2])
    return out


def read_state_problems(experiment: Storage, trial_dirs: Iterable[str] | None = None) -> list[str]:
    """The experiment state's damage, one line each (empty when the newest one is whole); given the trial
    directories storage holds (``trial_dirs``), also each trial the state names as started whose directory is
    gone."""
    problems: list[str] = []
    _, state = read_state(experiment, problems, [])
    if trial_dirs is not None:
        problems += missing_dirs(trials_from_state(state, problems, runtimes=False), set(trial_dirs))
    return problems


def missing_dirs(recorded: dict[str, Any], present: set[str]) -> list[str]:
    """A line for each trial of the experiment state that had started (Ray makes its directory then) and whose
    directory storage lacks: its results and checkpoints are lost."""
    return [f"trial {entry['trial'].get('trial_id') or key} ({entry['trial'].get('status')}): its directory {key} "
            "is missing on storage (the experiment state names it; its results and checkpoints are gone)"
            for key, entry in recorded.items()
            if key not in present and str(entry["trial"].get("status") or "PENDING") != "PENDING"]


def trials_from_state(state: dict[str, Any], problems: list[str], *, runtimes: bool = True) -> dict[str, Any]:
    """relative_logdir -> {trial fields, runtime fields (none unless ``runtimes``: 2/3 of the file)}."""
    out = {}
    for entry in state.get("trial_data") or []:
        try:
            trial_json, runtime_json = entry
            trial = loads(trial_json) if isinstance(trial_json, str) else dict(trial_json)
            runtime_json = runtime_json if runtimes else {}
            runtime = loads(runtime_json) if isinstance(runtime_json, str) else dict(runtime_json)
        except (ValueError, TypeError) as exc:
            problems.append(f"a trial entry of the state file is damaged ({exc})")
            continue
        key = trial.get("relative_logdir") or trial.get("trial_id")
        out[str(key)] = {"trial": trial, "runtime": runtime}
    return out


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


def state_files(files: list[str]) -> list[str]:
    """Ray's experiment state files among an experiment's top-level file names."""
    return [f for f in files if f.startswith("experiment_state") and f.endswith(".json")]


#: What the readers use of each trial's entry in Ray's experiment state (the rest: pickled blobs and Ray's internals).
_STATE_TRIAL_KEYS = ("trial_id", "trainable_name", "status", "experiment_tag", "relative_logdir")


def state_summary(experiment: Storage, files: list[str], *, runtimes: bool) -> dict[str, Any]:
    """What the readers use of Ray's newest whole experiment state, as JSON: its name, start time, damage, and
    each trial's fields (config, status, tag; with ``runtimes``, its last result and failures)."""
    problems: list[str] = []
    damaged: list[str] = []
    state_file, state = read_state(experiment, problems, damaged, files)
    trials = {}
    for key, entry in trials_from_state(state, problems, runtimes=runtimes).items():
        trial, runtime = entry["trial"], entry["runtime"]
        slim = {k: trial[k] for k in _STATE_TRIAL_KEYS if k in trial}
        if "config" in trial:
            slim["config"] = _clean(trial["config"])
        trials[key] = {"trial": slim, "runtime": {"last_result": _clean(runtime.get("last_result")),
                                                  "num_failures": runtime.get("num_failures")}}
    return {"file": state_file, "start_time": (state.get("stats") or {}).get("start_time"), "trials": trials,
            "problems": problems, "damaged": damaged}
