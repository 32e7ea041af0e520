"""A Tune trial that runs a Ray Train worker group: Train inside Tune, as Ray 2.51+ documents it.

:func:`train_trial` wraps a ``train_loop_per_worker`` into a Tune function trainable. Each trial runs
one ``TorchTrainer`` (Ray Train V2, the default since Ray 2.51) whose workers report through Ray's
``TuneReportCallback``; the Train run is named after the trial and stored in the trial's own directory,
so a retried or resumed trial's workers find its checkpoints again (``ray.train.get_checkpoint()``).

Tested in ``tests/tunekit/test_multiworker.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tunekit.errors import ConfigError

__all__ = ["train_trial"]


def train_trial(train_loop_per_worker: Callable[[dict[str, Any]], None], *, workers: int = 2,
                cpus_per_worker: float = 1.0, use_gpu: bool = False, max_failures: int = 1,
                backend: str | None = None, storage_path: str | None = None) -> Callable[[dict[str, Any]], None]:
    """A Tune function trainable that trains each trial with ``workers`` Ray Train workers.

    Example:
        .. code-block:: python

            trainable = tune.with_resources(train_trial(train_loop_per_worker, workers=2), {"cpu": 0.1})
            tune.Tuner(trainable, param_space={"lr": tune.grid_search([0.01, 0.1])}).fit()

    Args:
        train_loop_per_worker: Every rank runs it with the trial's config (use
            :class:`tunekit.multiworker.WorkerSession` in it).
        workers: Train workers per trial (the trial's config key ``"workers"`` overrides it).
        cpus_per_worker: CPUs each worker holds (give the Tune trial itself a small share:
            ``tune.with_resources(..., {"cpu": 0.1})``; it only drives its workers).
        use_gpu: One GPU per worker; the backend defaults to NCCL then, else gloo.
        max_failures: Restarts of a trial's worker group after a worker dies, from its newest checkpoint.
        backend: ``torch.distributed`` backend (default: ``nccl`` with GPUs, else ``gloo``).
        storage_path: Where Train writes the trial's checkpoints (default: the trial's directory on the
            experiment's storage, local, S3 or any pyarrow filesystem).
    """
    if not callable(train_loop_per_worker):
        raise ConfigError(f"train_trial({train_loop_per_worker!r}): expected the worker loop, a function")
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"train_trial(workers={workers!r}): must be an integer >= 1")
    if max_failures < -1:
        raise ConfigError(f"train_trial(max_failures={max_failures!r}): must be >= 0, or -1 for no limit")

    def trial(config: dict[str, Any]) -> None:
        from ray import tune
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer
        from ray.tune.integration.ray_train import TuneReportCallback

        from tunekit import _ray

        filesystem, trial_path = _ray.session_trial_storage()
        run = RunConfig(name="train", storage_path=storage_path or trial_path,
                        storage_filesystem=None if storage_path else filesystem,
                        failure_config=FailureConfig(max_failures=max_failures), callbacks=[TuneReportCallback()])
        if storage_path:
            run = RunConfig(name=f"train-{tune.get_context().get_trial_id()}", storage_path=storage_path,
                            failure_config=run.failure_config, callbacks=run.callbacks)
        TorchTrainer(
            train_loop_per_worker,
            train_loop_config=dict(config),
            scaling_config=ScalingConfig(num_workers=int(config.get("workers", workers)), use_gpu=use_gpu,
                                         resources_per_worker={"CPU": float(cpus_per_worker)}),
            torch_config=TorchConfig(backend=backend or ("nccl" if use_gpu else "gloo")),
            run_config=run,
        ).fit()

    trial.__name__ = trial.__qualname__ = getattr(train_loop_per_worker, "__name__", "train_trial")
    trial.__module__ = getattr(train_loop_per_worker, "__module__", __name__)
    return trial
