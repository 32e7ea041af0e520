"""README.md and docs/ are true: every Python and console snippet runs as written, the set-up commands are CI's.

Snippets that need an experiment use the newest quickstart experiment under
``~/tunekit_results``; each runs in a fresh process whose HOME holds a copy of
the quickstart's experiment. ``text`` blocks are synopses and sample output.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Snippets that run a Tuner get a local Ray of 2 CPUs, as on this project's machines.
RAY_PRELUDE = ("import ray\nray.init(address='local', num_cpus=2, include_dashboard=False, log_to_driver=False)\n")


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def _snippets() -> list[tuple[str, int, str, str]]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for lang in ("python", "console"):
            for i, block in enumerate(_blocks(text, lang)):
                out.append((str(page.relative_to(ROOT)), i, lang, block))
    return out


SNIPPETS = _snippets()


def test_exactly_two_setup_commands():
    commands = [line for block in _blocks(README, "bash") for line in block.strip().splitlines()]
    assert len(commands) == 2
    quick, tests = commands
    assert quick.endswith("tunekit quickstart") and "pip install" in quick
    assert tests.endswith("python -m pytest") and "'.[test]'" in tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert "grep -E '^python3 -m venv .venv .*pytest' README.md" in ci
    assert re.search(r"^python3 -m venv \.venv .*pytest", README, flags=re.M).group(0) == tests


def test_readme_is_short_and_starts_with_the_users_path():
    lines = README.splitlines()
    assert len(lines) < 200
    example = next(i for i, line in enumerate(lines) if line.startswith("class MyTrainable(TorchTrainable)"))
    assert example < 80
    assert "Python 3.11" in README and "python_requires = >=3.11" in (ROOT / "setup.cfg").read_text()
    for link in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / link).is_file(), link


@pytest.fixture(scope="module")
def home(quickstart_experiment, tmp_path_factory) -> Path:
    """A HOME whose ~/tunekit_results holds the quickstart's experiment, as after README's first command."""
    home = tmp_path_factory.mktemp("home")
    shutil.copytree(quickstart_experiment, home / "tunekit_results" / "quickstart_2026-11-23_10-00-00")
    return home


def _env(home: Path) -> dict[str, str]:
    return {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "RAY_AUTH_MODE": "disabled",
            "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def _run_alone(code: str) -> bool:
    """Snippets with a test of their own, which checks what they print too."""
    return "class MyTrainable" in code or "PopulationBasedTraining" in code and "train_trial" in code


@pytest.mark.parametrize("page, index, lang, code", [s for s in SNIPPETS if not _run_alone(s[3])],
                         ids=[f"{p}:{lang}{i}" for p, i, lang, c in SNIPPETS if not _run_alone(c)])
def test_snippet_runs_as_written(page, index, lang, code, home, tmp_path):
    if lang == "python":
        script = tmp_path / "snippet.py"
        script.write_text((RAY_PRELUDE if "Tuner(" in code else "") + code)
        argv = [sys.executable, str(script)]
    else:
        commands = [line[2:] for line in code.splitlines() if line.startswith("$ ")]
        assert commands, f"{page}: a console block without $ lines"
        script = tmp_path / "snippet.sh"
        script.write_text("set -euo pipefail\n" + "\n".join(commands) + "\n")
        argv = ["bash", str(script)]
    done = subprocess.run(argv, cwd=tmp_path, env=_env(home), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{page} {lang} block {index}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def test_user_path_example_runs(tmp_path):
    (example,) = [b for b in _blocks(README, "python") if "tune.Tuner(" in b and "TorchTrainable" in b]
    script = tmp_path / "example.py"
    script.write_text(RAY_PRELUDE + example)
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"best lr: 0\.0[13] loss: [0-9.]+", out.stdout)
    paths = re.search(r"checkpoints: \[(.*)\]", out.stdout).group(1)
    assert paths.count("checkpoint_") == 2  # iterations 3 and 6
    assert str(tmp_path / "ray_results" / "my_sweep") in paths  # where README says a plain Tuner.fit() writes
    assert (tmp_path / "ray_results" / "my_sweep" / "tunekit_results").is_dir()  # ParquetLogger's dataset


def test_multi_worker_pbt_example_puts_the_clones_new_rate_in_effect(tmp_path):
    """docs/multiworker.md's PBT example as written: one trial clones the other at iteration 2 and ends at a
    rate that is not its starting one, and every trial's optimizer runs at the rate its config holds."""
    page = (ROOT / "docs" / "multiworker.md").read_text()
    (example,) = [b for b in _blocks(page, "python") if _run_alone(b)]
    script = tmp_path / "pbt_example.py"
    script.write_text(RAY_PRELUDE + example)
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rates = re.findall(r"^trial \S+: lr (\S+), in effect (\S+)$", out.stdout, flags=re.M)
    assert len(rates) == 2, out.stdout
    assert all(config == effect for config, effect in rates), rates
    started = {"0.001", "0.01"}
    assert sum(config not in started for config, _ in rates) == 1, rates  # the clone's: 0.8 or 1.2 of its donor's
    _multi_worker_pbt_kept_what_it_needs(tmp_path / "ray_results" / "pbt_fsdp", dict(
        (trial, config not in started) for trial, (config, _) in zip(
            re.findall(r"^trial (\S+):", out.stdout, flags=re.M), rates)))


def _multi_worker_pbt_kept_what_it_needs(experiment: Path, cloned: dict[str, bool]) -> None:
    """The lineage names the one exploit: the clone took the donor's iteration-2 checkpoint. With
    ``KeepCheckpoints(trial_latest=1)`` each trial keeps its newest Tune checkpoint and the Train checkpoint it
    points at, at most one more of each (written as Tune stopped the trial for PBT's pause or exploit, never
    registered by Tune, so no policy run by Tune counts it: ``tunekit gc`` takes those after the run), older
    than the kept one and in a directory of its own; every pointer's target is there and whole."""
    from tunekit import verify_experiment
    from tunekit.analysis import pbt_lineage
    from tunekit.checkpoint import read_metadata
    from tunekit.experiment.snapshot import read_experiment
    from tunekit.multiworker.trial import train_checkpoint_of

    (clone,) = [t for t, yes in cloned.items() if yes]
    (donor,) = [t for t, yes in cloned.items() if not yes]
    exploits = pbt_lineage(str(experiment)).exploits
    assert len(exploits) == 1, exploits
    assert (exploits.iloc[0]["target"], exploits.iloc[0]["source"]) == (clone, donor)
    assert exploits.iloc[0]["source_iteration"] == 2 and not exploits.iloc[0]["undone"]
    for trial in read_experiment(str(experiment)).trials:
        trial_dir = experiment / trial.name
        pointers = sorted(trial_dir.glob("checkpoint_0*"))
        kept = pointers[-1]
        target = train_checkpoint_of(str(kept))
        assert target is not None and target.startswith(str(trial_dir / "train"))
        assert len(pointers) <= 2, pointers
        for other in pointers[:-1]:
            assert read_metadata(str(other))["iteration"] < read_metadata(str(kept))["iteration"]
        left = sorted(str(p) for p in (trial_dir / "train").glob("checkpoint_*") if p.is_dir())
        assert target in left and len(left) <= 2, (left, target)  # (without retention: 3 or more)
    check = verify_experiment(str(experiment))  # every pointer's target there, every rank's part whole
    assert check.ok, [c for c in check.checks if c.status != "good"]
