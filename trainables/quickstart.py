"""``tunekit quickstart``: a real PBT sweep of DigitsTrainable on a local Ray."""

from __future__ import annotations

import os
import posixpath
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pyarrow.fs as pafs

from tunekit.errors import ConfigError, first_line
from tunekit.pbt import pbt_setup, quiet_pbt_keep_warning
from tunekit.storage import DEFAULT_STORAGE_PATH, check_cluster_storage, probe_storage, resolve_storage

__all__ = ["DEFAULT_STORAGE", "QuickstartSummary", "run_quickstart"]

#: Where results go unless ``--storage-path`` says otherwise.
DEFAULT_STORAGE = Path(DEFAULT_STORAGE_PATH).expanduser()

METRIC = "accuracy"


@dataclass
class QuickstartSummary:
    """What the quickstart prints at its end, for programs and tests."""

    experiment_path: str
    rows: list[dict[str, Any]]
    best_trial_id: str
    best_accuracy: float
    best_checkpoint: str
    wall_s: float


def _format_table(rows: list[dict[str, Any]]) -> str:
    headers = ["trial", "lr", "momentum", "accuracy", "iterations", "state"]
    cells = [
        [
            r["trial"],
            f"{r['lr']:.4g}",
            f"{r['momentum']:.4g}",
            f"{r['accuracy']:.4f}" if r["accuracy"] is not None else "n/a",
            str(r["iterations"]),
            r["state"],
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


def run_quickstart(
    *,
    num_samples: int = 4,
    max_iterations: int = 12,
    storage_path: str | os.PathLike[str] | None = None,
    name: str | None = None,
    cpus: int | None = None,
    gpus_per_trial: float = 0.0,
    address: str | None = None,
    shared_storage: bool = False,
    stream: TextIO | None = None,
) -> QuickstartSummary:
    """Run a PBT sweep of :class:`trainables.DigitsTrainable` and print a summary.

    Connects to the Ray cluster at ``address`` (default: the ``RAY_ADDRESS``
    environment variable); without one, starts a local Ray (``cpus`` CPUs,
    dashboard off) unless one is running. On a multi-node cluster the storage
    must be cloud storage, or a local path declared ``shared_storage`` (a
    shared mount on every node); anything else is refused before a trial starts.
    ``storage_path`` is a local path or a URI such as
    ``s3://bucket/prefix?endpoint_override=http://host:9000``; it is probed
    (reachable, writable) before anything starts.
    """
    import ray
    from ray import tune

    from callbacks import ProgressPrinter
    from trainables.class_api import DigitsTrainable

    out = stream or sys.stdout
    for label, value, low in (("num_samples", num_samples, 1), ("max_iterations", max_iterations, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"quickstart({label}={value!r}): must be an integer >= {low}")
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1):
        raise ConfigError(f"quickstart(cpus={cpus!r}): must be an integer >= 1")
    if isinstance(gpus_per_trial, bool) or not isinstance(gpus_per_trial, (int, float)) or gpus_per_trial < 0:
        raise ConfigError(f"quickstart(gpus_per_trial={gpus_per_trial!r}): must be a number >= 0")

    storage = resolve_storage(storage_path)
    name = name or time.strftime("quickstart_%Y-%m-%d_%H-%M-%S")
    if "/" in name or name in ("", ".", ".."):
        raise ConfigError(f"quickstart(name={name!r}): must be a plain directory name")
    probe_storage(storage)
    experiment = storage.join(name)
    if storage.filesystem.get_file_info(experiment.path).type != pafs.FileType.NotFound:
        raise ConfigError(
            f"quickstart(name={name!r}): {experiment.uri} already exists; pick another "
            "--name (or `tunekit resume` it)"
        )

    address = address or os.environ.get("RAY_ADDRESS") or None
    if address and cpus is not None:
        raise ConfigError(f"quickstart(cpus={cpus}, address={address!r}): --cpus is for a local Ray; "
                          "a cluster brings its own CPUs")
    started_ray = False
    if not ray.is_initialized():
        if address:
            try:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"quickstart(address={address!r}): cannot connect to a Ray cluster there "
                                  f"({first_line(exc)}); expected the head's host:port, as `ray start --head` printed") from None
        else:
            ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
        started_ray = True
    try:
        check_cluster_storage(storage, shared=shared_storage)
        available_gpus = ray.cluster_resources().get("GPU", 0)
        if gpus_per_trial > 0 and available_gpus < gpus_per_trial:
            raise ConfigError(
                f"quickstart(gpus_per_trial={gpus_per_trial}): the Ray cluster has "
                f"{available_gpus:g} GPUs"
            )
        print(f"tunekit quickstart: {num_samples} trials x {max_iterations} iterations, PBT over lr and momentum", file=out)
        print(f"results go to {experiment.uri}", file=out, flush=True)

        interval = max(1, max_iterations // 4)
        quiet_pbt_keep_warning()  # Ray never deletes the newest checkpoint, the one PBT clones
        pbt = pbt_setup(
            DigitsTrainable,
            metric=METRIC,
            mode="max",
            perturbation_interval=interval,
            mutations={
                "lr": tune.loguniform(1e-3, 0.5),
                "momentum": [0.0, 0.5, 0.8, 0.9, 0.95],
            },
            num_to_keep=2,
            checkpoint_score_attribute=METRIC,
        )
        trainable = tune.with_resources(DigitsTrainable, {"cpu": 1, "gpu": gpus_per_trial})
        tuner = tune.Tuner(
            trainable,
            param_space={
                "lr": tune.loguniform(1e-3, 0.5),
                "momentum": tune.choice([0.0, 0.5, 0.9]),
                "hidden_size": 64,
                "batch_size": 64,
                "seed": tune.randint(0, 10_000),
            },
            tune_config=tune.TuneConfig(**pbt.tune_config_kwargs(), num_samples=num_samples),
            run_config=tune.RunConfig(
                name=name,
                **storage.run_config_kwargs(),
                stop={"training_iteration": max_iterations},
                checkpoint_config=pbt.checkpoint_config,
                callbacks=[ProgressPrinter(METRIC, stream=out)],
                verbose=0,
            ),
        )
        t0 = time.monotonic()
        grid = tuner.fit()
        wall = time.monotonic() - t0
    finally:
        if started_ray:
            ray.shutdown()

    rows = []
    for result in grid:
        metrics = result.metrics or {}
        rows.append(
            {
                "trial": str(metrics.get("trial_id", "?")),
                "lr": float(result.config.get("lr", float("nan"))),
                "momentum": float(result.config.get("momentum", float("nan"))),
                "accuracy": metrics.get(METRIC),
                "iterations": int(metrics.get("training_iteration", 0)),
                "state": "ERROR" if result.error else "TERMINATED",
            }
        )
    best = grid.get_best_result(metric=METRIC, mode="max", scope="all")
    kept = [(c, m) for c, m in (best.best_checkpoints or []) if isinstance(m.get(METRIC), (int, float))]
    if not kept:
        raise RuntimeError(f"quickstart: best trial {best.path} has no checkpoint with {METRIC!r}")
    best_ckpt, best_metrics = max(kept, key=lambda pair: pair[1][METRIC])
    summary = QuickstartSummary(
        experiment_path=experiment.uri,
        rows=rows,
        best_trial_id=str(best.metrics.get("trial_id")),
        best_accuracy=float(best_metrics[METRIC]),
        best_checkpoint=(
            best_ckpt.path
            if storage.is_local
            else experiment.join(posixpath.relpath(best_ckpt.path, experiment.path)).uri
        ),
        wall_s=wall,
    )
    print("", file=out)
    print(_format_table(rows), file=out)
    print("", file=out)
    print(f"best trial: {summary.best_trial_id} (accuracy {summary.best_accuracy:.4f})", file=out)
    print(f"best checkpoint: {summary.best_checkpoint}", file=out)
    print(f"finished in {wall:.1f}s; experiment at {summary.experiment_path}", file=out, flush=True)
    return summary
