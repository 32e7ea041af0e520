"""Tune callbacks: checkpoint policies (by steps, time, improvement, preemption, the autopilot), retention,
tunekit's run record and the loggers (Parquet, progress). They sit above tunekit's core and use it; the core
never imports them.
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
    "CheckpointAutopilot", "CheckpointByStepsTaken", "CheckpointByTime", "CheckpointOnImprovement",
    "CheckpointOnPreemption", "ExperimentRecord", "KeepCheckpoints", "ParquetLogger", "ProgressPrinter"
]
