"""README.md is true: its example runs as written, its set-up commands are the CI's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_exactly_two_setup_commands():
    commands = [line for block in _blocks("bash") for line in block.strip().splitlines()]
    assert len(commands) == 2
    quick, tests = commands
    assert quick.endswith("tunekit quickstart") and "pip install" in quick
    assert tests.endswith("python -m pytest") and "'.[test]'" in tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert "grep -E '^python3 -m venv .venv .*pytest' README.md" in ci
    assert re.search(r"^python3 -m venv \.venv .*pytest", README, flags=re.M).group(0) == tests


def test_user_path_example_runs(tmp_path):
    (example,) = [b for b in _blocks("python") if "tune.Tuner(" in b and "TorchTrainable" in b]
    script = tmp_path / "example.py"
    script.write_text(
        "import ray\nray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)\n" + example
    )
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"best lr: 0\.0[13] loss: [0-9.]+", out.stdout)
    paths = re.search(r"checkpoints: \[(.*)\]", out.stdout).group(1)
    assert paths.count("checkpoint_") == 2  # iterations 3 and 6
    assert str(tmp_path / "ray_results") in paths
