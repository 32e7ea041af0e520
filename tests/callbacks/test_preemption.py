"""SIGTERM to a real driver: every running trial checkpoints, the run stops, resume loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.callbacks.preempt_driver import NAME, STOP
from tests.support.contract import checkpoint_iterations

ROOT = Path(__file__).resolve().parents[2]


def _iterations(trial_dir: Path) -> list[int]:
    path = trial_dir / "result.json"
    if not path.exists():
        return []
    return [json.loads(line)["training_iteration"] for line in path.read_text().splitlines() if line.strip()]


def _driver(mode: str, storage: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.callbacks.preempt_driver", mode, str(storage)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_sigterm_checkpoints_all_trials_and_resume_loses_nothing(storage):
    proc = _driver("start", storage)
    exp = storage / NAME
    for _ in range(1200):  # bounded wait (not a timing assertion): both trials under way
        trials = [d for d in exp.glob("ScriptedTrainable_*") if d.is_dir()] if exp.exists() else []
        if len(trials) == 2 and all(len(_iterations(d)) >= 3 for d in trials):
            break
        if proc.poll() is not None:
            break
        time.sleep(0.25)
    assert proc.poll() is None, proc.stdout.read()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "preemption notice (SIGTERM)" in out
    before = {d.name: _iterations(d) for d in trials}
    assert all(its and max(its) < STOP for its in before.values()), before  # it really stopped early
    for d in trials:  # each running trial checkpointed after the notice
        assert checkpoint_iterations(d), f"{d.name} has no checkpoint"

    resumed = _driver("resume", storage)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out
    assert f"iterations at exit: [{STOP}, {STOP}]" in out
    for d in trials:
        after = _iterations(d)
        assert set(after) == set(range(1, STOP + 1)), d.name
        assert set(before[d.name]) <= set(after)
