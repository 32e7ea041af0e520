"""Lightning and Hugging Face Trainer trials: tunekit's integration against the plain Ray Tune way, same run.

    python benchmarks/integrations.py                    # both frameworks, best of 3
    python benchmarks/integrations.py --only lightning --epochs 8 --repeats 5

Each framework trains the same model on the same data for ``--epochs`` epochs
with a checkpoint every epoch, as one Tune trial, two ways:

* anchor: what Ray's docs show (seeds 000/001): a plain training function,
  the framework's own checkpoint each epoch (Lightning ``trainer.save_checkpoint``
  into a temporary directory; the HF Trainer's ``save_strategy="epoch"``)
  reported with ``tune.report(metrics, checkpoint=Checkpoint.from_directory(...))``;
* tunekit: ``tunekit.function_trainable`` + ``tunekit.integrations.*``, with
  ``CheckpointConfig(checkpoint_frequency=1)`` (complete state, RNG streams,
  manifest, two-phase save).

It prints the trial's training time (Tune's ``time_total_s``, which leaves out
the worker's start), the best of ``--repeats``, and the ratio tunekit/anchor.
The model is sized so a checkpoint is tens of MB (``--width``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


# -- Lightning --------------------------------------------------------------------------
def _lightning_parts(config: dict[str, Any]) -> tuple[Any, Any, Any]:
    import lightning.pytorch as pl
    import torch

    import tunekit

    class MLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            w = config["width"]
            self.net = torch.nn.Sequential(torch.nn.Linear(64, w), torch.nn.ReLU(), torch.nn.Linear(w, w),
                                           torch.nn.ReLU(), torch.nn.Linear(w, 10))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.log("train_loss", loss, on_step=False, on_epoch=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    tunekit.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(config["samples"], 64, generator=g),
                                          torch.randint(0, 10, (config["samples"],), generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=128, shuffle=True)
    trainer = pl.Trainer(max_epochs=config["epochs"], accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    return MLP(), loader, trainer


def lightning_anchor(config: dict[str, Any]) -> None:
    """Seed 000's custom report callback: Lightning's checkpoint file each epoch, reported to Tune."""
    import lightning.pytorch as pl
    from ray import tune

    class Report(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            metrics = {k: v.item() for k, v in trainer.callback_metrics.items()}
            with tempfile.TemporaryDirectory() as tmpdir:
                trainer.save_checkpoint(os.path.join(tmpdir, "checkpoint.ckpt"), weights_only=False)
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmpdir))

    model, loader, trainer = _lightning_parts(config)
    trainer.callbacks.append(Report())
    trainer.fit(model, train_dataloaders=loader)


def lightning_tunekit(config: dict[str, Any]) -> None:
    from tunekit.integrations import lightning as tk_lightning

    model, loader, trainer = _lightning_parts(config)
    tk_lightning.fit(trainer, model, train_dataloaders=loader, config=config)


# -- Hugging Face Trainer ----------------------------------------------------------------
def _hf_trainer(config: dict[str, Any], save_strategy: str) -> Any:
    import torch
    import transformers

    class Tokens(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.ids = torch.randint(0, 100, (config["samples"] // 8, 32), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    transformers.set_seed(0)
    width = max(64, config["width"] // 8)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=100, n_positions=32, n_embd=width,
                                                                 n_layer=4, n_head=4))
    args = transformers.TrainingArguments(
        output_dir=os.path.join(os.getcwd(), "hf"), num_train_epochs=config["epochs"], per_device_train_batch_size=16,
        logging_strategy="epoch", save_strategy=save_strategy, report_to="none", use_cpu=True, disable_tqdm=True)
    return transformers.Trainer(model=model, args=args, train_dataset=Tokens())


def transformers_anchor(config: dict[str, Any]) -> None:
    """Seed 001's custom report callback: the Trainer's own checkpoint each epoch, reported to Tune."""
    import transformers
    from ray import tune

    class Report(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.metrics: dict[str, Any] = {}

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.metrics.update(logs or {})

        def on_save(self, args, state, control, **kwargs):
            path = transformers.trainer_utils.get_last_checkpoint(args.output_dir)
            tune.report(self.metrics, checkpoint=tune.Checkpoint.from_directory(path))
            self.metrics = {}

    trainer = _hf_trainer(config, "epoch")
    trainer.add_callback(Report())
    trainer.train()


def transformers_tunekit(config: dict[str, Any]) -> None:
    from tunekit.integrations import transformers as tk_transformers

    tk_transformers.train(_hf_trainer(config, "no"), config=config)


# -- the measurement ------------------------------------------------------------------------
def _trial_seconds(trainable: Any, config: dict[str, Any], storage: str, name: str, **ckpt: Any) -> float:
    from ray import tune

    grid = tune.Tuner(trainable, param_space=config, run_config=tune.RunConfig(
        name=name, storage_path=storage, verbose=0, stop={"training_iteration": config["epochs"]},
        checkpoint_config=tune.CheckpointConfig(**ckpt))).fit()
    if grid.errors:
        raise SystemExit(f"{name}: {grid.errors[0]}")
    return float(grid[0].metrics["time_total_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="lightning,transformers")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--width", type=int, default=1536, help="MLP width (GPT-2 width is width/8)")
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import ray

    import tunekit

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    config = {"epochs": args.epochs, "width": args.width, "samples": args.samples}
    cases = {"lightning": (lightning_anchor, lightning_tunekit), "transformers": (transformers_anchor,
                                                                               transformers_tunekit)}
    for framework in args.only.split(","):
        anchor_fn, tunekit_fn = cases[framework]
        times: dict[str, list[float]] = {"anchor": [], "tunekit": []}
        for repeat in range(args.repeats):
            with tempfile.TemporaryDirectory() as storage:
                times["anchor"].append(_trial_seconds(anchor_fn, config, storage, f"a{repeat}"))
                times["tunekit"].append(_trial_seconds(tunekit.function_trainable(tunekit_fn), config, storage,
                                                       f"t{repeat}", checkpoint_frequency=1))
        a, t = min(times["anchor"]), min(times["tunekit"])
        print(f"{framework}: {args.epochs} epochs, a checkpoint each; anchor {a:.2f} s, tunekit {t:.2f} s "
              f"(best of {args.repeats}; all: anchor {['%.2f' % x for x in times['anchor']]}, "
              f"tunekit {['%.2f' % x for x in times['tunekit']]}) -> {t / a:.2f}x")
    ray.shutdown()


if __name__ == "__main__":
    main()
