"""Announced checkpoints: an index never announced twice, a directory that exists from the announcement on.

Implementation tier, beside :mod:`tunekit.checkpoint._trial_dir` (the names). A two-phase
save announces its checkpoint to Tune before the write is done. Ray's own
counter of checkpoint indices lags after a killed write (the driver advances it
only when registering a checkpoint succeeded), so :func:`claim_index` picks an
index no name in the trial directory ever carried, and records it in
``.tunekit-index``. :func:`announce` creates the checkpoint's directory empty
before Tune hears of it (Ray's retention may then delete it like any
registered checkpoint, and never fails to find it); the commit renames the
written checkpoint onto it. An empty checkpoint directory is thus a write in
flight, or one whose writer died: :func:`drop_unregistered` removes those Ray
never registered, :func:`newest_complete_instead` stands in for a finished
trial's last one.
"""

from __future__ import annotations

import os

from tunekit.checkpoint._manifest import MANIFEST_FILE
from tunekit.checkpoint._trial_dir import CHECKPOINT_DIR, LOCAL, scan

__all__ = [
    "INDEX_FILE", "announce", "claim_index", "drop_unregistered", "highest_index", "is_announced_only",
    "newest_complete_instead", "registered_unwritten"
]

#: The trial's highest checkpoint index announced so far (a decimal number).
INDEX_FILE = ".tunekit-index"


def claim_index(trial_dir: str, proposed: int, *, record: bool = True) -> int:
    """The index of the trial's next checkpoint: ``proposed`` (Ray's counter), or higher if it was used already.

    Ray's counter lags after a killed write (the driver advances it only when
    a checkpoint is registered, and not when registering it failed), so a new
    worker can be handed an index a checkpoint was announced under before;
    Ray would then register one path twice and delete it as the older of the
    two. The answer is above every index any name in ``trial_dir`` carries
    (checkpoints, staging, kept, pinned and damaged copies) and above the
    highest ever claimed (:data:`INDEX_FILE`, which outlives the tidying of
    interrupted writes), and is recorded there before it is used.

    ``record=False``: for a checkpoint announced only once it is whole (written
    before its save returns), whose name is its own record. A name above Ray's
    counter was never registered, so Ray's retention never removes it, and
    tunekit removes one (a dead writer's staging directory, an announced
    directory never written) only once a checkpoint of a higher index is
    whole beside it: the scan of the directory still sees every index above
    Ray's counter that was ever used.
    """
    index = max(proposed, highest_index(trial_dir) + 1)
    if not record:
        return index
    os.makedirs(trial_dir, exist_ok=True)
    temporary = os.path.join(trial_dir, f"{INDEX_FILE}.{os.getpid()}")
    with open(temporary, "w") as fh:
        fh.write(str(index))
    os.replace(temporary, os.path.join(trial_dir, INDEX_FILE))  # a killed process leaves the page cache whole
    return index


def highest_index(trial_dir: str) -> int:
    """The highest checkpoint index the trial's directory ever held (-1 if none)."""
    highest = -1
    try:
        with open(os.path.join(trial_dir, INDEX_FILE)) as fh:
            highest = int(fh.read().strip() or -1)
    except (OSError, ValueError):
        pass
    return max([highest, *(e.index for e in scan(LOCAL, trial_dir, ("checkpoint", "kept", "pinned", "damaged",
                                                                        "staging")))])



def announce(final: str) -> None:
    """Create ``final`` empty, before it is announced to Tune: an announced checkpoint always exists.

    The commit renames the written checkpoint onto it (atomic: a rename onto
    an empty directory); until then readers find it empty, a write in flight
    or one that never completed. Ray's ``num_to_keep`` may delete it like any
    registered checkpoint.
    """
    os.makedirs(final, exist_ok=True)


def is_announced_only(path: str) -> bool:
    """Whether local ``path`` is an announced checkpoint whose write has not completed (an empty directory)."""
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def drop_unregistered(parent: str, completed: int) -> None:
    """After checkpoint ``completed`` is whole: remove the announced checkpoints before it that were never
    written and that Ray never registered (their worker was killed before its ``save`` returned).

    Only an empty checkpoint directory beside its dead writer's staging
    directory is such a checkpoint. An empty one without it may be a
    registered checkpoint that Ray's ``num_to_keep`` is deleting at this
    moment (pyarrow removes the files first, then the directory): removing
    it would make Ray's deletion fail, which Ray logs with a traceback. So
    the caller runs this before :func:`tunekit.checkpoint._trial_dir.tidy`, which
    removes dead writers' staging directories.

    One Ray registered is what a restore of the trial was asked for
    (:func:`registered_unwritten`): Ray's ``num_to_keep`` deletes it, and
    deleting it first would make Ray's deletion fail.
    """
    entries = scan(LOCAL, parent, ("checkpoint", "writing", "interrupted"))
    live = {e.checkpoint for e in entries if e.kind == "writing"}
    died = {e.checkpoint for e in entries if e.kind == "interrupted"} - live
    for e in entries:
        if e.kind == "checkpoint" and e.index < completed and e.name in died and \
                os.path.normpath(e.path) not in _REGISTERED_UNWRITTEN and is_announced_only(e.path):
            _remove_empty(e.path)


#: Announced checkpoints whose write never completed and that Ray asked this process to restore: registered.
_REGISTERED_UNWRITTEN: set[str] = set()


def registered_unwritten(path: str) -> None:
    """Ray asked to restore ``path``, an announced checkpoint whose write never completed: Ray registered it,
    so :func:`drop_unregistered` leaves it to Ray's retention."""
    _REGISTERED_UNWRITTEN.add(os.path.normpath(path))


def _remove_empty(path: str) -> None:
    try:
        os.rmdir(path)  # only ever an empty directory
    except OSError:
        pass


def newest_complete_instead(final: str) -> str | None:
    """``final`` was announced and its writer died after its trial finished (nothing will retry it): the
    trial's newest complete checkpoint before it, as a checkpoint directory of its own (a kept copy is
    renamed to its checkpoint's name), or None if the trial has none. ``final`` (empty) is removed."""
    parent, name = os.path.split(os.path.normpath(final))
    match = CHECKPOINT_DIR.match(name)
    if match is None or not is_announced_only(final):
        return None
    best: tuple[int, bool, str] | None = None
    for e in scan(LOCAL, parent, ("checkpoint", "kept")):
        if e.index < int(match[1]) and os.path.exists(os.path.join(e.path, MANIFEST_FILE)):
            candidate = (e.index, e.kind == "checkpoint", e.path)
            best = candidate if best is None or candidate[:2] > best[:2] else best
    if best is None:
        return None
    index, real, path = best
    if not real:
        target = os.path.join(parent, f"checkpoint_{index:06d}")
        try:
            os.rename(path, target)  # the kept copy becomes a checkpoint again (its original was deleted)
        except OSError:
            return None
        path = target
    _remove_empty(final)
    return path


