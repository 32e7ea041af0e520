"""Find the trials and checkpoints of a Ray Tune experiment directory, on any storage.

Only names and directory structure are read here: nothing is unpickled and no
Ray is needed. The layout Ray Tune writes::

    EXP/experiment_state-<time>.json     (one or more; the newest counts)
    EXP/<trial dir>/params.json, result.json, progress.csv
    EXP/<trial dir>/checkpoint_000000/    (one directory per checkpoint)
    EXP/<trial dir>/train/checkpoint_<time>/   (a multi-worker trial's: every rank's part, tunekit.multiworker)
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple

import pyarrow.fs as pafs

from tunekit.checkpoint._trial_dir import CHECKPOINT_DIR, DAMAGED_COPY, is_train_checkpoint
from tunekit.errors import ExperimentError
from tunekit.storage._location import Storage, not_s3, storage_errors

__all__ = ["CHECKPOINT_DIR", "CheckpointDir", "DAMAGED_COPY", "POINTER_KEY", "TRAIN_DIR", "TrialDir",
           "check_experiment_dir", "checkpoint_bytes", "checkpoint_count", "checkpoint_files", "files_by_checkpoint",
           "find_trials", "listed_trial_dir", "not_an_experiment", "pointer_target", "pointer_value", "root_files",
           "scan_experiment"]

_TRIAL_FILES = ("params.json", "result.json", "progress.csv", "error.txt")
#: Where a multi-worker trial's Ray Train run keeps its checkpoints (:func:`tunekit.multiworker.train_trial`).
TRAIN_DIR = "train"
#: Metadata key of a multi-worker trial's Tune checkpoint that points at its Train checkpoint: a path relative to
#: the pointer's own directory (``../train/checkpoint_<time>``), so an experiment moved or copied (another disk,
#: S3 to local) stays whole; pointers written before 2026-12-01 hold the absolute path.
POINTER_KEY = "train_checkpoint"


def pointer_value(trial_path: str, target: str) -> str:
    """What a pointer in ``trial_path`` records for the Train checkpoint ``target``: relative when ``target`` is in
    the trial's own directory (it is unless Train's ``storage_path`` put it elsewhere), else ``target``."""
    root = trial_path.rstrip("/") + "/"
    return f"../{target.rstrip('/')[len(root):]}" if target.startswith(root) else target


def pointer_target(fs: pafs.FileSystem, pointer_path: str, value: str) -> str:
    """The path of the Train checkpoint the pointer at ``pointer_path`` names by ``value`` (:data:`POINTER_KEY`).

    A relative value is taken from the pointer's directory. An absolute one (older pointers) is taken as it is
    while it exists; once it is gone but the pointer's trial holds a Train checkpoint of the same name, that
    one: the experiment was moved or copied since."""
    trial_dir = posixpath.dirname(pointer_path.rstrip("/"))
    if value.startswith("../"):
        return posixpath.normpath(posixpath.join(trial_dir, value[3:]))
    marker = f"/{TRAIN_DIR}/"
    if marker in value and not _exists(fs, value):
        moved = posixpath.join(trial_dir, TRAIN_DIR, value.rstrip("/").rsplit(marker, 1)[1])
        if _exists(fs, moved):
            return moved
    return value


def _exists(fs: pafs.FileSystem, path: str) -> bool:
    """Whether anything is at ``path``; False too for a path the filesystem cannot hold (a local absolute
    path asked of S3: an old pointer in an experiment copied there)."""
    try:
        return fs.get_file_info(path).type != pafs.FileType.NotFound
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class CheckpointDir:
    """One ``checkpoint_NNNNNN`` directory of a trial."""

    name: str
    index: int
    location: Storage


@dataclass(frozen=True)
class TrialDir:
    """One trial directory and its checkpoints, oldest first."""

    name: str
    location: Storage
    checkpoints: tuple[CheckpointDir, ...]
    #: Names of damaged checkpoints' copies kept by ``tunekit resume``.
    damaged_copies: tuple[str, ...] = ()


class _Entry(NamedTuple):  # (a tuple: listing 2,000 trials makes tens of thousands)
    base_name: str
    is_dir: bool
    is_file: bool


def root_files(experiment: Storage) -> list[str]:
    """The names of the files at the top of ``experiment`` (its state files, Ray's PBT log), sorted."""
    return _files(_list(experiment, experiment.path))


def _files(entries: list[_Entry]) -> list[str]:
    return sorted(e.base_name for e in entries if e.is_file)


def _list(where: Storage, path: str) -> list[_Entry]:
    """The entries of directory ``path`` (none if it is missing). Locally by ``os.scandir``, which knows
    each entry's type without a ``stat`` (pyarrow stats every entry: most of listing 2,000 trials)."""
    with storage_errors("list", where):
        if where.is_local:
            try:
                with os.scandir(path) as entries:
                    return [_Entry(e.name, e.is_dir(), e.is_file()) for e in entries]
            except FileNotFoundError:
                return []
        return [_Entry(i.base_name, i.type == pafs.FileType.Directory, i.type == pafs.FileType.File)
                for i in where.filesystem.get_file_info(pafs.FileSelector(path, allow_not_found=True))]


def find_trials(experiment: Storage, *, checkpoints: bool = True) -> list[TrialDir]:
    """The trial directories of ``experiment`` (:func:`scan_experiment`'s first half)."""
    return scan_experiment(experiment, checkpoints=checkpoints)[0]


def scan_experiment(experiment: Storage, *, checkpoints: bool = True) -> tuple[list[TrialDir], list[str]]:
    """The trial directories of ``experiment``, sorted by name, without their checkpoints when
    ``checkpoints=False`` (the names in a trial directory are read, not what each one is); and the
    names of the files at its top (:func:`root_files`), from the same listing.

    Raises:
        ExperimentError: ``experiment`` does not exist or is not a Ray Tune
            experiment directory (no ``experiment_state-*.json`` and no trial
            directories).
        StorageError: the storage cannot be read.
    """
    check_experiment_dir(experiment)
    entries = _list(experiment, experiment.path)
    has_state = any(
        e.is_file
        and e.base_name.startswith("experiment_state")
        and e.base_name.endswith(".json")
        for e in entries
    )
    if not checkpoints and experiment.is_local:
        trials = _local_trial_names(experiment, sorted(e.base_name for e in entries if e.is_dir))
    else:
        trials = _trial_dirs(experiment, entries, checkpoints, _list)
    if not has_state and not trials:
        raise not_an_experiment(experiment)
    return trials, _files(entries)


def check_experiment_dir(experiment: Storage) -> None:
    """Raise :class:`ExperimentError` unless ``experiment`` is a directory (StorageError: it cannot be read)."""
    with storage_errors("read", experiment):
        info = experiment.filesystem.get_file_info(experiment.path)
    if info.type == pafs.FileType.NotFound:
        foreign = not_s3(experiment)
        raise ExperimentError(f"{experiment.uri}: the endpoint {foreign}" if foreign else
                              f"{experiment.uri}: no such experiment directory")
    if info.type != pafs.FileType.Directory:
        raise ExperimentError(f"{experiment.uri}: is a file, expected an experiment directory")


def not_an_experiment(experiment: Storage) -> ExperimentError:
    """The error for a directory that holds no ``experiment_state-*.json`` and no trial directory."""
    return ExperimentError(f"{experiment.uri}: not a Ray Tune experiment directory "
                           "(no experiment_state-*.json and no trial directories)")


def listed_trial_dir(experiment: Storage, name: str,
                     listed: Callable[[str], list[tuple[str, bool]]]) -> TrialDir | None:
    """The trial directory ``name`` of ``experiment`` with its checkpoints, from ``listed`` (a listing made already:
    path inside the experiment -> its entries, (name, is a directory)); None when it is not a trial's."""
    found = _trial_dirs(experiment, [_Entry(name, True, False)], True, _lister(experiment, listed))
    return found[0] if found else None


def _lister(experiment: Storage,
            listed: Callable[[str], list[tuple[str, bool]]]) -> Callable[[Storage, str], list[_Entry]]:
    def lister(where: Storage, path: str) -> list[_Entry]:
        rel = path[len(experiment.path):].strip("/")
        return [_Entry(name, is_dir, not is_dir) for name, is_dir in listed(rel)]

    return lister


def _local_trial_names(experiment: Storage, names: list[str]) -> list[TrialDir]:
    """:func:`find_trials` without checkpoints, on a local disk: each candidate directory's names by one
    ``os.listdir`` and set lookups (the readers of a 2,000-trial sweep's structure spend their time here)."""
    trials, files = [], frozenset(_TRIAL_FILES)
    with storage_errors("list", experiment):
        for name in names:
            location = experiment.join(name)
            try:
                children = os.listdir(location.path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if files.isdisjoint(children) and not any(
                    c.startswith("checkpoint_") and CHECKPOINT_DIR.match(c) for c in children):
                continue
            copies = tuple(sorted(c for c in children if c.startswith(".checkpoint_") and DAMAGED_COPY.match(c)))
            trials.append(TrialDir(name, location, (), copies))
    return trials


def _trial_dirs(experiment: Storage, entries: list[_Entry], checkpoints: bool,
                lister: Callable[[Storage, str], list[_Entry]]) -> list[TrialDir]:
    trials = []
    for entry in sorted(entries, key=lambda e: e.base_name):
        if not entry.is_dir:
            continue
        children = lister(experiment, posixpath.join(experiment.path, entry.base_name))
        names = [(int(m[1]), c.base_name) for c in children if c.is_dir and (m := CHECKPOINT_DIR.match(c.base_name))]
        found = []
        if checkpoints:
            found = [CheckpointDir(name, index, experiment.join(entry.base_name, name)) for index, name in sorted(names)]
            found += _train_checkpoints(experiment, entry.base_name, children, start=len(found), lister=lister)
        if names or found or any(c.is_file and c.base_name in _TRIAL_FILES for c in children):
            copies = tuple(sorted(c.base_name for c in children
                                  if c.is_dir and DAMAGED_COPY.match(c.base_name)))
            trials.append(TrialDir(entry.base_name, experiment.join(entry.base_name), tuple(found), copies))
    return trials


def _train_checkpoints(experiment: Storage, trial: str, children: list[_Entry], *, start: int,
                       lister: Callable[[Storage, str], list[_Entry]]) -> list[CheckpointDir]:
    """A multi-worker trial's Ray Train checkpoints (``train/checkpoint_<timestamp>``, :mod:`tunekit.multiworker`),
    oldest first, indexed after the trial's own."""
    if not any(c.base_name == TRAIN_DIR and c.is_dir for c in children):
        return []
    names = sorted(c.base_name for c in lister(experiment, posixpath.join(experiment.path, trial, TRAIN_DIR))
                   if c.is_dir and is_train_checkpoint(c.base_name))
    return [CheckpointDir(f"{TRAIN_DIR}/{name}", start + i, experiment.join(trial, TRAIN_DIR, name))
            for i, name in enumerate(names)]


def checkpoint_count(names: Iterable[str]) -> str:
    """A trial's checkpoints as the readers show them: ``3``; a multi-worker trial's Tune checkpoints and the
    Ray Train checkpoints they point at: ``2+3 train``.

    >>> checkpoint_count(["checkpoint_000000", "checkpoint_000001", "train/checkpoint_2026-11-26_01"])
    '2+1 train'
    """
    names = list(names)
    train = sum(name.startswith(f"{TRAIN_DIR}/") for name in names)
    return f"{len(names) - train}+{train} train" if train else str(len(names))


def checkpoint_bytes(experiment: Storage) -> dict[str, int]:
    """``"trial dir/checkpoint_NNNNNN"`` -> the bytes of its files, from one recursive listing of ``experiment``."""
    return {key: sum(files.values()) for key, files in checkpoint_files(experiment).items()}


def checkpoint_files(experiment: Storage, keys: Iterable[str] | None = None) -> dict[str, dict[str, int]]:
    """``"trial dir/checkpoint_NNNNNN"`` (or a multi-worker trial's ``"trial dir/train/checkpoint_..."``) -> its
    files (path inside the checkpoint -> bytes), from one recursive listing of ``experiment``; on a local disk,
    given the checkpoints' ``keys`` (those the reader knows), from walking those alone (the listing's entries
    for every trial's other files cost more than the walk)."""
    if keys is not None and experiment.is_local:
        with storage_errors("list", experiment):
            return {key: files for key in keys if (files := _walk(os.path.join(experiment.path, key)))}
    root = experiment.path.rstrip("/") + "/"
    with storage_errors("list", experiment):
        infos = experiment.filesystem.get_file_info(pafs.FileSelector(experiment.path, recursive=True))
    return files_by_checkpoint((info.path[len(root):], info.size or 0) for info in infos
                               if info.type == pafs.FileType.File and info.path.startswith(root))


def files_by_checkpoint(files: Iterable[tuple[str, int]]) -> dict[str, dict[str, int]]:
    """:func:`checkpoint_files` of an experiment's listed files (path inside it, bytes)."""
    out: dict[str, dict[str, int]] = {}
    train = f"/{TRAIN_DIR}/"
    for rel, size in files:
        if "/checkpoint_" not in rel and train not in rel:  # (most files: a substring test costs less than a split)
            continue
        parts = rel.split("/")
        if len(parts) > 2 and CHECKPOINT_DIR.match(parts[1]):
            out.setdefault(f"{parts[0]}/{parts[1]}", {})["/".join(parts[2:])] = size
        elif len(parts) > 3 and parts[1] == TRAIN_DIR and is_train_checkpoint(parts[2]):  # every rank's part
            out.setdefault(f"{parts[0]}/{TRAIN_DIR}/{parts[2]}", {})["/".join(parts[3:])] = size
    return out


def _walk(top: str, prefix: str = "") -> dict[str, int]:
    """The files under local directory ``top`` (path inside it -> bytes); none if it is missing."""
    out: dict[str, int] = {}
    try:
        with os.scandir(top) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    out.update(_walk(entry.path, f"{prefix}{entry.name}/"))
                elif entry.is_file():
                    out[prefix + entry.name] = entry.stat().st_size
    except (FileNotFoundError, NotADirectoryError):
        pass
    return out
