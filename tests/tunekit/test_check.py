"""`tunekit check`: the reference and integration trainables pass; each broken trainable gets its diagnosis."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tunekit.cli import main

ROOT = Path(__file__).resolve().parents[2]
DIGITS = {"hidden_size": 8, "steps_per_iteration": 2, "seed": 1}


@pytest.mark.parametrize("trainable, config", [
    ("tunekit.trainables:DigitsTrainable", DIGITS),
    ("tunekit.trainables:TrainDigits", DIGITS),
    ("tests.integrations.models:train_lightning", {"lr": 0.05, "epochs": 10}),
    ("tests.integrations.models:train_transformers", {"learning_rate": 0.001, "epochs": 10}),
], ids=["class", "function", "lightning", "transformers"])
def test_the_reference_and_integration_trainables_pass(trainable, config, capsys):
    assert main(["check", trainable, "--config", json.dumps(config)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"PASS {trainable}: 4 iterations, interrupted after 2"), out


def test_readmes_example_passes(tmp_path, monkeypatch, capsys):
    """README's MyTrainable, saved as the user's own module in the directory they run the command from."""
    readme = (ROOT / "README.md").read_text()
    (block,) = [b for b in re.findall(r"^```python\n(.*?)^```", readme, flags=re.S | re.M) if "class MyTrainable" in b]
    (tmp_path / "my_sweep.py").write_text(block.split("tuner = tune.Tuner(")[0])
    monkeypatch.chdir(tmp_path)
    assert main(["check", "my_sweep:MyTrainable", "--config", '{"lr": 0.01, "seed": 0}', "--iterations", "3",
                 "--at", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and (report["iterations"], report["at"]) == (3, 1)


GALLERY = [
    ("ExtraTensor", "cause: self.drift (a tensor) is not in the saved state"),
    ("PrivateRandom", "cause: self.noise (a random.Random) is not in the saved state"),
    ("NumpyGenerator", "cause: self.gen (a numpy.random.Generator) is not in the saved state"),
    ("IteratorOutside", "suspect: self.batches is an iterator outside the saved state"),
    ("train_counted", "cause: train_counted: closure variable calls[0] (a value) is not in the saved state"),
]


@pytest.mark.parametrize("name, diagnosis", GALLERY, ids=[g[0] for g in GALLERY])
def test_each_broken_trainable_gets_its_diagnosis(name, diagnosis, capsys):
    assert main(["check", f"tests.tunekit.check_gallery:{name}", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "resume differs", report
    assert report["difference"].startswith("metric ") and "at iteration 3 (1 after the resume at 2)" in \
        report["difference"]
    assert report["diagnosis"][0].startswith(diagnosis), report
    assert len(report["diagnosis"]) == 1, report  # nothing else blamed


def test_a_nondeterministic_trainable_is_told_apart_from_an_unresumable_one(capsys):
    assert main(["check", "tests.tunekit.check_gallery:Nondeterministic"]) == 1
    out = capsys.readouterr().out
    assert "not deterministic" in out.splitlines()[0]
    assert "at iteration 1:" in out and "runs A and B differ without any resume" in out
    assert "torch.use_deterministic_algorithms(True)" in out and "not in the saved state" not in out
    # (the same model with everything in its state passes: test_the_command_runs_from_a_fresh_shell_without_ray)


@pytest.mark.parametrize("args, message", [
    (["tests.tunekit.no_such_module:X"], "cannot import tests.tunekit.no_such_module"),
    (["tunekit.trainables:DEFAULTS_NOT_THERE"], "tunekit.trainables has no attribute DEFAULTS_NOT_THERE"),
    (["tunekit.trainables.digits:DEFAULTS"], "dict is not a trainable; expected a tunekit.TorchTrainable subclass"),
    (["tunekit.trainables:DigitsTrainable", "--config", "{lr: 1"], "--config: not valid JSON"),
    (["tunekit.trainables:DigitsTrainable", "--config", "[1, 2]"], "--config: expected a JSON object"),
    (["tunekit.trainables:DigitsTrainable", "--config", "no/such.json"], "--config: no such file no/such.json"),
    (["tunekit.trainables:DigitsTrainable", "--iterations", "4", "--at", "4"], "--at 4: expected an iteration in 1..3"),
    (["tunekit.trainables:DigitsTrainable", "--iterations", "1"], "1 must be >= 2"),
    (["tests.tunekit.check_gallery:train_silent"],
     "check_gallery.train_silent: the training function returned without reporting anything"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    assert main(["check", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_the_command_runs_from_a_fresh_shell_without_ray(tmp_path):
    """The console entry point, as a user types it; no Ray is started (no session directory appears where Ray
    would put one: RAY_TMPDIR/ray)."""
    import os

    env = {**os.environ, "RAY_TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "tunekit.cli", "check", "tests.tunekit.check_gallery:Resumable",
                           "--iterations", "2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("PASS tests.tunekit.check_gallery:Resumable: 2 iterations, interrupted after 1")
    assert not (tmp_path / "ray").exists(), sorted(p.name for p in tmp_path.iterdir())


@pytest.mark.parametrize("notebook, lr", [("lightning", 0.05), ("transformers", 1e-3)])
def test_the_notebooks_trainables_pass(notebook, lr, tmp_path, monkeypatch, capsys):
    """The notebook's parameters and training function, saved as a module as a user would."""
    cells = json.loads((ROOT / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    (source,) = [c for c in code if "def train(config)" in c]
    (tmp_path / f"nb_{notebook}.py").write_text(code[0] + "\n" + source)
    monkeypatch.chdir(tmp_path)
    config = {"lr": lr, "seed": 0, "epochs": 6}
    assert main(["check", f"nb_{notebook}:train", "--config", json.dumps(config)]) == 0, capsys.readouterr()
    assert capsys.readouterr().out.startswith(f"PASS nb_{notebook}:train")


def test_each_trainable_declares_what_it_is():
    """The commands tell a trainable's kind from what it declares (``tunekit_trainable``), nothing else."""
    from tunekit.multiworker import train_trial
    from tunekit.trainables import DigitsTrainable, TrainDigits, train_digits
    from tunekit.trainables.ddp import tune_ddp
    from tunekit.trial.kind import TrainableKind, declared
    from tests.tunekit.multiworker_loops import checked, loop

    assert declared(TrainDigits).train_fn is train_digits and not declared(TrainDigits).multiworker
    assert declared(DigitsTrainable) == TrainableKind() == declared(train_digits)
    assert declared(checked).train_fn is not None and declared(checked).multiworker
    assert dict(declared(checked).resources) == {"workers": 2, "cpus_per_worker": 0.5, "use_gpu": False}
    assert declared(tune_ddp) == TrainableKind(multiworker=True)
    ahead = train_trial(loop, workers=2, cpus_per_worker=0.5, lockstep=False)  # (its workers run ahead of Tune)
    assert declared(ahead).multiworker and declared(ahead).train_fn is None
