"""Ray for a tunekit command: a local Ray of its own, unless an address is named.

``ray.init()`` without an address joins whatever cluster it finds on the
machine (a ``ray start`` someone else ran, a test run's Ray). A command that
starts Ray must never do that by accident, so :func:`ray_for` starts a local
Ray (``address="local"``) unless the caller or ``RAY_ADDRESS`` names one, and
gives up on a named address that does not answer within
``TUNEKIT_CONNECT_TIMEOUT_S`` seconds (one line, no retry loop).
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Iterator

from tunekit import _env
from tunekit.errors import ConfigError, first_line

__all__ = ["check_address", "ray_for", "resolve_address"]



def resolve_address(address: str | None) -> str | None:
    """The address a command is to join: ``address``, else ``$RAY_ADDRESS``, else None (a local Ray)."""
    return address or os.environ.get("RAY_ADDRESS") or None


def _timeout() -> float:
    return _env.get_float("TUNEKIT_CONNECT_TIMEOUT_S")


def _probe(call: str, address: str) -> None:
    """Raise ConfigError in one line unless ``host:port`` accepts a TCP connection in time."""
    if address in ("auto", "local"):
        return
    target = address.split("://", 1)[-1]
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"{call}(address={address!r}): expected host:port of a Ray head "
                          "(as `ray start --head` printed), 'auto' or 'local'")
    timeout = _timeout()
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        reason = "timed out" if isinstance(exc, socket.timeout) else (exc.strerror or first_line(exc))
        raise ConfigError(
            f"{call}(address={address!r}): no Ray cluster answers there ({reason}, waited up to {timeout:g}s); "
            "expected the head's host:port, as `ray start --head` printed"
        ) from None


def check_address(call: str, address: str | None, cpus: int | None = None) -> str | None:
    """The address to join (``address``, else ``$RAY_ADDRESS``), checked: it answers, and no ``cpus`` with it.

    Returns None for a local Ray of the command's own.

    Raises:
        ConfigError: in one line, naming the address and what is expected.
    """
    address = resolve_address(address)
    if not address or address == "local":
        return None
    if cpus is not None:
        raise ConfigError(f"{call}(cpus={cpus}, address={address!r}): --cpus is for a local Ray; "
                          "a cluster brings its own CPUs")
    _probe(call, address)
    return address


@contextlib.contextmanager
def ray_for(call: str, *, address: str | None = None, cpus: int | None = None) -> Iterator[bool]:
    """Ray for the duration of a command; yields True when it was started (or joined) here.

    Ray already initialized in this process (a program that calls tunekit's
    API inside its own Ray session) is used as it is. Otherwise the cluster
    at ``address`` (or ``$RAY_ADDRESS``) is joined, or a local Ray with
    ``cpus`` CPUs is started; either is shut down at the end.

    Raises:
        ConfigError: ``cpus`` given with an address, or the address does not answer.
    """
    import ray

    address = check_address(call, address, cpus)
    if ray.is_initialized():
        yield False
        return
    if address:
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"{call}(address={address!r}): cannot connect to a Ray cluster there "
                              f"({first_line(exc)}); expected the head's host:port, as `ray start --head` printed") from None
    else:
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    from tunekit._ray import drop_color_reset_at_exit
    from tunekit.experiment._signals import restore_sigterm, sigterm_as_ctrl_c

    drop_color_reset_at_exit()
    before = sigterm_as_ctrl_c()  # (after ray.init, which sets its own)
    try:
        yield True
    finally:
        ray.shutdown()
        restore_sigterm(before)
