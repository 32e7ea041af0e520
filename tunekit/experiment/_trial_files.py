"""What the readers take from one trial directory: its parameters, result rows, error and checkpoints.

Implementation tier of :mod:`tunekit.experiment.snapshot`: :func:`trial_summary` is everything a reader takes from
a trial's directory, as JSON, so that the experiment's index (:mod:`tunekit.experiment._index`) can keep it while
one listing shows the directory unchanged. Nothing is unpickled.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any, Callable

from tunekit._checks import as_number
from tunekit._keys import RESTORED_FROM_KEY
from tunekit.checkpoint._directory import METADATA_FILE as METADATA_NAME
from tunekit.checkpoint._directory import read_metadata
from tunekit.checkpoint._layout import POINTER_KEY, CheckpointDir, TrialDir, listed_trial_dir
from tunekit.checkpoint._manifest import MANIFEST_FILE, manifest_sizes
from tunekit.errors import CheckpointError
from tunekit.experiment._index import ExperimentIndex
from tunekit.experiment._snapshot_model import CheckpointSummary
from tunekit.experiment.results import dedupe_lineage, parse_result_lines
from tunekit.storage._files import read_text
from tunekit.storage._location import Storage

__all__ = ["error_message", "structure_summary", "trial_summary"]


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


def _read(experiment: Storage, trial: TrialDir, name: str, index: ExperimentIndex | None,
          parse: Callable[[str | None], Any] = lambda text: text) -> Any:
    """``parse`` of the text of the trial's file ``name`` (None: no such file), from the index where it holds it."""
    def read() -> Any:
        return parse(read_text(experiment.filesystem, posixpath.join(trial.location.path, name)))

    return read() if index is None else index.value(f"{trial.name}/{name}", read,
                                                    absent=parse(None))


def _read_params(experiment: Storage, trial: TrialDir, problems: list[str],
                 index: ExperimentIndex | None = None) -> dict[str, Any] | None:
    params_text = _read(experiment, trial, "params.json", index)
    if not params_text:
        return None
    try:
        return json.loads(params_text)
    except ValueError:
        problems.append(f"{trial.name}/params.json is damaged")
        return None


def _read_trial_dir(
    experiment: Storage, trial: TrialDir, problems: list[str], index: ExperimentIndex | None = None
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


def _checkpoint_files(trial: TrialDir, ckpt: CheckpointDir, index: ExperimentIndex | None) -> tuple[Any, Any]:
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
    index: ExperimentIndex | None = None,
) -> list[CheckpointSummary]:
    """The trial's checkpoints, a pointer's :attr:`CheckpointSummary.points_at` as its metadata holds it (the
    reader resolves it: :func:`tunekit.checkpoint._layout.pointer_target`)."""
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
                                     points_at=value if isinstance(value, str) else None))
    return out


def trial_summary(experiment: Storage, name: str, index: ExperimentIndex,
                   per_file: ExperimentIndex | None) -> dict[str, Any] | None:
    """Everything the readers take from the trial directory ``name`` (from ``index``'s listing), as JSON: its
    checkpoints, parameters, deduplicated rows, error and damage; None when it is not a trial's directory.
    ``per_file``: where each file's parsed contents are kept (remote storage), else None (read directly)."""
    trial_dir = listed_trial_dir(experiment, name, index.children)
    if trial_dir is None:
        return None
    problems: list[str] = []
    params, raw_rows, error = _read_trial_dir(experiment, trial_dir, problems, per_file)
    _copies_damage(trial_dir, problems)
    rows = dedupe_lineage(raw_rows)
    checkpoints = [
        {"name": c.name, "iteration": c.iteration, "metrics": c.metrics, "unsupported": c.unsupported,
         "tunekit": c.tunekit, "manifest": c.manifest, "pointer": c.points_at}
        for c in _checkpoints(trial_dir, raw_rows, rows, problems, per_file)]
    return {"params": params, **_rows(rows), "error": error, "problems": problems, "checkpoints": checkpoints}


def structure_summary(experiment: Storage, trial_dir: TrialDir, entry: dict[str, Any] | None) -> dict[str, Any]:
    """:func:`_trial_summary` without results and checkpoints (``read_experiment(results=False)``): the
    parameters only where Ray's experiment state holds no config."""
    problems: list[str] = []
    params = _read_params(experiment, trial_dir, problems) if "config" not in (entry or {}).get("trial", {}) else None
    _copies_damage(trial_dir, problems)
    return {"params": params, **_NO_ROWS, "error": None, "problems": problems, "checkpoints": []}


def _rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A trial's rows in its summary: as JSON text (parsed only by a reader that asks for them:
    :attr:`TrialSnapshot.results`), with what every read needs beside it: the newest row (the trial's status
    and config), the first one's time (the experiment's start) and each row's iteration and restored checkpoint
    (the rows Ray lost)."""
    return {"rows": json.dumps(rows, separators=(",", ":")), "last_row": rows[-1] if rows else None,
            "started": rows[0].get("timestamp") if rows else None,
            "lineage": [[r.get("training_iteration"), r.get(RESTORED_FROM_KEY)] for r in rows]}


def _copies_damage(trial_dir: TrialDir, problems: list[str]) -> None:
    for copy in trial_dir.damaged_copies:
        problems.append(f"{trial_dir.name}/{copy}: a damaged checkpoint's copy that tunekit resume kept "
                        "(`tunekit verify` says what is wrong with it)")


_NO_ROWS = _rows([])
