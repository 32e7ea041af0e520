"""The keys tunekit adds to a trial's results: written by the trainables, read by the readers and callbacks.
"""

from __future__ import annotations

__all__ = ["INTERVAL_KEY", "RESTORED_FROM_KEY", "SAVE_BLOCKED_KEY", "SAVE_WRITE_KEY"]

#: Result key: on a trial's first result after a restore, the name of the trial directory whose checkpoint
#: it restored (its own after a retry; a PBT donor's after an exploit). tunekit's trainables report it.
RESTORED_FROM_KEY = "tunekit/restored_from"

#: Result keys: a save's blocking time and the last completed write's time (reported by tunekit's
#: trainables in the first result after each save), and the interval the autopilot chose.
SAVE_BLOCKED_KEY = "tunekit/save_blocked_s"
SAVE_WRITE_KEY = "tunekit/save_write_s"
INTERVAL_KEY = "tunekit/checkpoint_interval_s"
