"""tunekit sits quietly on a user's machine: its own names only, an offline CLI without Ray or torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def _python(code: str, *, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def test_generic_names_are_not_claimed(tmp_path):
    for name in ("callbacks", "trainables"):
        done = _python(f"import {name}", cwd=tmp_path)
        assert done.returncode == 1 and f"ModuleNotFoundError: No module named '{name}'" in done.stderr
    done = _python(
        "from tunekit.callbacks import CheckpointByStepsTaken\n"
        "from tunekit.trainables import DigitsTrainable\n"
        "print(CheckpointByStepsTaken.__module__, DigitsTrainable.__module__)",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["tunekit.callbacks.steps", "tunekit.trainables.class_api"]


_USER_DRIVER = """
import callbacks, trainables, ray
from ray import tune
from tunekit.callbacks import CheckpointByStepsTaken
from tunekit.trainables import DigitsTrainable


class Mine(DigitsTrainable):
    def train_iteration(self):
        import callbacks, trainables  # the user's, in the Ray worker too
        import tunekit.callbacks
        metrics = super().train_iteration()
        metrics.update(user=callbacks.WHO + "+" + trainables.WHO, ours=tunekit.callbacks.__name__)
        return metrics


ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
grid = tune.Tuner(
    Mine,
    param_space={"hidden_size": 8, "steps_per_iteration": 2},
    run_config=tune.RunConfig(storage_path=STORAGE, name="clash", stop={"training_iteration": 2},
                              callbacks=[CheckpointByStepsTaken(1)], verbose=0),
).fit()
result = grid[0]
print(json.dumps({
    "error": str(result.error) if result.error else None,
    "driver": callbacks.WHO + "+" + trainables.WHO,
    "worker": result.metrics.get("user"),
    "ours": result.metrics.get("ours"),
    "checkpoints": sorted(m["training_iteration"] for _, m in result.best_checkpoints),
}))
"""


@pytest.mark.slow
def test_a_users_own_callbacks_and_trainables_modules_stay_theirs(tmp_path):
    """A project with its own callbacks.py and trainables.py runs a tunekit sweep from its directory."""
    (tmp_path / "callbacks.py").write_text('WHO = "user-callbacks"\n')
    (tmp_path / "trainables.py").write_text('WHO = "user-trainables"\n')
    code = f"import json\nSTORAGE = {str(tmp_path / 'runs')!r}\n" + textwrap.dedent(_USER_DRIVER)
    done = _python(code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["error"] is None
    assert report["driver"] == report["worker"] == "user-callbacks+user-trainables"
    assert report["ours"] == "tunekit.callbacks"
    assert report["checkpoints"] == [1, 2]


_MODULES_AFTER = """
import sys
from tunekit.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("ray", "torch") if m in sys.modules)
print("RESULT", code, ",".join(heavy) or "-", file=sys.stderr)
"""


@pytest.mark.parametrize("command", ["--help", "status", "verify", "report"])
def test_offline_commands_import_neither_ray_nor_torch(pbt_experiment, tmp_path, command):
    args = {
        "--help": ["--help"],
        "status": ["status", str(pbt_experiment), "--metric", "accuracy", "--mode", "max"],
        "verify": ["verify", str(pbt_experiment)],
        "report": ["report", str(pbt_experiment), "--output", str(tmp_path / "report")],
    }[command]
    done = subprocess.run(
        [sys.executable, "-c", _MODULES_AFTER, *args], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    line = next(x for x in done.stderr.splitlines() if x.startswith("RESULT "))
    _, code, heavy = line.split()
    assert code == "0", done.stderr[-2000:]
    assert heavy == "-", f"tunekit {command} imported {heavy}"


def test_import_tunekit_is_lazy(tmp_path):
    done = _python(
        "import sys, tunekit\n"
        "before = sorted(m for m in ('ray', 'torch') if m in sys.modules)\n"
        "tunekit.TrainingState\n"
        "print(before, 'torch' in sys.modules)",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] True"
    done = _python("import tunekit; tunekit.nothing_here", cwd=tmp_path)
    assert "AttributeError: module 'tunekit' has no attribute 'nothing_here'" in done.stderr
    # the failure injector is imported by a driver before its Ray starts: it loads Ray only to kill at random
    done = _python("import sys, tunekit.testing\nprint(sorted(m for m in ('ray', 'torch') if m in sys.modules))",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
