"""Tiny models trained through the framework integrations (data generated here; nothing is downloaded)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

import tunekit
from tunekit.integrations import lightning as tk_lightning


DONE = 10**6


def pace(config: dict[str, Any], epoch: int) -> None:
    """Keep a PBT test's two trials in step: the follower starts epoch e once the leader started e + 1.

    The leader has then reported epoch e (and, scored above the follower, been checkpointed), so when
    the follower reports epoch e, a donor that is not behind it is there to clone. The leader starts
    once the follower is up, so they overlap.
    """
    folder = config.get("pace_dir")
    if not folder:
        return
    me, other = ("leader", "follower") if config.get("leader") else ("follower", "leader")
    Path(folder, me).write_text(str(epoch))
    if me == "leader" and epoch > 0:
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if int(Path(folder, other).read_text() or -1) > (-1 if me == "leader" else epoch):
                return
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.02)


def regression_data(n: int, seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def lightning_module(config: dict[str, Any], package: str = "lightning.pytorch") -> Any:
    import importlib

    pl = importlib.import_module(package)

    class Regressor(pl.LightningModule):
        """An MLP with dropout (draws random numbers), SGD with momentum and a step schedule."""

        def __init__(self, lr: float, momentum: float) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                           torch.nn.Linear(16, 1))

        def on_train_epoch_start(self):
            pace(config, self.current_epoch)

        def on_train_end(self):
            pace(config, DONE)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, on_step=False, on_epoch=True)
            self.log("lr_in_effect", self.optimizers().param_groups[0]["lr"], on_step=False, on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=config.get("gamma", 0.5))
            return [opt], [sched]

    return Regressor(config["lr"], config.get("momentum", 0.9))


def train_lightning(config: dict[str, Any]) -> None:
    """A Lightning run as users write it, with tunekit's fit in place of trainer.fit."""
    import importlib

    package = config.get("package", "lightning.pytorch")  # or "pytorch_lightning", as Ray's docs import it
    pl = importlib.import_module(package)
    tunekit.seed_everything(config.get("seed", 0))
    model = lightning_module(config, package)
    train = torch.utils.data.DataLoader(regression_data(config.get("samples", 64), 1), batch_size=16, shuffle=True)
    val = torch.utils.data.DataLoader(regression_data(32, 2), batch_size=32)
    trainer = pl.Trainer(max_epochs=config.get("epochs", 5), accelerator=config.get("accelerator", "cpu"), devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    tk_lightning.fit(trainer, model, train_dataloaders=train, val_dataloaders=val, config=config,
                     every_n_steps=config.get("every_n_steps"))


TrainLightning = tunekit.function_trainable(train_lightning, name="TrainLightning", mutable=tk_lightning.MUTABLE)


class TokenData(torch.utils.data.Dataset):
    """Random token sequences: a language-modelling task for a tiny GPT-2."""

    def __init__(self, n: int, seed: int, length: int = 12, vocab: int = 40) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def hf_trainer(config: dict[str, Any], output_dir: str) -> Any:
    import transformers

    transformers.set_seed(config.get("seed", 0))
    # On a GPU, eager attention: SDPA's memory-efficient backward is nondeterministic there (two clean runs
    # would differ), and the test is of what tunekit restores, not of the kernels.
    eager = {"attn_implementation": "eager"} if config.get("accelerator") == "gpu" else {}
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=2, **eager))
    args = transformers.TrainingArguments(
        output_dir=output_dir, num_train_epochs=config.get("epochs", 5), learning_rate=config["learning_rate"],
        lr_scheduler_type=config.get("schedule", "linear"), per_device_train_batch_size=8,
        per_device_eval_batch_size=16, eval_strategy="epoch", save_strategy="no",
        logging_strategy="steps" if "logging_steps" in config else "epoch", logging_steps=config.get("logging_steps", 500),
        report_to="none", seed=config.get("seed", 0), use_cpu=config.get("accelerator", "cpu") == "cpu",
        disable_tqdm=True, dataloader_num_workers=0,
    )
    class Pace(transformers.TrainerCallback):
        def on_epoch_begin(self, args, state, control, **kwargs):
            pace(config, round(state.epoch))

        def on_train_end(self, args, state, control, **kwargs):
            pace(config, DONE)

    return transformers.Trainer(model=model, args=args, train_dataset=TokenData(48, 1),
                                eval_dataset=TokenData(16, 2), callbacks=[Pace()])


def train_transformers(config: dict[str, Any]) -> None:
    from tunekit.integrations import transformers as tk_transformers

    trainer = hf_trainer(config, os.path.join(os.getcwd(), "hf"))
    tk_transformers.train(trainer, config=config, every_n_steps=config.get("every_n_steps"))


def _transformers_trainable() -> Any:
    from tunekit.integrations.transformers import MUTABLE

    return tunekit.function_trainable(train_transformers, name="TrainTransformers", mutable=MUTABLE)


TrainTransformers = _transformers_trainable()
