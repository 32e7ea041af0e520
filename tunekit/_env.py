"""tunekit's environment variables: one registry, read through here (as Ray's ``tune/constants.py`` keeps ``TUNE_ENV_VARS``).

Implementation tier. ``docs/environment.md`` lists the same variables; a test
checks that every name in :data:`ENV_VARS` is documented there and that no
module reads a ``TUNEKIT_*`` variable any other way.

>>> sorted(ENV_VARS)
['TUNEKIT_BACKGROUND_SAVES', 'TUNEKIT_CHECKPOINT_WAIT_S', 'TUNEKIT_CONNECT_TIMEOUT_S']
>>> get_float("TUNEKIT_CHECKPOINT_WAIT_S", environ={})
600.0
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from tunekit.errors import ConfigError

__all__ = ["ENV_VARS", "EnvVar", "check_all", "get_flag", "get_float"]


@dataclass(frozen=True)
class EnvVar:
    """One variable: its name, its default (as it would be written) and what it means."""

    name: str
    default: str
    meaning: str


ENV_VARS: dict[str, EnvVar] = {v.name: v for v in (
    EnvVar("TUNEKIT_BACKGROUND_SAVES", "1",
           "0/false/no/off: every checkpoint save completes before save() returns (no two-phase write)"),
    EnvVar("TUNEKIT_CHECKPOINT_WAIT_S", "600",
           "seconds a restore or PBT exploit waits for a live writer to finish the checkpoint it needs"),
    EnvVar("TUNEKIT_CONNECT_TIMEOUT_S", "10",
           "seconds `quickstart` and `resume` wait for the Ray head at --address/RAY_ADDRESS to answer"),
)}

_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")
#: The yes/no variables (the others are numbers of seconds).
_FLAGS = frozenset({"TUNEKIT_BACKGROUND_SAVES"})


def _raw(name: str, environ: Mapping[str, str] | None) -> str:
    var = ENV_VARS[name]  # KeyError: not a registered variable (a bug, not user input)
    value = (os.environ if environ is None else environ).get(name, "").strip()
    return value or var.default


def get_flag(name: str, *, environ: Mapping[str, str] | None = None) -> bool:
    """A yes/no variable: off for ``0``, ``false``, ``no``, ``off`` (any case), else on."""
    return _raw(name, environ).lower() not in _OFF


def get_float(name: str, *, environ: Mapping[str, str] | None = None) -> float:
    """A positive number of seconds; a value that is not one is refused in one line.

    Raises:
        ConfigError: the value is not a positive number.
    """
    raw = _raw(name, environ)
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a number of seconds") from None
    if not value > 0:
        raise ConfigError(f"{name}={raw!r}: expected a positive number of seconds")
    return value


def check_all(*, environ: Mapping[str, str] | None = None) -> None:
    """Check every ``TUNEKIT_*`` variable that is set, before anything starts: a bad value is refused here,
    in one line, not when it is first read (perhaps hours into a run, at the first PBT exploit).

    >>> check_all(environ={"TUNEKIT_CHECKPOINT_WAIT_S": "soon"})
    Traceback (most recent call last):
    tunekit.errors.ConfigError: TUNEKIT_CHECKPOINT_WAIT_S='soon': expected a number of seconds

    Raises:
        ConfigError: a value that is not what its variable takes.
    """
    env = os.environ if environ is None else environ
    for name in sorted(ENV_VARS):
        if not env.get(name, "").strip():
            continue
        if name in _FLAGS:
            raw = env[name].strip()
            if raw.lower() not in _OFF + _ON:
                raise ConfigError(f"{name}={raw!r}: expected 1/true/yes/on or 0/false/no/off")
        else:
            get_float(name, environ=env)
