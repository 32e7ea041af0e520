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
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow.fs as pafs

from tunekit._checks import check_mode, check_scope, is_number
from tunekit.checkpoint import METADATA_FILE as METADATA_NAME
from tunekit.checkpoint import read_metadata, unsupported_format, verify_checkpoint
from tunekit.errors import CheckpointError
from tunekit.experiment_dir import TrialDir, find_trials
from tunekit.results import dedupe_lineage, lost_iterations, parse_result_lines, read_text
from tunekit.storage import Storage, resolve_storage

__all__ = [
    "BestCheckpoint",
    "CheckpointSummary",
    "ExperimentSnapshot",
    "Exploit",
    "RAY_KEYS",
    "TrialSnapshot",
    "error_message",
    "format_counts",
    "ranked",
    "read_experiment",
    "read_exploits",
    "trial_tags",
]

_PICKLED = "CLOUDPICKLE_FALLBACK"
#: What Ray Tune adds to every result: bookkeeping, not metrics.
RAY_KEYS = frozenset({
    "training_iteration", "timestamp", "time_this_iter_s", "time_total_s", "pid", "time_since_restore",
    "iterations_since_restore", "done", "should_checkpoint", "timesteps_total", "episodes_total",
    "timesteps_since_restore", "episodes_this_iter", "timesteps_this_iter", "node_ip", "date", "hostname",
    "trial_id", "experiment_id", "experiment_tag",
})


def _clean(value: Any) -> Any:
    """JSON from Ray's encoder with its pickled blobs replaced by a marker."""
    if isinstance(value, dict):
        if value.get("_type") == _PICKLED:
            return "<pickled: not read>"
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


@dataclass
class CheckpointSummary:
    """One checkpoint of a trial."""

    name: str
    uri: str
    iteration: int | None
    metrics: dict[str, Any] = field(default_factory=dict)
    #: Why this tunekit cannot read it (a newer manifest format), else None.
    unsupported: str | None = None
    #: True when tunekit wrote it (its ``tunekit.json`` could be read).
    tunekit: bool = False

    def as_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "uri": self.uri, "iteration": self.iteration, "metrics": self.metrics}
        if self.unsupported:
            out["unsupported"] = self.unsupported
        return out


def _number(value: Any) -> float | None:
    return float(value) if is_number(value) else None


def ranked(checkpoints: list[CheckpointSummary], metric: str, mode: Literal["max", "min"]) -> list[CheckpointSummary]:
    """Checkpoints best first by ``metric`` (ties: the earlier first); newest first if none records it.

    Checkpoints that do not record ``metric`` come after those that do, newest first.
    """
    sign = -1.0 if mode == "max" else 1.0
    scored = [c for c in checkpoints if _number(c.metrics.get(metric)) is not None]
    rest = [c for c in reversed(checkpoints) if _number(c.metrics.get(metric)) is None]
    return sorted(scored, key=lambda c: sign * float(c.metrics[metric])) + rest


@dataclass(frozen=True)
class Exploit:
    """One PBT exploit from Ray's ``pbt_global.txt``, with trial ids for its tags."""

    target: str
    source: str
    #: The target's iteration and the donor checkpoint's, as Ray logged them.
    iteration: int
    source_iteration: int
    source_config: dict[str, Any]
    new_config: dict[str, Any]


@dataclass(frozen=True)
class BestCheckpoint:
    """The best checkpoint of an experiment for a metric, and the trial it belongs to."""

    trial: TrialSnapshot
    checkpoint: CheckpointSummary | None
    value: float | None
    #: Better-ranked checkpoints passed over because they did not verify, one line each.
    skipped: tuple[str, ...] = ()

    @property
    def trial_id(self) -> str:
        return self.trial.trial_id

    @property
    def uri(self) -> str | None:
        return self.checkpoint.uri if self.checkpoint is not None else None


@dataclass
class TrialSnapshot:
    """What the experiment directory says about one trial."""

    trial_id: str
    name: str
    trainable_name: str | None
    config: dict[str, Any]
    status: str
    iterations: int
    last_result: dict[str, Any]
    error: str | None
    num_failures: int
    checkpoints: list[CheckpointSummary]
    results: list[dict[str, Any]] = field(repr=False, default_factory=list)
    tag: str | None = None
    #: Iterations the trial ran that have no row in ``result.json``: rows Ray
    #: lost. Gaps its lineage explains (a PBT exploit, a warm start) are not
    #: counted (see :func:`tunekit.results.lost_iterations`).
    missing_iterations: list[int] = field(default_factory=list)

    @property
    def continued(self) -> bool:
        """True when the trial continued another checkpoint's complete state (a warm start, ``--extend``)."""
        start = self.config.get("tunekit_warm_start")
        return isinstance(start, dict) and start.get("mode") == "continue"

    def metric(self, name: str, scope: str = "last") -> float | None:
        """The trial's value of ``name`` over its ``scope``: last, max, min or mean over iterations."""
        scope = check_scope("TrialSnapshot.metric", scope)
        if scope == "last":
            values = [self.last_result.get(name)]
        else:
            values = [row.get(name) for row in self.results]
        numbers = [n for n in map(_number, values) if n is not None]
        if not numbers:
            return None
        if scope == "max":
            return max(numbers)
        if scope == "min":
            return min(numbers)
        if scope == "mean":
            return sum(numbers) / len(numbers)
        return numbers[-1]

    def as_dict(self) -> dict[str, Any]:
        return {
            "trial_id": self.trial_id,
            "name": self.name,
            "trainable_name": self.trainable_name,
            "config": self.config,
            "status": self.status,
            "iterations": self.iterations,
            "last_result": self.last_result,
            "error": self.error,
            "num_failures": self.num_failures,
            "checkpoints": [c.as_dict() for c in self.checkpoints],
            "missing_iterations": self.missing_iterations,
        }


@dataclass
class ExperimentSnapshot:
    """An experiment as read from its directory: the one model every reader answers from.

    ``problems`` lists the damage found, one line each: state and result
    files that could not be read whole, and checkpoints that failed
    verification when a reader looked at them (:meth:`best_checkpoint` verifies
    what it names). ``tunekit status`` and ``tunekit report`` print them and
    exit 2; :func:`tunekit.analysis.load_results` puts them in ``df.attrs``.
    """

    name: str
    location: str
    start_time: float | None
    state_file: str | None
    trials: list[TrialSnapshot]
    problems: list[str] = field(default_factory=list)
    #: PBT exploits, in the order Ray logged them.
    exploits: list[Exploit] = field(default_factory=list)
    _verdicts: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def damaged(self) -> bool:
        """True when a state, result or checkpoint file was found damaged."""
        return bool(self.problems)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for trial in self.trials:
            out[trial.status] = out.get(trial.status, 0) + 1
        return out

    def metrics(self) -> list[str]:
        """The numeric metrics the trials reported, sorted."""
        names = {k for t in self.trials for row in (t.results or [t.last_result]) for k, v in row.items()
                 if _number(v) is not None and k not in RAY_KEYS}
        return sorted(names)

    def check_metric(self, call: str, metric: str) -> None:
        """Raise ConfigError naming the known metrics when no trial reported ``metric``."""
        from tunekit.errors import ConfigError

        known = self.metrics()
        if known and metric not in known:
            shown = ", ".join(known[:15]) + (", ..." if len(known) > 15 else "")
            raise ConfigError(f"{call}: no trial reported metric {metric!r}; the trials reported: {shown}")

    def verdict(self, checkpoint: CheckpointSummary) -> tuple[bool, str]:
        """Whether ``checkpoint`` verifies (hashes against its manifest), and why not; cached.

        A checkpoint tunekit did not write verifies when the experiment holds
        no tunekit checkpoint at all (plain Ray Tune: nothing to check against).
        A failure is added to :attr:`problems`, once.
        """
        if checkpoint.uri in self._verdicts:
            return self._verdicts[checkpoint.uri]
        if checkpoint.unsupported:
            answer = (False, f"unsupported: {checkpoint.unsupported}")
        elif not checkpoint.tunekit and not any(c.tunekit for t in self.trials for c in t.checkpoints):
            answer = (True, "not a tunekit checkpoint: not verified")
        else:
            report = verify_checkpoint(checkpoint.uri)
            answer = (report.ok, f"{report.status}: {'; '.join(report.problems)}" if not report.ok else "good")
        self._verdicts[checkpoint.uri] = answer
        if not answer[0]:
            self.problems.append(f"checkpoint {checkpoint.uri} is {answer[1]}")
        return answer

    def _first_good(self, candidates: list[tuple[TrialSnapshot, CheckpointSummary]]) -> tuple[
            TrialSnapshot | None, CheckpointSummary | None, tuple[str, ...]]:
        skipped = []
        for trial, ckpt in candidates:
            ok, why = self.verdict(ckpt)
            if ok:
                return trial, ckpt, tuple(skipped)
            skipped.append(f"{ckpt.uri} ({why})")
        return None, None, tuple(skipped)

    def best_trial(self, metric: str, mode: Literal["max", "min"], *, scope: str = "last") -> TrialSnapshot | None:
        """The trial with the best ``metric`` over ``scope`` (None if no trial reported it)."""
        check_mode("best_trial", mode)
        scope = check_scope("best_trial", scope)
        scored = [(t.metric(metric, scope), t) for t in self.trials]
        scored = [(v, t) for v, t in scored if v is not None]
        if not scored:
            return None
        pick = max if mode == "max" else min
        return pick(scored, key=lambda pair: pair[0])[1]

    def best_checkpoint_of(self, trial: TrialSnapshot, metric: str, mode: Literal["max", "min"]) -> BestCheckpoint:
        """``trial``'s best checkpoint by ``metric`` that verifies (its newest good one if none records it)."""
        check_mode("best_checkpoint", mode)
        _, chosen, skipped = self._first_good([(trial, c) for c in ranked(trial.checkpoints, metric, mode)])
        value = _number(chosen.metrics.get(metric)) if chosen is not None else None
        return BestCheckpoint(trial, chosen, value if value is not None else trial.metric(metric), skipped)

    def best_checkpoint(
        self, metric: str, mode: Literal["max", "min"], *, scope: str | None = None
    ) -> BestCheckpoint | None:
        """The best checkpoint *that verifies* by ``metric``, and its trial: what "the best model" means.

        Without ``scope``: the checkpoint on storage, across all trials, with
        the best recorded ``metric`` (ties go to the earlier trial, then the
        earlier checkpoint). With a ``scope``, or when no checkpoint records
        ``metric``: the best trial by that scope (default its last value), then
        its best checkpoint. Either way a checkpoint that does not verify
        (corrupt, incomplete, a newer format) is passed over for the next
        best, named in :attr:`BestCheckpoint.skipped` and in :attr:`problems`.
        None if no trial reported ``metric``. ``tunekit status``, ``tunekit
        report``, ``tunekit quickstart`` and :func:`tunekit.analysis.best_checkpoint`
        all answer with this.
        """
        check_mode("best_checkpoint", mode)
        if scope is None:
            candidates = [(t, c) for t in self.trials for c in t.checkpoints
                          if _number(c.metrics.get(metric)) is not None]
            if candidates:
                sign = -1.0 if mode == "max" else 1.0
                candidates.sort(key=lambda pair: sign * float(pair[1].metrics[metric]))
                trial, chosen, skipped = self._first_good(candidates)
                if chosen is not None:
                    return BestCheckpoint(trial, chosen, float(chosen.metrics[metric]), skipped)  # type: ignore[arg-type]
        best = self.best_trial(metric, mode, scope=scope or "last")
        if best is None:
            return None
        return self.best_checkpoint_of(best, metric, mode)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "location": self.location,
            "start_time": self.start_time,
            "state_file": self.state_file,
            "counts": self.counts(),
            "problems": self.problems,
            "trials": [t.as_dict() for t in self.trials],
        }


def format_counts(counts: dict[str, int]) -> str:
    """``{"TERMINATED": 3, "ERROR": 1}`` -> ``"1 ERROR, 3 TERMINATED"``."""
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


def _state_files(experiment: Storage) -> list[pafs.FileInfo]:
    infos = experiment.filesystem.get_file_info(pafs.FileSelector(experiment.path))
    return sorted(
        (
            i for i in infos
            if i.type == pafs.FileType.File
            and i.base_name.startswith("experiment_state")
            and i.base_name.endswith(".json")
        ),
        key=lambda i: i.base_name,
    )


def _read_state(experiment: Storage, problems: list[str]) -> tuple[str | None, dict[str, Any]]:
    files = _state_files(experiment)
    if not files:
        return None, {}
    newest = files[-1]
    text = read_text(experiment.filesystem, newest.path) or ""
    try:
        state = json.loads(text)
        if not isinstance(state, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        problems.append(f"{newest.base_name} is damaged ({exc}); showing what the trial directories say")
        return newest.base_name, {}
    return newest.base_name, state


def _trials_from_state(state: dict[str, Any], problems: list[str]) -> dict[str, dict[str, Any]]:
    """relative_logdir -> {trial fields, runtime fields} from the state file."""
    out = {}
    for entry in state.get("trial_data") or []:
        try:
            trial_json, runtime_json = entry
            trial = json.loads(trial_json) if isinstance(trial_json, str) else dict(trial_json)
            runtime = json.loads(runtime_json) if isinstance(runtime_json, str) else dict(runtime_json)
        except (ValueError, TypeError) as exc:
            problems.append(f"a trial entry of the state file is damaged ({exc})")
            continue
        key = trial.get("relative_logdir") or trial.get("trial_id")
        out[str(key)] = {"trial": trial, "runtime": runtime}
    return out


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


def _read_params(experiment: Storage, trial: TrialDir, problems: list[str]) -> dict[str, Any] | None:
    params_text = read_text(experiment.filesystem, posixpath.join(trial.location.path, "params.json"))
    if not params_text:
        return None
    try:
        return json.loads(params_text)
    except ValueError:
        problems.append(f"{trial.name}/params.json is damaged")
        return None


def _read_trial_dir(
    experiment: Storage, trial: TrialDir, problems: list[str]
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], str | None]:
    fs = experiment.filesystem
    params = _read_params(experiment, trial, problems)
    results_text = read_text(fs, posixpath.join(trial.location.path, "result.json")) or ""
    rows, bad = parse_result_lines(results_text)
    if bad:
        problems.append(f"{trial.name}/result.json: {bad} damaged line(s) skipped")
    error = error_message(read_text(fs, posixpath.join(trial.location.path, "error.txt")))
    return params, rows, error


def _checkpoints(
    trial: TrialDir, raw_rows: list[dict[str, Any]], rows: list[dict[str, Any]], problems: list[str]
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
        try:
            meta = read_metadata(ckpt.location)
        except CheckpointError as exc:
            meta = {}
            if "unreadable" in str(exc) or "expected a JSON object" in str(exc):
                problems.append(f"checkpoint {ckpt.location.uri} is corrupt: {METADATA_NAME} cannot be read")
        meta_iteration = meta.get("iteration")
        if isinstance(meta_iteration, int):
            iteration = meta_iteration
        if not row and iteration is not None:  # class trainables save after the result
            row = next((r for r in rows if r.get("training_iteration") == iteration), {})
        # tunekit checkpoints carry their iteration's metrics too: Ray's
        # result.json can lose rows (a resumed trial's file restarted empty).
        saved = meta.get("metrics") if isinstance(meta.get("metrics"), dict) else {}
        metrics = {
            k: v for k, v in {**saved, **row}.items()
            if _number(v) is not None and k != "training_iteration"
        }
        out.append(CheckpointSummary(ckpt.name, ckpt.location.uri, iteration, metrics,
                                     unsupported_format(ckpt.location) if meta else None, tunekit=bool(meta)))
    return out


def _tag(trial: dict[str, Any], dir_name: str) -> str | None:
    """The trial's original experiment tag (its index), as PBT's logs name it."""
    tag = trial.get("experiment_tag")
    if isinstance(tag, str) and tag:
        return tag.split("@")[0]
    parts = dir_name.split("_")
    for i, part in enumerate(parts[:-1]):  # <trainable>_<id>_<index>_<params...>
        if len(part) == 5 and part.isdigit() and i + 1 < len(parts) and parts[i + 1].isdigit():
            return parts[i + 1]
    return None


def read_exploits(experiment: Storage, tags: dict[str, str]) -> list[Exploit]:
    """The exploits in Ray's ``pbt_global.txt`` (none if there is no such file).

    Args:
        tags: A trial's experiment tag (``"3_lr=0.01"``, or its index ``"3"``)
            to its trial id; a tag not in it stays as logged.
    """
    text = read_text(experiment.filesystem, posixpath.join(experiment.path, "pbt_global.txt")) or ""
    out = []
    for line in text.splitlines():
        try:
            target, source, target_iter, source_iter, source_config, new_config = json.loads(line)
            record = Exploit(
                target=tags.get(str(target), tags.get(str(target).split("_")[0], str(target))),
                source=tags.get(str(source), tags.get(str(source).split("_")[0], str(source))),
                iteration=int(target_iter),
                source_iteration=int(source_iter),
                source_config=dict(source_config or {}),
                new_config=dict(new_config or {}),
            )
        except (ValueError, TypeError):
            continue
        out.append(record)
    return out


def trial_tags(trials: list[TrialSnapshot]) -> dict[str, str]:
    """Each trial's experiment tag (and its index) -> its trial id, as ``pbt_global.txt`` names trials."""
    out: dict[str, str] = {}
    for t in trials:
        if t.tag is not None:  # Ray logs the full original tag ("0_lr=0.01"); older logs the index
            out[t.tag] = t.trial_id
            out.setdefault(t.tag.split("_")[0], t.trial_id)
    return out


_TRIAL_ID_IN_NAME = re.compile(r"(?:^|_)([0-9a-f]{5}_\d{5})(?:_|$)")


def _id_in_name(dir_name: str) -> str:
    """Ray's trial id in its directory name (``<trainable>_<id>_<index>_...``), else the name."""
    match = _TRIAL_ID_IN_NAME.search(dir_name)
    return match[1] if match else dir_name


def _infer_status(rows: list[dict[str, Any]], error: str | None) -> str:
    if error:
        return "ERROR"
    if not rows:
        return "PENDING"
    return "TERMINATED" if rows[-1].get("done") else "RUNNING"


def read_experiment(location: str | Storage, *, filesystem: Any = None, results: bool = True) -> ExperimentSnapshot:
    """Read the experiment at ``location``: trials, statuses, results, checkpoints.

    A damaged state or result file does not stop the reading: what can be read
    is returned and :attr:`ExperimentSnapshot.problems` says what could not.
    ``results=False`` reads the experiment's structure only (trials, configs,
    statuses, PBT exploits, the state file's damage): no result rows and no
    checkpoints, for readers that take those from elsewhere
    (:func:`tunekit.analysis.load_results` reads the rows itself).

    Raises:
        ExperimentError: ``location`` is not an experiment directory.
        StorageError: the storage cannot be read.
    """
    experiment = resolve_storage(location, filesystem=filesystem)
    trial_dirs = find_trials(experiment)
    problems: list[str] = []
    state_file, state = _read_state(experiment, problems)
    recorded = _trials_from_state(state, problems)
    start_time = (state.get("stats") or {}).get("start_time")

    trials = []
    seen = set()
    for trial_dir in trial_dirs:
        seen.add(trial_dir.name)
        entry = recorded.get(trial_dir.name, {})
        trial, runtime = entry.get("trial", {}), entry.get("runtime", {})
        if results:
            params, raw_rows, error = _read_trial_dir(experiment, trial_dir, problems)
        else:
            params, raw_rows, error = _read_params(experiment, trial_dir, problems) if "config" not in trial else None, [], None
        for copy in trial_dir.damaged_copies:
            problems.append(f"{trial_dir.name}/{copy}: a damaged checkpoint's copy that tunekit resume kept "
                            "(`tunekit verify` says what is wrong with it)")
        rows = dedupe_lineage(raw_rows)
        last = _clean(runtime.get("last_result")) or (rows[-1] if rows else {})
        if rows and rows[-1].get("training_iteration", 0) >= last.get("training_iteration", 0):
            last = rows[-1]
        checkpoints = _checkpoints(trial_dir, raw_rows, rows, problems) if results else []
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
                trial_id=str(trial.get("trial_id") or last.get("trial_id") or _id_in_name(trial_dir.name)),
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
                tag=_tag(trial, trial_dir.name),
            )
        )
    for key, entry in recorded.items():  # trials that never got a directory
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
    exploits = read_exploits(experiment, trial_tags(trials))
    for t in trials:
        t.missing_iterations = lost_iterations(
            [r.get("training_iteration") for r in t.results],
            clones=[(e.iteration, e.source_iteration) for e in exploits if e.target == t.trial_id],
            continued=t.continued,
        )
    return ExperimentSnapshot(
        name=posixpath.basename(experiment.path.rstrip("/")),
        location=experiment.uri,
        start_time=start_time,
        state_file=state_file,
        trials=trials,
        problems=problems,
        exploits=exploits,
    )

