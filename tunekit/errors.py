"""Exceptions raised by tunekit.

Every error subclasses a builtin (``ValueError``), so callers that do not know
tunekit still catch them; the message is one line naming what is wrong and
what is expected.
"""

from __future__ import annotations

__all__ = ["CheckpointError", "ConfigError", "TunekitError"]


class TunekitError(Exception):
    """Base class of all tunekit errors."""


class ConfigError(TunekitError, ValueError):
    """A configuration value or argument is invalid."""


class CheckpointError(TunekitError, ValueError):
    """A checkpoint directory is missing, incomplete, corrupt or unsafe to load."""
