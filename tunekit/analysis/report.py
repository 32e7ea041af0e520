"""``tunekit report``: a self-contained HTML page with PNG plots of an experiment.

The page embeds its plots (PNG, base64), so it can be mailed or archived as
one file; the PNGs are also written beside it. matplotlib is imported here
only, with the Agg backend: nothing needs a display.
"""

from __future__ import annotations

import base64
import html
import io
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from tunekit.analysis._report_plots import learning_curves, lineage_plot, scatter, schedules
from tunekit.analysis._load import load_results, pbt_lineage
from tunekit.errors import ConfigError, ExperimentError
from tunekit.checkpoint._layout import checkpoint_count
from tunekit._keys import INTERVAL_KEY
from tunekit.schedule.interval import trial_intervals
from tunekit.analysis._status_text import BEST_SHOWN, ROW_LIMIT, rows_shown
from tunekit.experiment.results import format_ranges
from tunekit.experiment.snapshot import (RAY_KEYS, BestCheckpoint, ExperimentSnapshot, check_storage, format_counts,
                              read_experiment)
from tunekit.storage._location import Storage, resolve_storage

__all__ = ["ReportSummary", "guess_metric", "hyperparameters", "write_report"]

_GUESSES = [("accuracy", "max"), ("mean_accuracy", "max"), ("score", "max"), ("reward", "max"),
            ("loss", "min"), ("mean_loss", "min"), ("val_loss", "min")]
_SKIP = RAY_KEYS


@dataclass
class ReportSummary:
    """Where the report went and what it shows."""

    html: Path
    images: list[Path]
    metric: str
    mode: str
    #: The best checkpoint that verifies, and its trial (what ``tunekit status`` names).
    best: BestCheckpoint | None
    #: Damage found while reading (the report shows it in a banner); empty when none.
    problems: list[str]


def guess_metric(df: pd.DataFrame) -> tuple[str, Literal["max", "min"]]:
    """A metric to rank trials by when none is given: a well-known name, else the first numeric one."""
    for name, mode in _GUESSES:
        if name in df.columns:
            return name, mode  # type: ignore[return-value]
    for column in df.columns:
        if column not in _SKIP and not column.startswith(("config/", "trial_id")) and pd.api.types.is_numeric_dtype(df[column]):
            return column, "max"
    raise ExperimentError("no numeric metric in the results; pass --metric and --mode")


def _png(fig: Any, path: Path) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    data = buffer.getvalue()
    path.write_bytes(data)
    return base64.b64encode(data).decode()


def _source(exploit: Any) -> str:
    """An exploit's donor as the report names it (an undone one says so)."""
    return f"{exploit.source} (undone: {exploit.target} restored its own checkpoint)" if exploit.undone \
        else str(exploit.source)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_fmt(v)}" for k, v in value.items())
    return "" if value is None else str(value)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:1100px;color:#222;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem} h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0} td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:left}
th{background:#f4f4f4} img{max-width:100%;border:1px solid #eee} code{background:#f4f4f4;padding:.1rem .3rem}
.muted{color:#666} .damage{background:#fdecea;border:1px solid #e0a8a1;padding:.5rem 1rem;margin:1rem 0}
.warn{color:#8a3b12}
"""


def write_report(
    location: str | Storage,
    *,
    output: str | os.PathLike[str] | None = None,
    metric: str | None = None,
    mode: Literal["max", "min"] | None = None,
) -> ReportSummary:
    """Write ``index.html`` (plots embedded) and its PNGs into ``output``.

    Args:
        location: The experiment directory (path or URI).
        output: A local directory (default: ``EXP/tunekit_report`` for a local
            experiment, ``./tunekit_report_<name>`` for a remote one).
        metric, mode: What ranks trials (default: guessed from the results).

    Raises:
        ExperimentError: not an experiment, or it has no results yet.
    """
    if (metric is None) != (mode is None):
        raise ConfigError("report: metric and mode go together")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    experiment = resolve_storage(location)
    snapshot: ExperimentSnapshot = read_experiment(experiment)
    check_storage(snapshot)  # (a cut checkpoint file or a torn search state is damage, as status says)
    with warnings.catch_warnings():  # the report shows the damage and the gaps itself
        warnings.simplefilter("ignore")
        df = load_results(experiment, snapshot=snapshot)
    if df.empty:
        raise ExperimentError(f"{experiment.uri}: no results yet, nothing to report")
    if metric is None:
        metric, mode = guess_metric(df)
    else:
        snapshot.check_metric("--metric", metric)
    if metric not in df.columns:
        raise ConfigError(f"--metric: no trial reported metric {metric!r}")
    assert mode is not None
    out = Path(output) if output else (
        Path(experiment.path) / "tunekit_report" if experiment.is_local else Path(f"tunekit_report_{snapshot.name}")
    )
    _check_output(out)
    staging = None
    try:
        staging = Path(tempfile.mkdtemp(prefix=".tunekit_report.tmp-", dir=out))  # (moved into place at the end)
        summary = _write(experiment, snapshot, df, metric, mode, out, staging, plt)
        for path in sorted(staging.iterdir(), key=lambda p: p.name == "index.html"):  # the page last
            os.replace(path, out / path.name)
        (out / REPORT_MARKER).write_text("written by tunekit report\n")
    except OSError as exc:  # a full disk, a lost mount: the report there before stays whole
        raise ConfigError(f"cannot write the report into {out} ({exc.strerror or type(exc).__name__}); "
                          "the report there before is unchanged") from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return summary


def _trials_section(snapshot: ExperimentSnapshot, df: pd.DataFrame, metric: str, mode: Literal["max", "min"],
                    params: list[str]) -> list[str]:
    """The trials' table (of a large experiment: those worth a look, as ``tunekit status`` shows them)."""
    shown = [k for k in params] or sorted({k for t in snapshot.trials for k in t.config if not _not_a_hyperparameter(k)})[:4]
    trial_rows = []
    last = df.groupby("trial_id").tail(1).set_index("trial_id")
    chosen = trial_intervals({t.trial_id: t.metric(INTERVAL_KEY) for t in snapshot.trials})  # the autopilot's
    listed = snapshot.trials if len(snapshot.trials) <= ROW_LIMIT else rows_shown(snapshot, metric, mode)
    for t in listed:
        value = last[metric].get(t.trial_id) if t.trial_id in last.index else None
        every = [chosen[0][t.trial_id]] if chosen else []
        trial_rows.append([t.trial_id, t.status, t.iterations, value, *(t.config.get(k) for k in shown),
                           checkpoint_count(c.name for c in t.checkpoints), *every, (t.error or "")[:80]])
    left_out = "" if len(listed) == len(snapshot.trials) else (
        f"<p>{len(listed)} of {len(snapshot.trials)} trials: the {BEST_SHOWN} best by {html.escape(metric)}, best first, and "
        "those in ERROR, unfinished or damaged (every trial: <code>tunekit status EXP --all</code>).</p>")
    out = ["<h2>Trials</h2>" + left_out + _table(
        ["trial", "status", "iterations", f"last {metric}", *shown, "checkpoints",
         *(["checkpoint every"] if chosen else []), "error"], trial_rows)]
    if chosen:
        out.append(f"<p>Checkpoint interval, chosen by CheckpointAutopilot from each trial's save cost and the "
                   f"failures seen: {html.escape(chosen[1])}.</p>")
    return out


def _write(experiment: Storage, snapshot: ExperimentSnapshot, df: pd.DataFrame, metric: str,
           mode: Literal["max", "min"], out: Path, staging: Path, plt: Any) -> ReportSummary:
    """Write the report's files into ``staging``; the summary names them as they will be in ``out``."""
    best = snapshot.best_checkpoint(metric, mode)
    lineage = pbt_lineage(experiment, results=df, snapshot=snapshot)
    params = hyperparameters(df)
    images: list[Path] = []
    sections: list[str] = []

    def figure(name: str, fig: Any, title: str, note: str = "") -> None:
        data = _png(fig, staging / f"{name}.png")
        plt.close(fig)
        images.append(out / f"{name}.png")
        sections.append(
            f"<h2>{html.escape(title)}</h2>{note}<img alt='{html.escape(title)}' src='data:image/png;base64,{data}'>"
        )

    counts = format_counts(snapshot.counts())
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(snapshot.start_time)) if snapshot.start_time else "?"
    sections += _trials_section(snapshot, df, metric, mode, params)
    gaps = df.attrs.get("missing_iterations") or {}
    if gaps:
        sections.append("<p class='warn'>Rows Ray's result.json lost (tunekit.callbacks.ParquetLogger keeps every "
                        "row): " + "; ".join(f"{html.escape(t)}: iterations {format_ranges(m)}"
                                             for t, m in sorted(gaps.items())) + "</p>")
    if best is None or best.checkpoint is None:
        best_html = f"<p>No checkpoint that verifies records {html.escape(metric)}.</p>"
    else:
        why = snapshot.verdict(best.checkpoint)[1]
        said = "that verifies" if why == "good" else f"(unverified: {html.escape(why)})"
        best_html = (
            f"<p>The best checkpoint {said} (what <code>tunekit status --metric --mode</code> names): "
            f"trial <b>{html.escape(best.trial_id)}</b>, {html.escape(metric)} = "
            f"{'?' if best.value is None else f'{best.value:.4g}'} ({mode}), iteration {best.checkpoint.iteration}"
            f"<br>config: {html.escape(_fmt(best.trial.config))}"
            f"<br><code>{html.escape(best.checkpoint.uri)}</code></p>"
        )
    if best is not None and best.skipped:
        best_html += "<p class='warn'>Passed over, they do not verify: " + "; ".join(
            f"<code>{html.escape(line)}</code>" for line in best.skipped) + "</p>"
    sections.append("<h2>Best checkpoint</h2>" + best_html)
    exploited: dict[str, set[int]] = {}
    for r in lineage.exploits.itertuples():
        exploited.setdefault(str(r.target), set()).add(int(r.iteration))
    figure("learning_curves", learning_curves(plt, df, metric, exploited), f"Learning curves: {metric}")
    if params:
        figure("hyperparameters", scatter(plt, df, metric, params), f"Hyperparameters vs final {metric}")
    if not lineage.exploits.empty:
        exploit_rows = [
            [r.iteration, r.target, _source(r), r.source_iteration, r.old_config, r.new_config]
            for r in lineage.exploits.itertuples()
        ]
        sections.append("<h2>PBT exploits</h2>" + _table(
            ["iteration", "target", "source", "source iteration", "old config", "new config"], exploit_rows))
        sections.append("<h2>Ancestry of final weights</h2>" + _table(
            ["trial", "lineage"], [[t, lineage.describe(t)] for t in sorted(lineage.ancestry)]))
        figure("lineage", lineage_plot(plt, lineage), "PBT lineage")
        if params:
            figure("schedules", schedules(plt, df, params), "Hyperparameter schedules")
    tb_dir = experiment.uri if experiment.is_local else f"<a local copy of {experiment.uri}>"
    sections.append(
        "<h2>TensorBoard</h2><p>Ray Tune writes tensorboardX event files in each trial directory "
        "(scalars, and the HParams view for finished trials):</p>"
        f"<p><code>tensorboard --logdir {html.escape(tb_dir)}</code></p>"
        "<p class='muted'>For one clean run per trial (each iteration once, even after restores), "
        "export first: <code>python -c \"import tunekit.analysis.tensorboard as t; "
        f"t.export_tensorboard('{html.escape(experiment.uri)}', 'tb')\"</code> then "
        "<code>tensorboard --logdir tb</code>.</p>"
    )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>tunekit report: {html.escape(snapshot.name)}</title><style>{_CSS}</style></head><body>"
        f"<h1>Experiment {html.escape(snapshot.name)}</h1>"
        f"<p class='muted'>{html.escape(experiment.uri)} &middot; started {started} &middot; "
        f"{len(snapshot.trials)} trials: {html.escape(counts)} &middot; {len(df)} results</p>"
        + _banner(snapshot.problems)
        + "".join(sections)
        + "<p class='muted'>Written by tunekit report.</p></body></html>"
    )
    (staging / "index.html").write_text(page)
    return ReportSummary(out / "index.html", images, metric, mode, best, list(snapshot.problems))


def _banner(problems: list[str]) -> str:
    items = "".join(f"<li>{html.escape(p)}</li>" for p in problems)
    return (f"<div class='damage' id='damage'><b>This experiment is damaged</b> "
            f"(<code>tunekit verify</code> checks every checkpoint):<ul>{items}</ul></div>") if items else ""


#: The file that marks a directory as holding tunekit's report (a later report may replace it).
REPORT_MARKER = ".tunekit-report"


def _check_output(out: Path) -> None:
    """Create ``out`` or raise ConfigError in one line: a report writes only into a directory it made or one
    that holds an earlier report of its own (:data:`REPORT_MARKER`, or an ``index.html`` tunekit wrote), never
    over a file or a directory of the user's."""
    index = out / "index.html"
    theirs = sorted(p.name for p in out.glob("*") if not p.name.startswith(".tunekit_report")) if out.is_dir() else []
    ours = (out / REPORT_MARKER).exists() or index.is_file() and "Written by tunekit report." in index.read_text()
    if theirs and not ours:
        raise ConfigError(f"--output {out}: holds files tunekit did not write ({', '.join(theirs[:3])}"
                          f"{', ...' if len(theirs) > 3 else ''}); expected a new or empty directory, or one "
                          "holding an earlier tunekit report (nothing was written)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".tunekit_report_probe"
        probe.write_bytes(b"")
        probe.unlink()
    except FileExistsError:
        raise ConfigError(f"--output {out}: is a file; expected a directory to write the report into") from None
    except OSError as exc:
        raise ConfigError(f"--output {out}: cannot write there ({exc.strerror or type(exc).__name__}); "
                          "expected a writable directory") from None


def _not_a_hyperparameter(name: str) -> bool:  # seeds, tunekit's own entries: vary, but are not searched
    lowered = name.lower()
    return lowered == "seed" or lowered.endswith(("_seed", "/seed")) or lowered.startswith("tunekit_")


def hyperparameters(df: pd.DataFrame, *, limit: int = 4) -> list[str]:
    """The numeric config entries that vary between trials, seeds and tunekit's own entries left out."""
    return [
        c[len("config/"):] for c in df.columns
        if c.startswith("config/") and not _not_a_hyperparameter(c[len("config/"):])
        and pd.api.types.is_numeric_dtype(df[c]) and df[c].nunique(dropna=True) > 1
    ][:limit]
