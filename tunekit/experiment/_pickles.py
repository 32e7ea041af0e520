"""Ray's pickles read as data: their opcodes, never executed.
"""

from __future__ import annotations

import pickletools
import posixpath
from typing import Any

import pyarrow.fs as pafs

from tunekit.storage._location import Storage

__all__ = ["DRIVER_STATES", "TUNER_PKL", "driver_state_damage", "driver_state_problem", "pickle_globals",
           "pickle_problem", "read_tuner_pickle", "registered_names", "tuner_pickle_problem"]

TUNER_PKL = "tuner.pkl"

#: Ray's other driver state beside its experiment state (search algorithm, searcher, callbacks): pickles Ray
#: copies to storage with each experiment state, not atomically. A restore loads the newest of each kind; one a
#: killed driver left torn makes Ray drop the restore and start the experiment over, new trials and all.
DRIVER_STATES = ("basic-variant-state-", "search_gen_state-", "searcher-state-", "callback-states-")


def pickle_globals(data: bytes) -> list[tuple[str, str]]:
    """(module, name) references in a pickle, read from its opcodes; nothing is executed."""
    found, strings = [], []
    try:
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                strings.append(arg)
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append((strings[-2], strings[-1]))
            elif opcode.name == "GLOBAL" and isinstance(arg, str):
                module, _, name = arg.partition(" ")
                found.append((module, name))
    except Exception:  # a damaged pickle: use what was read up to there
        pass
    return found


def registered_names(manager: Any, trial_dir: str) -> set[str] | None:
    """The checkpoints of ``trial_dir`` Ray's checkpoint manager lists (its entry in an experiment state's trial
    runtime: a pickle, hex-encoded), by directory name: the paths among its strings, read from its opcodes and
    never unpickled. None when the entry is not such a pickle (this Ray stores it otherwise)."""
    if not isinstance(manager, dict) or not isinstance(manager.get("value"), str):
        return None
    try:
        data = bytes.fromhex(manager["value"])
    except ValueError:
        return None
    names = set()
    try:
        for opcode, arg, _ in pickletools.genops(data):
            if isinstance(arg, str) and "/checkpoint_" in arg:
                path = arg.rstrip("/")
                if posixpath.basename(posixpath.dirname(path)) == trial_dir:
                    names.add(posixpath.basename(path))
    except Exception:  # noqa: BLE001 - a damaged pickle: what was read up to there
        pass
    return names


def pickle_problem(data: bytes) -> str | None:
    """Why ``data`` is not a whole pickle (walking its opcodes to STOP), or None when it is one."""
    if not data:
        return "empty"
    try:
        for opcode, _, pos in pickletools.genops(data):
            if opcode.name == "STOP":
                return None if pos + 1 == len(data) else f"{len(data) - pos - 1} bytes after its end"
    except Exception as exc:  # noqa: BLE001 - whatever genops trips on is damage
        return f"torn after {len(data)} bytes: {exc}"
    return f"torn after {len(data)} bytes: no end"


def read_tuner_pickle(experiment: Storage) -> bytes | None:
    """The bytes of ``tuner.pkl`` (read, never unpickled), or None if there is none."""
    path = posixpath.join(experiment.path, TUNER_PKL)
    if experiment.filesystem.get_file_info(path).type != pafs.FileType.File:
        return None
    with experiment.filesystem.open_input_stream(path) as stream:
        return stream.read()


def tuner_pickle_problem(experiment: Storage) -> str | None:
    """One line when ``tuner.pkl`` is there but torn; None when it is whole or absent."""
    data = read_tuner_pickle(experiment)
    if data is None:
        return None
    why = pickle_problem(data)
    return f"{TUNER_PKL} is damaged ({why})" if why else None


def driver_state_problem(experiment: Storage, files: list[str]) -> str | None:
    """One line when the newest of a kind of Ray's driver state (:data:`DRIVER_STATES`) among ``files`` (the
    experiment's top-level file names) is torn; None when each is whole or absent. Read, never unpickled."""
    for prefix in DRIVER_STATES:
        names = sorted(f for f in files if f.startswith(prefix))
        if not names:
            continue
        with experiment.filesystem.open_input_stream(posixpath.join(experiment.path, names[-1])) as stream:
            why = pickle_problem(stream.read())
        if why:
            return f"{names[-1]} is damaged ({why})"
    return None


def driver_state_damage(experiment: Storage, files: list[str] | None = None) -> str | None:
    """:func:`driver_state_problem` of ``experiment`` as the readers (``status``, ``report``, ``verify``) say it:
    what it means and what still continues the trials. ``files``: the names at its top, where a reader listed them
    already (else listed here)."""
    from tunekit.checkpoint._layout import root_files

    torn = driver_state_problem(experiment, root_files(experiment) if files is None else files)
    return f"{torn}: Ray would start the experiment over; `tunekit resume` continues the trials from tunekit's " \
        "record" if torn else None
