"""The offline read model of an experiment: trials, checkpoints, exploits, and what "best" is.

Implementation home of the classes :mod:`tunekit.experiment.snapshot` exports;
:func:`tunekit.experiment.snapshot.read_experiment` builds them from an experiment
directory. Pure data plus the decisions made on it (ranking, verdicts, the
best checkpoint), with no I/O but hash verification of checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

from tunekit._checks import as_number, check_mode, check_scope
from tunekit.checkpoint._interrupted import INTERRUPTED_WRITE, interrupted_write
from tunekit.checkpoint._directory import verify_checkpoint
from tunekit._keys import INTERVAL_KEY, RESTORED_FROM_KEY, SAVE_BLOCKED_KEY, SAVE_WRITE_KEY

if TYPE_CHECKING:
    from tunekit.experiment._exploit_log import Exploit

#: The first word of the verdict on a checkpoint whose write never completed (not damage).
INTERRUPTED = "interrupted"

__all__ = ["BestCheckpoint", "CheckpointSummary", "ExperimentSnapshot", "RAY_KEYS", "RowsText",
           "TrialSnapshot", "format_counts", "ranked"]

#: What Ray Tune (and tunekit) add to every result: bookkeeping, not metrics.
RAY_KEYS = frozenset({
    "training_iteration", "timestamp", "time_this_iter_s", "time_total_s", "pid", "time_since_restore",
    "iterations_since_restore", "done", "should_checkpoint", "timesteps_total", "episodes_total",
    "timesteps_since_restore", "episodes_this_iter", "timesteps_this_iter", "node_ip", "date", "hostname",
    "trial_id", "experiment_id", "experiment_tag",
    # tunekit's own: what the last save cost and the interval CheckpointAutopilot chose (tunekit.schedule.interval),
    # the checkpoint a trial restored (tunekit.experiment.results)
    SAVE_BLOCKED_KEY, SAVE_WRITE_KEY, INTERVAL_KEY, RESTORED_FROM_KEY,
})


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
    #: The sizes its manifest lists (path -> bytes); why its manifest cannot be read; None without one (yet).
    manifest: dict[str, int] | str | None = field(default=None, repr=False, compare=False)
    #: Where it is stored (a :class:`~tunekit.storage._location.Storage`) when read from storage: what is verified (a
    #: filesystem object's ``py::`` URI does not resolve again); None: :attr:`uri`.
    location: Any = field(default=None, repr=False, compare=False)
    #: For a tunekit checkpoint without a manifest: whether Ray registered it (False: a write that never
    #: completed, not damage; None: not known, or it has its manifest).
    registered: bool | None = field(default=None, repr=False, compare=False)
    #: A multi-worker trial's Tune checkpoint (a pointer): the path of the Train checkpoint it stands for, whose
    #: verdict is its own; else None.
    points_at: str | None = field(default=None, repr=False, compare=False)

    @property
    def where(self) -> Any:
        """What locates it for a reader: :attr:`location`, else :attr:`uri`."""
        return self.location if self.location is not None else self.uri

    def as_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "uri": self.uri, "iteration": self.iteration, "metrics": self.metrics}
        if self.unsupported:
            out["unsupported"] = self.unsupported
        return out


def ranked(checkpoints: list[CheckpointSummary], metric: str, mode: Literal["max", "min"]) -> list[CheckpointSummary]:
    """Checkpoints best first by ``metric`` (ties: the earlier first); newest first if none records it.

    Checkpoints that do not record ``metric`` come after those that do, newest first.
    """
    sign = -1.0 if mode == "max" else 1.0
    scored: list[tuple[float, CheckpointSummary]] = []
    rest: list[CheckpointSummary] = []
    for c in checkpoints:  # (one pass: KeepCheckpoints ranks at every checkpoint of a sweep)
        value = as_number(c.metrics.get(metric))
        if value is None:
            rest.append(c)
        else:
            scored.append((sign * value, c))
    scored.sort(key=lambda entry: entry[0])  # (stable: ties keep their order)
    return [c for _, c in scored] + rest[::-1]


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


class RowsText:
    """A trial's result rows as JSON text, or a function returning it, given for :attr:`TrialSnapshot.results`:
    read and parsed when first asked for."""

    def __init__(self, text: str | Callable[[], str]) -> None:
        self.text = text


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
    #: Every result row, deduplicated (:func:`tunekit.experiment.results.dedupe_lineage`), oldest first.
    results: list[dict[str, Any]] = field(repr=False, default_factory=list)
    tag: str | None = None
    #: Iterations the trial ran that have no row in ``result.json``: rows Ray
    #: lost. Gaps its lineage explains (a PBT exploit, a warm start) are not
    #: counted (see :func:`tunekit.experiment.results.lost_iterations`).
    missing_iterations: list[int] = field(default_factory=list)

    @property
    def continued(self) -> bool:
        """True when the trial continued another checkpoint's complete state (a warm start, ``--extend``)."""
        start = self.config.get("tunekit_warm_start")
        return isinstance(start, dict) and start.get("mode") == "continue"

    def metric(self, name: str, scope: str = "last") -> float | None:
        """The trial's value of ``name`` over its ``scope``: last, max, min or mean over iterations."""
        if scope == "last":  # (asked of every trial by the readers: no check)
            return as_number(self.last_result.get(name))
        scope = check_scope("TrialSnapshot.metric", scope)
        values = [row.get(name) for row in self.results]
        numbers = [n for n in map(as_number, values) if n is not None]
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


def _results(trial: TrialSnapshot) -> list[dict[str, Any]]:
    rows = trial.__dict__.get("_results")
    if isinstance(rows, RowsText):  # (parsed once, when first asked for)
        from tunekit.storage._files import loads

        rows = trial.__dict__["_results"] = loads(rows.text if isinstance(rows.text, str) else rows.text())
    return [] if rows is None else rows


# A trial's rows stay text until asked for: most readers of a large experiment use each trial's newest row alone.
TrialSnapshot.results = property(_results, lambda trial, rows: trial.__dict__.update(_results=rows))  # type: ignore


@dataclass
class ExperimentSnapshot:
    """An experiment as read from its directory: the one model every reader answers from.

    ``problems`` lists the damage found, one line each: state and result
    files that could not be read whole, and checkpoints that failed
    verification when a reader looked at them (:meth:`best_checkpoint` verifies
    what it names). ``tunekit status`` and ``tunekit report`` print them and
    exit 2; :func:`tunekit.analysis._load.load_results` puts them in ``df.attrs``.
    """

    name: str
    location: str
    start_time: float | None
    state_file: str | None
    trials: list[TrialSnapshot]
    problems: list[str] = field(default_factory=list)
    #: PBT exploits, in the order Ray logged them.
    exploits: list[Exploit] = field(default_factory=list)
    #: ``experiment_state-*.json`` files newer than :attr:`state_file` that are damaged (newest first).
    damaged_state_files: list[str] = field(default_factory=list)
    #: Why ``tuner.pkl`` is not a whole pickle, or None (whole, or absent).
    tuner_pickle_damage: str | None = None
    #: Trials the run left unfinished because it stopped (Ctrl-C, SIGTERM, a killed driver), from tunekit's
    #: record: empty while its driver runs, or when every trial finished.
    interrupted: list[str] = field(default_factory=list)
    #: Trial id -> the checkpoint tunekit's record says the trial was registered at (a PBT pin, say).
    registered: dict[str, str] = field(default_factory=dict)
    #: The storage it was read from (a :class:`~tunekit.storage._location.Storage`), else None (:attr:`location` resolves).
    storage: Any = field(default=None, repr=False, compare=False)
    #: Every checkpoint's files (:func:`tunekit.checkpoint._layout.checkpoint_files`) where one listing read them.
    listed_files: dict[str, dict[str, int]] | None = field(default=None, repr=False, compare=False)
    #: The names of the files at the experiment's top as this read listed them (None: not listed).
    root_files: list[str] | None = field(default=None, repr=False, compare=False)
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
                 if as_number(v) is not None and k not in RAY_KEYS}
        return sorted(names)

    def not_finite(self, metric: str) -> int:
        """How many trials reported ``metric`` only as NaN or an infinity (never ranked: see :meth:`no_metric`)."""
        def finite_never(trial: TrialSnapshot) -> bool:
            values = [row[metric] for row in (trial.results or [trial.last_result]) if metric in row]
            return bool(values) and all(as_number(v) is None and isinstance(v, (float, type(None))) for v in values)

        return sum(finite_never(t) for t in self.trials)

    def no_metric(self, metric: str) -> str:
        """Why no trial can be ranked by ``metric``: it was never reported, or only as NaN."""
        bad = self.not_finite(metric)
        if bad:
            return (f"every value of {metric!r} the trials reported is NaN or infinite ({bad} trial(s)): "
                    "nothing to rank by")
        return f"no trial reported {metric!r}"

    def check_metric(self, call: str, metric: str) -> None:
        """Raise ConfigError naming the known metrics when no trial reported ``metric``."""
        from tunekit.errors import ConfigError

        if metric not in RAY_KEYS and any(as_number(t.last_result.get(metric)) is not None for t in self.trials):
            return  # (a trial's newest result has it: known without reading every row)
        known = self.metrics()
        if metric not in known and self.not_finite(metric):
            raise ConfigError(f"{call}: {self.no_metric(metric)}")
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
            answer = (True, "not a tunekit checkpoint")
        else:
            report = verify_checkpoint(checkpoint.where)
            answer = (report.ok, f"{report.status}: {'; '.join(report.problems)}" if not report.ok else "good")
            if not report.ok and checkpoint.registered is False and interrupted_write(report, checkpoint.where):
                answer = (False, f"{INTERRUPTED}: {INTERRUPTED_WRITE}")  # never best, and not damage
            elif report.ok and checkpoint.points_at is not None:
                answer = self._pointed_verdict(checkpoint.points_at)
        self._verdicts[checkpoint.uri] = answer
        if not answer[0] and not answer[1].startswith(INTERRUPTED):
            self.problems.append(f"checkpoint {checkpoint.uri} is {answer[1]}")
        return answer

    def _pointed_verdict(self, target: str) -> tuple[bool, str]:
        """A pointer's verdict: that of the Train checkpoint at ``target`` (every rank's part, the manifest over
        all); one missing on storage is damage."""
        pointed = next((c for t in self.trials for c in t.checkpoints
                        if c.location is not None and c.location.path.rstrip("/") == target.rstrip("/")), None)
        if pointed is None:  # (Train's storage_path elsewhere: looked for there, on the experiment's storage)
            try:
                there = self.storage is None or self.storage.filesystem.get_file_info(target).type.name != "NotFound"
            except OSError:
                there = True
            return (True, "good") if there else (
                False, f"incomplete: points at the multi-worker checkpoint {target}, which is missing on storage")
        ok, why = self.verdict(pointed)
        return (True, "good") if ok else (False, f"{why.split(':', 1)[0]}: points at {pointed.name}, which is {why}")

    def record_damage(self, checkpoint: CheckpointSummary, why: str) -> None:
        """A cheaper check than :meth:`verdict` found ``checkpoint`` damaged (``why``: its status and what is
        wrong): it does not verify, and the damage is in :attr:`problems`, once."""
        if checkpoint.uri not in self._verdicts:
            self._verdicts[checkpoint.uri] = (False, why)
            self.problems.append(f"checkpoint {checkpoint.uri} is {why}")

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
        value = as_number(chosen.metrics.get(metric)) if chosen is not None else None
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
        report``, ``tunekit quickstart`` and :func:`tunekit.analysis._load.best_checkpoint`
        all answer with this.
        """
        check_mode("best_checkpoint", mode)
        if scope is None:
            candidates = [(t, c) for t in self.trials for c in t.checkpoints
                          if as_number(c.metrics.get(metric)) is not None]
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

