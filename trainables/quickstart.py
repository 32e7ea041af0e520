"""``tunekit quickstart``: a real PBT sweep of DigitsTrainable on a local Ray."""

from __future__ import annotations

import os
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

import pyarrow.fs as pafs

from tunekit._checks import integer_at_least, number_at_least
from tunekit.errors import ConfigError
from tunekit.schedule.pbt import pbt_setup, quiet_pbt_keep_warning
from tunekit.experiment.snapshot import read_experiment
from tunekit.storage import check_cluster_storage, probe_storage, resolve_storage
from tunekit.table import format_table

__all__ = ["QuickstartSummary", "run_quickstart"]

#: Where results go unless ``--storage-path`` says otherwise.

METRIC = "accuracy"


@dataclass
class QuickstartSummary:
    """What the quickstart prints at its end, for programs and tests."""

    experiment_path: str
    rows: list[dict[str, Any]]
    #: The best checkpoint's trial, accuracy, URI and iteration (None: interrupted before any checkpoint).
    best_trial_id: str | None
    best_accuracy: float | None
    best_checkpoint: str | None
    best_iteration: int | None
    wall_s: float


def _format_table(rows: list[dict[str, Any]]) -> str:
    headers = ["", "trial", "lr", "momentum", "accuracy", "best ckpt", "iterations", "state"]

    def number(value: Any) -> str:
        return f"{value:.4f}" if value is not None else "n/a"

    cells = [
        [
            "*" if r.get("best") else "",
            r["trial"],
            f"{r['lr']:.4g}",
            f"{r['momentum']:.4g}",
            number(r["accuracy"]),
            number(r.get("best_checkpoint_accuracy")),
            str(r["iterations"]),
            r["state"],
        ]
        for r in rows
    ]
    return format_table(headers, cells)


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
    """Run a PBT sweep of :class:`tunekit.trainables.DigitsTrainable` and print a summary.

    Connects to the Ray cluster at ``address`` (default: the ``RAY_ADDRESS``
    environment variable); without one, starts a local Ray (``cpus`` CPUs,
    dashboard off) unless one is running. On a multi-node cluster the storage
    must be cloud storage, or a local path declared ``shared_storage`` (a
    shared mount on every node); anything else is refused before a trial starts.
    ``storage_path`` is a local path or a URI such as
    ``s3://bucket/prefix?endpoint_override=http://host:9000``; it is probed
    (reachable, writable) before anything starts.
    """
    from tunekit.commands._connect import check_address, ray_for
    from tunekit._ray import quiet_ray_notices, quiet_tune_banner

    out = stream or sys.stdout
    integer_at_least("quickstart", "num_samples", num_samples)
    integer_at_least("quickstart", "max_iterations", max_iterations)
    integer_at_least("quickstart", "cpus", cpus, allow_none=True)
    number_at_least("quickstart", "gpus_per_trial", gpus_per_trial)

    check_address("quickstart", address, cpus)  # before anything is written
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

    # A default run prints tunekit's progress and summary only: the Ray notices
    # that do not apply here are dropped (see tunekit._ray.RAY_NOTICES for why).
    undo = [quiet_ray_notices(), quiet_tune_banner()]
    try:
        with ray_for("quickstart", address=address, cpus=cpus):
            wall = _sweep(storage, experiment, name, num_samples=num_samples, max_iterations=max_iterations,
                                gpus_per_trial=gpus_per_trial, shared_storage=shared_storage, out=out)
    finally:
        for restore in undo:
            restore()
    return _summarize(experiment, wall, out)


def _sweep(storage: Any, experiment: Any, name: str, *, num_samples: int, max_iterations: int,
           gpus_per_trial: float, shared_storage: bool, out: TextIO) -> float:
    import ray
    from ray import tune

    from tunekit.callbacks import ParquetLogger, ProgressPrinter
    from tunekit.trainables.class_api import DigitsTrainable

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
            callbacks=[ProgressPrinter(METRIC, mode="max", stream=out), ParquetLogger()],
            verbose=0,
        ),
    )
    t0 = time.monotonic()
    tuner.fit()  # the summary reads the experiment's files, as `tunekit status` does
    return time.monotonic() - t0


def _summarize(experiment: Any, wall: float, out: TextIO) -> QuickstartSummary:
    # The best model is the best checkpoint on storage across all trials, read
    # from the experiment directory exactly as `tunekit status --metric
    # accuracy --mode max` and tunekit.analysis.best_checkpoint read it.
    snapshot = read_experiment(experiment)
    best = snapshot.best_checkpoint(METRIC, "max")
    if best is None or best.checkpoint is None or best.value is None:
        if not snapshot.interrupted:
            raise ConfigError(f"quickstart: no checkpoint of {experiment.uri} recorded {METRIC!r}")
        best = None  # interrupted before any checkpoint
    rows = []
    for trial in snapshot.trials:  # one truth: the experiment's files, as `tunekit status` reads them
        metrics, trial_id = trial.last_result or {}, trial.trial_id
        own = snapshot.best_checkpoint_of(trial, METRIC, "max").checkpoint
        rows.append(
            {
                "trial": trial_id,
                "lr": float(trial.config.get("lr", float("nan"))),
                "momentum": float(trial.config.get("momentum", float("nan"))),
                "accuracy": metrics.get(METRIC),
                "best_checkpoint_accuracy": own.metrics.get(METRIC) if own is not None else None,
                "iterations": trial.iterations,
                "state": "INTERRUPTED" if trial_id in snapshot.interrupted else trial.status,
                "best": best is not None and trial_id == best.trial_id,
            }
        )
    summary = QuickstartSummary(
        experiment_path=experiment.uri,
        rows=rows,
        best_trial_id=best.trial_id if best else None,
        best_accuracy=best.value if best else None,
        best_checkpoint=best.checkpoint.uri if best and best.checkpoint else None,
        best_iteration=best.checkpoint.iteration if best and best.checkpoint else None,
        wall_s=wall,
    )
    print("", file=out)
    print(_format_table(rows), file=out)
    print("", file=out)
    if best is not None:
        print(f"best trial: {summary.best_trial_id} (its checkpoint at iteration {summary.best_iteration}: "
              f"accuracy {summary.best_accuracy:.4f})", file=out)
        print(f"best checkpoint: {summary.best_checkpoint}", file=out)
    else:
        print("best checkpoint: none yet (the run stopped before the first checkpoint)", file=out)
    quoted = shlex.quote(summary.experiment_path)  # (pasted into a shell as printed: spaces, S3 options)
    if snapshot.interrupted:
        print(f"interrupted after {wall:.1f}s: {len(snapshot.interrupted)} trial(s) did not finish; "
              f"`tunekit resume {quoted}` continues them", file=out)
    else:
        print(f"finished in {wall:.1f}s; experiment at {summary.experiment_path}", file=out)
    print(f"next: tunekit status {quoted} --metric {METRIC} --mode max; tunekit report {quoted}", file=out)
    print("your own trainable: tunekit check my_module:MyTrainable --config '{...}' proves it resumes "
          "bit-exactly (or names what breaks it)", file=out, flush=True)
    return summary
