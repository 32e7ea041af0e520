"""Tune callbacks: checkpoint policies and loggers.

Tested in ``tests/callbacks/test_policies.py``.
"""

from __future__ import annotations

from tunekit.callbacks.autopilot import CheckpointAutopilot
from tunekit.callbacks.improvement import CheckpointOnImprovement
from tunekit.callbacks.parquet import ParquetLogger
from tunekit.callbacks.preemption import CheckpointOnPreemption
from tunekit.callbacks.progress import ProgressPrinter
from tunekit.callbacks.record import ExperimentRecord
from tunekit.callbacks.retention import KeepCheckpoints
from tunekit.callbacks.steps import CheckpointByStepsTaken
from tunekit.callbacks.timed import CheckpointByTime

__all__ = [
    "CheckpointAutopilot",
    "CheckpointByStepsTaken",
    "CheckpointByTime",
    "CheckpointOnImprovement",
    "CheckpointOnPreemption",
    "ExperimentRecord",
    "KeepCheckpoints",
    "ParquetLogger",
    "ProgressPrinter",
]
