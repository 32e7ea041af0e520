"""The figures of ``tunekit report``: learning curves, hyperparameters against the final metric, PBT's
schedules and lineage (matplotlib, handed in by the report: imported only when one is drawn).

Implementation tier of :mod:`tunekit.analysis.report`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tunekit.analysis._load import Lineage

__all__ = ["learning_curves", "lineage_plot", "scatter", "schedules", "segment_starts"]


def segment_starts(trials: np.ndarray, iterations: np.ndarray, breaks: dict[str, set[int]]) -> np.ndarray:
    """Where the curve segments of rows grouped by trial (each in iteration order) start: at a new trial, at a
    jump in iterations, and after each iteration in ``breaks[trial]`` (its weights were replaced there)."""
    n = len(iterations)
    start = np.ones(n, dtype=bool)
    if n > 1:
        start[1:] = (trials[1:] != trials[:-1]) | (iterations[1:] != iterations[:-1] + 1)
        for k in np.flatnonzero(~start[1:]) + 1:  # (a loop over the rows that continue a segment)
            if iterations[k - 1] in breaks.get(trials[k], ()):
                start[k] = True
    return np.flatnonzero(start)


def learning_curves(plt: Any, df: pd.DataFrame, metric: str, exploits: dict[str, set[int]]) -> Any:
    """Every trial's curve, drawn as one collection of line segments (one ``plot`` per trial takes seconds
    at thousands of trials)."""
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    trials = df["trial_id"].astype(str).to_numpy()
    names, codes = np.unique(trials, return_inverse=True)  # (sorted, as groupby's colours were)
    order = np.lexsort((np.arange(len(codes)), codes))  # each trial's rows together, in their order
    trials, codes = trials[order], codes[order]
    its = pd.to_numeric(df["training_iteration"], errors="coerce").to_numpy(dtype=float)[order]
    values = pd.to_numeric(df[metric], errors="coerce").to_numpy(dtype=float)[order]
    starts = segment_starts(trials, its, exploits)
    ends = np.append(starts[1:], len(its))
    colors = plt.cm.tab10(codes[starts] % 10)  # (one RGBA row per segment)
    ax.add_collection(LineCollection([np.column_stack((its[a:b], values[a:b])) for a, b in zip(starts, ends)],
                                     colors=colors, linewidths=1.2,  # (thousands of lines: drawn without
                                     antialiaseds=len(starts) <= 1000))  # smoothing, a third less time)
    ax.autoscale_view()
    # a segment that continues its trial: the weights came from a donor here; marked instead of drawn across
    cloned = [k for k, a in enumerate(starts) if a > 0 and codes[a] == codes[a - 1]]
    if cloned:
        at = starts[cloned]
        ax.scatter(its[at], values[at], marker="o", facecolors="white", edgecolors=[colors[k] for k in cloned],
                   zorder=3)
    ax.set_xlabel("training_iteration")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} per trial" + (" (a break: the trial took a donor's weights)" if cloned else ""))
    if len(names) <= 12:
        handles = [Line2D([], [], color=plt.cm.tab10(i % 10), linewidth=1.2, label=name) for i, name in enumerate(names)]
        if cloned:
            handles.append(Line2D([], [], marker="o", markerfacecolor="white", color="grey", linestyle="none",
                                  label="after a PBT exploit"))
        ax.legend(handles=handles, fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    return fig


def scatter(plt: Any, df: pd.DataFrame, metric: str, params: list[str]) -> Any:
    last = df.groupby("trial_id").tail(1)
    n = max(1, len(params))
    fig, axes = plt.subplots(1, n, figsize=(4 * n, 3.6), squeeze=False, sharey=True, layout="constrained")
    for k, (ax, param) in enumerate(zip(axes[0], params)):
        values = pd.to_numeric(last[f"config/{param}"], errors="coerce")
        ax.scatter(values, last[metric], s=28)
        if values.gt(0).all() and values.max() / max(values.min(), 1e-300) > 50:
            ax.set_xscale("log")
        ax.set_xlabel(param)
        if k == 0:
            ax.set_ylabel(f"final {metric}")
        ax.grid(alpha=0.3)
    fig.suptitle(f"hyperparameters vs final {metric}")
    return fig


def schedules(plt: Any, df: pd.DataFrame, params: list[str]) -> Any:
    n = max(1, len(params))
    fig, axes = plt.subplots(n, 1, figsize=(8, 2.6 * n + 0.6), squeeze=False, sharex=True, layout="constrained")
    for ax, param in zip(axes[:, 0], params):
        for i, (trial_id, rows) in enumerate(df.groupby("trial_id")):
            ax.step(rows["training_iteration"], pd.to_numeric(rows[f"config/{param}"], errors="coerce"),
                    where="post", linewidth=1.1, label=str(trial_id), color=plt.cm.tab10(i % 10))
        ax.set_ylabel(param)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("training_iteration")
    if df["trial_id"].nunique() <= 12:
        fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside right upper", fontsize=7, title="trial")
    fig.suptitle("hyperparameter schedules (PBT)")
    return fig


def lineage_plot(plt: Any, lineage: Lineage) -> Any:
    trials = sorted(lineage.ancestry)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(trials) + 1.2))
    colors = {t: plt.cm.tab20(i % 20) for i, t in enumerate(trials)}
    for y, trial in enumerate(trials):
        for source, first, last in lineage.ancestry[trial]:
            ax.barh(y, last - first + 1, left=first - 0.5, color=colors.get(source, "grey"), edgecolor="white")
            ax.text((first + last) / 2, y, source[-5:], ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(trials)), [t for t in trials], fontsize=7)
    ax.set_xlabel("training_iteration (colour: whose weights)")
    ax.set_title("PBT lineage of each trial's final weights")
    return fig
