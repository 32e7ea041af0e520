"""Which processes on this machine are the workers of the Ray this process is connected to.

Ray names an actor's worker process ``ray::<Class>`` (its process title) and starts it from the node's
raylet, whose command line carries the cluster's ``--gcs-address``. Two Rays on one machine (two
drivers, two test processes) both have ``ray::DigitsTrainable`` workers; only the raylet's
``--gcs-address`` tells them apart. Neither the title nor the flag is a public API: the contract test
(``tests/tunekit/test_ray_contract.py``) starts a second Ray and checks that its workers are not named.
"""

from __future__ import annotations

import os

__all__ = ["actor_workers"]


def actor_workers(title: str) -> list[int]:
    """Pids of this machine's live workers whose process title starts ``ray::<title>`` and whose raylet
    belongs to the Ray this process is connected to (none before ``ray.init``)."""
    import ray

    if not ray.is_initialized():
        return []
    flag = f"--gcs-address={ray.get_runtime_context().gcs_address}".encode()
    prefix = f"ray::{title}".encode()
    ours: dict[int, bool] = {}
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if not _cmdline(pid).startswith(prefix):
            continue
        raylet = _parent(pid)
        if raylet not in ours:
            ours[raylet] = flag in _cmdline(raylet).split(b"\0")
        if ours[raylet]:
            out.append(pid)
    return out


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1
