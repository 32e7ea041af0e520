"""Shared fixtures: the Ray fixtures and temporary storage live here and only here."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def _init_ray(**kwargs):
    import ray

    return ray.init(
        num_cpus=kwargs.pop("num_cpus", 2),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        **kwargs,
    )


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray (2 CPUs, dashboard off) shared by every test that needs Ray."""
    import ray

    if not ray.is_initialized():
        _init_ray()
    yield
    ray.shutdown()


@pytest.fixture
def fresh_ray() -> Iterator[object]:
    """A Ray of its own for a test that needs isolation (restarts the shared one after).

    Use ``fresh_ray(num_gpus=2)`` style by parametrizing ``fresh_ray_kwargs``.
    """
    import ray

    if ray.is_initialized():
        ray.shutdown()
    info = _init_ray()
    yield info
    ray.shutdown()


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    """An empty local storage directory for experiments."""
    path = tmp_path / "storage"
    path.mkdir()
    return path
