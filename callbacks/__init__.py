"""Tune callbacks: checkpoint policies and loggers."""

from __future__ import annotations

from callbacks.steps import CheckpointByStepsTaken

__all__ = ["CheckpointByStepsTaken"]
