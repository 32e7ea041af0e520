"""Tune callbacks: checkpoint policies and loggers."""

from __future__ import annotations

from callbacks.progress import ProgressPrinter
from callbacks.steps import CheckpointByStepsTaken

__all__ = ["CheckpointByStepsTaken", "ProgressPrinter"]
