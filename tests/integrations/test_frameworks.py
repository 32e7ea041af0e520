"""Lightning and Hugging Face Trainer trials: the checkpoint-complete contract, with a real Tuner.fit()."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ray import tune

from tests.support.contract import KillActorOnce, checkpoint_iterations, run_actor, run_actor_saving_midway
from tunekit.testing import tensors_equal
from tests.support.fit import fit, only_result, tunekit_rows
from tunekit import CheckpointError, read_metadata, read_state, warm_start
from tunekit.callbacks import CheckpointByStepsTaken, ParquetLogger

pytest.importorskip("lightning")
pytest.importorskip("transformers")

from tests.integrations.models import TrainLightning, TrainTransformers  # noqa: E402

KEY = "tunekit/framework:"
#: Per framework: the trainable, its config, the iterations of the reference run (one per epoch).
CASES = {
    "lightning": (TrainLightning, {"lr": 0.05, "seed": 3, "epochs": 5}, 5),
    "transformers": (TrainTransformers, {"learning_rate": 0.01, "seed": 3, "epochs": 4}, 4),
}
#: The learning rate's config key: as each framework's users name it.
LR = {"lightning": "lr", "transformers": "learning_rate"}


@pytest.fixture(params=sorted(CASES))
def framework(request):
    return request.param


def _fit(trainable, storage, name, *, config, stop, callbacks=(), max_failures=0, **ckpt):
    return fit(trainable, storage, name, stop=stop, config=config, callbacks=callbacks, max_failures=max_failures,
               **ckpt)[0]


PLAIN = dict(checkpoint_frequency=2, checkpoint_at_end=True)


@pytest.fixture(scope="module")
def plain(built_once):
    """The uninterrupted reference run of each framework (frequency 2, at end, CheckpointByStepsTaken(3)), run once
    for every test process; read-only."""
    cache = {}

    def get(framework):
        if framework not in cache:
            trainable, config, iterations = CASES[framework]

            def build(where):
                _fit(trainable, where, "plain", config=config, stop=iterations, callbacks=[CheckpointByStepsTaken(3)],
                     **PLAIN)

            cache[framework] = only_result(built_once(f"plain-{framework}", build) / "plain")
        return cache[framework]

    return get


def _framework_part(state, framework):
    part = dict(state["extras"][KEY + framework])
    if framework == "transformers":  # timings in the log history differ from run to run
        trainer_state = dict(part.pop("trainer_state"))
        part["log_history"] = [{k: v for k, v in row.items() if "runtime" not in k and "per_second" not in k}
                               for row in trainer_state.pop("log_history")]
        part["trainer_state"] = trainer_state
    return part


def _same_training_state(a, b, framework):
    assert tensors_equal(a["models"], b["models"]) == []
    assert tensors_equal(_framework_part(a, framework), _framework_part(b, framework)) == []
    assert a["counters"] == b["counters"]


def test_resume_in_a_fresh_actor_is_bit_exact(ray_session, framework, storage):
    """Lightning at an epoch end; the HF Trainer in the middle of an epoch (every_n_steps=4, 6 steps an epoch)."""
    _resume_is_bit_exact(framework, storage)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_resume_on_a_gpu_in_a_fresh_actor_is_bit_exact(ray_session, framework, storage):
    """The same on the actor's GPU (``accelerator="gpu"``, ``use_cpu=False``): the CUDA RNG stream too."""
    _resume_is_bit_exact(framework, storage, accelerator="gpu")


def _resume_is_bit_exact(framework, storage, **extra):
    trainable, config, _ = CASES[framework]
    config = {**config, **extra, **({"every_n_steps": 4} if framework == "transformers" else {})}
    full_results, half, full = run_actor_saving_midway(trainable, config, storage, "full", 4, 2)
    second, resumed = run_actor(trainable, config, storage, "second", 2, restore_from=half)
    a, b = read_state(full.checkpoint.path), read_state(resumed.checkpoint.path)
    _same_training_state(a, b, framework)
    assert tensors_equal(a["rng"], b["rng"]) == []
    assert [r.get("loss", r.get("train_loss")) for r in full_results[2:]] == [
        r.get("loss", r.get("train_loss")) for r in second]
    assert [r["training_iteration"] for r in second] == [3, 4]


def test_checkpoint_iterations_and_verify(ray_session, framework, plain):
    from tunekit.cli import main

    result = plain(framework)
    iterations = CASES[framework][2]
    # checkpoint_frequency=2, CheckpointByStepsTaken(3) and checkpoint_at_end: each iteration once.
    assert checkpoint_iterations(Path(result.path)) == sorted({2, 3, 4, iterations} & set(range(1, iterations + 1)))
    assert main(["verify", str(Path(result.path).parent)]) == 0
    metadata = read_metadata(result.checkpoint.path)
    assert metadata["trainable"].endswith(f"train_{framework}") and metadata["iteration"] == iterations


def test_killed_worker_finishes_with_the_same_weights(ray_session, framework, storage, plain):
    trainable, config, iterations = CASES[framework]
    kill = KillActorOnce(3)
    killed = _fit(trainable, storage, "killed", config=config, stop=iterations, callbacks=[kill, ParquetLogger()],
                  max_failures=2, **PLAIN)
    assert kill.killed
    pids = list(dict.fromkeys(tunekit_rows(killed)["pid"]))
    assert len(pids) == 2, "the trial was not restarted in a new worker"
    _same_training_state(read_state(plain(framework).checkpoint.path), read_state(killed.checkpoint.path), framework)


def _checkpoint_at(result, iteration):
    return next(str(p) for p in sorted(Path(result.path).glob("checkpoint_*"))
                if read_metadata(str(p))["iteration"] == iteration)


def test_warm_starts(ray_session, framework, storage, plain):
    """continue: the rest of the reference run, bit-exact; weights: a fresh optimizer and schedule."""
    trainable, config, iterations = CASES[framework]
    reference = plain(framework)
    source = _checkpoint_at(reference, 2)
    warm = _fit(trainable, storage, "continue", config={**config, **warm_start(source, mode="continue")},
                stop=iterations, checkpoint_at_end=True)
    assert list(warm.metrics_dataframe["training_iteration"]) == list(range(3, iterations + 1))
    a, b = read_state(reference.checkpoint.path), read_state(warm.checkpoint.path)
    _same_training_state(a, b, framework)
    assert b["extras"]["tunekit/warm_start"] == {"checkpoint": source, "mode": "continue", "iteration": 2}

    tuned = _fit(trainable, storage, "weights", config={**config, LR[framework]: 0.002,
                                                        **warm_start(source, mode="weights")},
                 stop=1, checkpoint_at_end=True)
    state = read_state(tuned.checkpoint.path)
    part = state["extras"][KEY + framework]
    assert state["counters"]["iteration"] == 1
    if framework == "lightning":
        assert part["global_step"] == 4 and part["lr_schedulers"][0]["last_epoch"] == 1
        assert part["optimizer_states"][0]["param_groups"][0]["initial_lr"] == 0.002
    else:
        assert part["trainer_state"]["global_step"] == 6 and set(part["scheduler"]["base_lrs"]) == {0.002}
        assert all(v["step"].item() == 6 for v in part["optimizer"]["state"].values())  # AdamW from step 0


def test_pbt_exploit_puts_the_mutated_learning_rate_in_effect(ray_session, framework, storage):
    """After every exploit the optimizer runs at the trial's new (mutated) rate, not the donor's."""
    from tunekit.schedule.pbt import pbt_setup

    trainable, config, _ = CASES[framework]
    config = {**config, "epochs": 6, "gamma": 1.0, "schedule": "constant", "samples": 256,
              LR[framework]: tune.grid_search([0.01, 1e-6]), "pace_dir": str(storage),
              # The poor trial follows the good one epoch by epoch (tests/integrations/models.py:pace).
              "leader": tune.sample_from(lambda spec: spec.config[LR[framework]] >= 1e-3)}
    lr_metric = "lr_in_effect" if framework == "lightning" else "learning_rate"
    loss = "train_loss" if framework == "lightning" else "loss"
    setup = pbt_setup(trainable, metric=loss, mode="min", perturbation_interval=1, quantile_fraction=0.5,
                      mutations={LR[framework]: [1e-4, 3e-3, 0.01, 0.02]}, resample_probability=0.5)
    grid = tune.Tuner(
        trainable, param_space=config,
        tune_config=tune.TuneConfig(**setup.tune_config_kwargs()),
        run_config=tune.RunConfig(name="pbt", storage_path=str(storage), stop={"training_iteration": 6},
                                  checkpoint_config=setup.checkpoint_config, verbose=0),
    ).fit()
    assert not grid.errors, grid.errors
    exploited, seen = 0, []
    for result in grid:
        df = result.metrics_dataframe
        key = f"config/{LR[framework]}"
        assert list(df[lr_metric]) == pytest.approx(list(df[key]), rel=1e-6)
        exploited += int((df[key].diff().fillna(0) != 0).sum())
        seen.append(list(zip(df[key], df[loss])))
    assert exploited >= 1, f"no exploit happened: {seen}"


def test_a_checkpoint_of_the_wrong_kind_is_refused_in_one_line(ray_session, plain, tmp_path):
    from tests.integrations.models import lightning_module
    from tunekit.integrations._common import new_state
    from tunekit.trial.warm import apply_warm_start

    lightning_ckpt = plain("lightning").checkpoint.path
    hf_ckpt = plain("transformers").checkpoint.path
    for framework, model, wrong in (("transformers", torch.nn.Linear(2, 2), lightning_ckpt),
                                    ("lightning", lightning_module({"lr": 0.1}), hf_ckpt)):
        for mode in ("continue", "weights"):
            state = new_state(framework, model)
            with pytest.raises(CheckpointError) as err:
                apply_warm_start(state, warm_start(wrong, mode=mode), mutable=(), apply=state.defer)
            message = str(err.value)
            assert "\n" not in message and wrong in message
            assert "trial's checkpoint" in message and f"tunekit.integrations.{framework}" in message
    not_ours = tmp_path / "hf-checkpoint-500"
    not_ours.mkdir()
    (not_ours / "trainer_state.json").write_text("{}")
    for path, what in ((not_ours, "not a tunekit checkpoint"), (tmp_path / "missing", "no such directory")):
        with pytest.raises(CheckpointError, match=what) as err:
            warm_start(str(path), mode="continue")
        assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_the_frameworks_are_imported_only_when_used():
    code = (
        "import sys, tunekit.integrations.lightning, tunekit.integrations.transformers\n"
        "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers') if m in sys.modules))\n"
        "from tunekit.integrations._common import require\n"
        "try:\n    require('not_a_framework_pkg', extra='lightning', what='PyTorch Lightning')\n"
        "except ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        "[]",
        "tunekit.integrations.lightning needs PyTorch Lightning (not_a_framework_pkg is not installed): "
        "pip install 'tunekit[lightning]'",
    ]


def test_framework_internals_relied_on_are_there(tmp_path):
    """The internals used: Lightning's in-memory checkpoint, the HF Trainer's running sums since its last log."""
    import inspect

    import lightning.pytorch as pl

    from tests.integrations.models import hf_trainer
    from tunekit.integrations.transformers import _RUNNING

    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert "weights_only" in inspect.signature(trainer._checkpoint_connector.dump_checkpoint).parameters
    hf = hf_trainer({"learning_rate": 0.01, "epochs": 1}, str(tmp_path))
    hf.train()
    assert all(hasattr(hf, name) for name in _RUNNING)


def test_a_transformers_checkpoint_exports_as_one_the_trainer_resumes_from(ray_session, plain, tmp_path):
    from tests.integrations.models import hf_trainer
    from tunekit.integrations.transformers import to_trainer_checkpoint

    source = plain("transformers").checkpoint.path
    exported = to_trainer_checkpoint(source, str(tmp_path / "checkpoint-24"))
    trainer = hf_trainer({**CASES["transformers"][1], "epochs": 5}, str(tmp_path / "out"))
    import transformers

    steps = []

    class Count(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            steps.append(state.global_step)

    trainer.add_callback(Count())
    trainer.train(resume_from_checkpoint=exported)  # plain Hugging Face, no Tune
    # It went on from step 24 (the history of the 4 epochs before came with the checkpoint): one more epoch.
    assert steps == list(range(25, 31))
    assert [r["epoch"] for r in trainer.state.log_history if "eval_loss" in r] == [1.0, 2.0, 3.0, 4.0, 5.0]
    with pytest.raises(CheckpointError, match="a lightning checkpoint; expected one written by"):
        to_trainer_checkpoint(plain("lightning").checkpoint.path, str(tmp_path / "x"))


def test_lightning_iterations_of_n_steps(ray_session, storage):
    """every_n_steps=3 over 2 epochs of 4 steps: iterations end at steps 3 and 6, and at the end (8).

    ``epoch`` is Lightning's ``current_epoch``: the epoch in progress, 2 once both are done.
    """
    results, saved = run_actor(TrainLightning, {**CASES["lightning"][1], "epochs": 2, "every_n_steps": 3},
                               storage, "steps", 3)
    assert [(r["training_iteration"], r["step"], r["epoch"]) for r in results] == [(1, 3, 0), (2, 6, 1), (3, 8, 2)]
    assert all("train_loss" in r for r in results[1:])  # logged each epoch (on_epoch=True), so from epoch 1 on
    assert read_state(saved.checkpoint.path)["counters"]["step"] == 8


def test_pytorch_lightning_package_too(ray_session, storage, plain):
    """Code that imports ``pytorch_lightning`` (as Ray's docs do) runs the same way: its first two iterations'
    losses are those of the reference run's (``lightning.pytorch``)."""
    from tunekit.experiment.snapshot import read_experiment

    pytest.importorskip("pytorch_lightning")
    config = {**CASES["lightning"][1], "package": "pytorch_lightning"}
    results, saved = run_actor(TrainLightning, config, storage, "pl", 2)
    (reference,) = read_experiment(str(Path(plain("lightning").path).parent)).trials
    assert [r["train_loss"] for r in results] == [r["train_loss"] for r in reference.results[:2]]
    assert "optimizer_states" in read_state(saved.checkpoint.path)["extras"][KEY + "lightning"]


def test_transformers_iterations_between_two_logs_report_the_latest_loss(ray_session, storage):
    """every_n_steps=3 with logging_steps=2: each iteration reports the newest logged loss, none goes without."""
    config = {**CASES["transformers"][1], "epochs": 1, "every_n_steps": 3, "logging_steps": 2}
    results, _ = run_actor(TrainTransformers, config, storage, "misaligned", 2)
    assert [r["step"] for r in results] == [3, 6]
    assert all(isinstance(r.get("loss"), float) for r in results), results


def test_the_integrations_mutables_are_what_pbt_setup_accepts():
    """A training function that declares an integration's MUTABLE may be mutated in what that integration applies, only."""
    from ray import tune as _tune

    from tests.integrations.models import train_lightning, train_transformers
    from tunekit import function_trainable
    from tunekit.schedule.pbt import pbt_setup
    from tunekit.errors import ConfigError
    from tunekit.integrations import lightning as tk_lightning
    from tunekit.integrations import transformers as tk_transformers

    lightning_trial = function_trainable(train_lightning, mutable=tk_lightning.MUTABLE)
    hf_trial = function_trainable(train_transformers, mutable=tk_transformers.MUTABLE)
    assert lightning_trial.mutable() == tuple(tk_lightning.MUTABLE)
    assert hf_trial.mutable() == tuple(tk_transformers.MUTABLE)
    with pytest.raises(ConfigError, match=r"cannot change \['learning_rate'\] in place.*mutable=\.\.\..*"
                                          r"tunekit\.integrations\.transformers\.MUTABLE"):
        pbt_setup(function_trainable(train_transformers), metric="loss", mode="min", perturbation_interval=1,
                  mutations={"learning_rate": _tune.loguniform(1e-4, 1e-2)})  # undeclared: the default's four
    pbt_setup(hf_trial, metric="loss", mode="min", perturbation_interval=1,
              mutations={"learning_rate": _tune.loguniform(1e-4, 1e-2)})
    with pytest.raises(ConfigError, match=r"cannot change \['batch_size'\] in place.*function_trainable\("
                                          r"train_lightning, mutable=\.\.\.\)"):
        pbt_setup(lightning_trial, metric="loss", mode="min", perturbation_interval=1,
                  mutations={"batch_size": [8, 16]})
