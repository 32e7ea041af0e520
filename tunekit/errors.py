"""Exceptions raised by tunekit.

Every error subclasses a builtin (``ValueError``, or ``OSError`` for storage
that cannot be reached), so callers that do not know tunekit still catch them; the message is one line naming what is wrong and
what is expected.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError", "ConfigError", "ConfigTypeError", "ExperimentError", "StorageError", "TunekitError",
    "first_line"
]


class TunekitError(Exception):
    """Base class of all tunekit errors."""


class ConfigError(TunekitError, ValueError):
    """A configuration value or argument is invalid."""


class ConfigTypeError(ConfigError, TypeError):
    """An argument has the wrong type (a function where a value is expected, say)."""


class CheckpointError(TunekitError, ValueError):
    """A checkpoint directory is missing, incomplete, corrupt or unsafe to load."""


class StorageError(TunekitError, OSError):
    """A storage location is malformed, unreachable, or not writable."""


class ExperimentError(TunekitError, ValueError):
    """A path is not an experiment directory, or its state cannot be read."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name if it has none), for one-line errors."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
