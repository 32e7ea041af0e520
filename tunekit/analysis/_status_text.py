"""What ``tunekit status`` (and ``resume``) print for an experiment: the trials, notes, the best checkpoint, damage.

Rendering only: the decisions live in the read model (:mod:`tunekit.experiment.snapshot`). Imports neither Ray nor torch.
"""

from __future__ import annotations

import shlex
from typing import Any

from tunekit.checkpoint._layout import TRAIN_DIR, checkpoint_count

__all__ = ["BEST_SHOWN", "ROW_LIMIT", "print_snapshot", "rows_shown"]


def _short(value: Any, width: int = 12) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text if len(text) <= width else text[: width - 1] + "~"


#: Above this many trials, the table shows the ones worth a look (see :func:`rows_shown`) unless ``--all``.
ROW_LIMIT = 50
#: How many of the best trials by the metric the shortened table shows.
BEST_SHOWN = 10


def rows_shown(snapshot: Any, metric: str | None, mode: str | None) -> list[Any]:
    """The trials a table of a large experiment shows: those in ERROR, those with damage, those not finished,
    and the best :data:`BEST_SHOWN` by ``metric`` (without one: the first by id). With a metric the rows are
    ranked, best first (trials without a value after, in trial order); without one they are in trial order."""
    damaged = " ".join(snapshot.problems)
    keep = {t.trial_id for t in snapshot.trials if t.status not in ("TERMINATED",) or t.error or t.name in damaged}
    scored = [(t.metric(metric), t.trial_id) for t in snapshot.trials] if metric and mode else []
    ranked = [i for _, i in sorted(((v, i) for v, i in scored if v is not None), key=lambda s: s[0],
                                   reverse=mode == "max")]
    keep |= set(ranked[:BEST_SHOWN]) if ranked else {t.trial_id for t in snapshot.trials[:BEST_SHOWN]}
    place = {trial_id: n for n, trial_id in enumerate(ranked)}
    shown = [t for t in snapshot.trials if t.trial_id in keep]
    return sorted(shown, key=lambda t: place.get(t.trial_id, len(place)))  # (a stable sort: ties in trial order)


def print_snapshot(snapshot: Any, metric: str | None, mode: str | None, sizes: dict[str, int] | None = None,
                   *, everything: bool = False) -> None:
    """The table ``status`` and ``resume`` print; ``sizes``: :func:`~tunekit.experiment.snapshot.check_storage`'s, if it ran.
    Of more than :data:`ROW_LIMIT` trials only those worth a look get a row, unless ``everything``."""
    import time as _time

    from tunekit._keys import INTERVAL_KEY
    from tunekit.schedule.interval import trial_intervals
    from tunekit.experiment.results import format_ranges
    from tunekit.experiment.snapshot import check_storage, format_counts
    from tunekit.table import format_bytes, format_table

    started = (
        _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(snapshot.start_time))
        if snapshot.start_time
        else "unknown"
    )
    counts = format_counts(snapshot.counts()) or "no trials"
    print(f"experiment {snapshot.name} at {snapshot.location}")
    print(f"started {started}; state file {snapshot.state_file or 'none'}; {len(snapshot.trials)} trials: {counts}")
    keys: list[str] = []
    for trial in snapshot.trials:
        for key, value in trial.config.items():
            if key not in keys and not isinstance(value, (dict, list)):
                keys.append(key)
    varying = [k for k in keys if _differ([t.config.get(k) for t in snapshot.trials])][:5]
    chosen = trial_intervals({t.trial_id: t.metric(INTERVAL_KEY) for t in snapshot.trials})  # the autopilot's
    headers = ["trial_id", "status", "iter", *( [metric] if metric else []), *varying, "ckpts", "ckpt size",
               *(["ckpt every"] if chosen else []), "error"]
    sizes = check_storage(snapshot) if sizes is None else sizes
    rows = []
    shown = snapshot.trials if everything or len(snapshot.trials) <= ROW_LIMIT else rows_shown(snapshot, metric, mode)
    for trial in shown:
        row = [trial.trial_id, trial.status, str(trial.iterations)]
        if metric:
            value = trial.metric(metric)
            row.append("-" if value is None else _short(value))
        row += [_short(trial.config.get(k, "-")) for k in varying]
        row += [checkpoint_count(c.name for c in trial.checkpoints), format_bytes(sizes[trial.trial_id])]
        if chosen:
            row.append(chosen[0][trial.trial_id])
        row.append(_short(trial.error or "", 60))
        rows.append(row)
    print(format_table(headers, rows))
    if len(shown) < len(snapshot.trials):
        what = f"the best {BEST_SHOWN} by {metric}, best first," if metric and mode else f"the first {BEST_SHOWN}"
        print(f"({len(snapshot.trials) - len(shown)} more trials not shown: this table holds {what} and every one "
              "in ERROR, unfinished or damaged; --all shows every trial)")
    every = [c for t in snapshot.trials for c in t.checkpoints]
    train = sum(c.name.startswith(f"{TRAIN_DIR}/") for c in every)
    print(f"checkpoints: {len(every) - train}" + (f" and {train} Ray Train checkpoints of multi-worker trials (every "
          "rank's part)" if train else "") + f", {format_bytes(sum(sizes.values()))}")
    if chosen:
        print(f"checkpoint interval (chosen by CheckpointAutopilot from save cost and failures): {chosen[1]}")
    for trial in snapshot.trials:
        if trial.missing_iterations:
            print(
                f"note: {trial.trial_id}'s result.json lacks iterations "
                f"{format_ranges(trial.missing_iterations)}, which it ran (Ray lost those rows; "
                "tunekit.callbacks.ParquetLogger keeps every row)"
            )
    for trial in snapshot.trials:
        start = trial.config.get("tunekit_warm_start")
        if isinstance(start, dict) and start.get("checkpoint"):
            how = "continuing its complete state" if start.get("mode") == "continue" else "its weights only"
            print(f"note: {trial.trial_id} was warm-started from {start.get('checkpoint')} ({how})")
    for trial in snapshot.trials:
        for ckpt in trial.checkpoints:
            if ckpt.unsupported:
                print(f"note: {trial.trial_id}'s {ckpt.name} is unsupported: {ckpt.unsupported}")
    if metric and mode:
        best = snapshot.best_checkpoint(metric, mode)
        if best is None:
            print(snapshot.no_metric(metric))
        else:
            for line in best.skipped:
                print(f"note: passed over as best, it does not verify: {line}")
            value = "-" if best.value is None else _short(best.value)
            print(f"best trial for {metric} ({mode}): {best.trial_id} {metric}={value}")
            if best.checkpoint is not None:
                why = snapshot.verdict(best.checkpoint)[1]
                print(f"best checkpoint: {best.checkpoint.uri} ({'verified' if why == 'good' else 'unverified: ' + why})")
            else:
                print("best checkpoint: none that verifies")
    _print_interrupted(snapshot)
    for problem in snapshot.problems:
        print(f"damaged: {problem}")


def _print_interrupted(snapshot: Any) -> None:
    """That the run stopped before its trials finished, and where ``tunekit resume`` continues each: at the
    iteration after the state its newest checkpoint holds (tunekit's own ``iteration``, whatever Ray registered
    the checkpoint under), the rows reported after that state run again."""
    if not snapshot.interrupted:
        return
    print(f"interrupted: the run stopped before {len(snapshot.interrupted)} trial(s) finished (Ctrl-C, SIGTERM or "
          f"a killed driver); `tunekit resume {shlex.quote(snapshot.location)}` continues them")
    from tunekit.checkpoint._pins import is_pinned

    for trial in snapshot.trials:
        if trial.status in ("TERMINATED", "ERROR"):
            continue
        pin = snapshot.registered.get(trial.trial_id)
        if pin is not None and is_pinned(pin):
            print(f"note: {trial.trial_id} continues from {pin}, the PBT donor's checkpoint it cloned (pinned), "
                  "if it verifies")
            continue
        newest = max((c for c in trial.checkpoints if c.iteration is not None and not c.name.startswith(
            f"{TRAIN_DIR}/")), key=lambda c: (c.iteration, c.name), default=None)
        if newest is None:
            print(f"note: {trial.trial_id} has no checkpoint: resume starts it again")
            continue
        again = f"; iterations {newest.iteration + 1}-{trial.iterations} run again" \
            if trial.iterations > newest.iteration else ""
        print(f"note: {trial.trial_id} continues at iteration {newest.iteration + 1} from {newest.name}, the state of "
              f"iteration {newest.iteration} (resume verifies it first, and names any it passes over){again}")


def _differ(values: list[Any]) -> bool:
    """Whether ``values`` (a config key's, one per trial) are not all the same (1 and 1.0 differ, as shown)."""
    try:
        return len({(type(v), v) for v in values}) > 1
    except TypeError:  # (an unhashable value)
        return len({repr(v) for v in values}) > 1
