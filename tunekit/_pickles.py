"""Ray's pickles read as data: their opcodes, never executed.

Tested in ``tests/tunekit/test_resume_torn.py`` and ``tests/tunekit/test_resume.py``.
"""

from __future__ import annotations

import pickletools
import posixpath

import pyarrow.fs as pafs

from tunekit.storage import Storage

__all__ = ["TUNER_PKL", "pickle_globals", "pickle_problem", "read_tuner_pickle", "tuner_pickle_problem"]

TUNER_PKL = "tuner.pkl"


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
