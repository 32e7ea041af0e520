"""Tune callbacks: checkpoint policies and loggers."""

from __future__ import annotations

from callbacks.improvement import CheckpointOnImprovement
from callbacks.parquet import ParquetLogger
from callbacks.preemption import CheckpointOnPreemption
from callbacks.progress import ProgressPrinter
from callbacks.steps import CheckpointByStepsTaken
from callbacks.timed import CheckpointByTime

__all__ = [
    "CheckpointByStepsTaken",
    "CheckpointByTime",
    "CheckpointOnImprovement",
    "CheckpointOnPreemption",
    "ParquetLogger",
    "ProgressPrinter",
]
