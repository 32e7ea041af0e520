"""Write the example notebooks (source of truth for their cells): `python notebooks/build_notebooks.py`."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent


def _params(source: str):
    cell = new_code_cell(source)
    cell.metadata["tags"] = ["parameters"]
    return cell


QUICKSTART = [
    new_markdown_cell(
        "# tunekit quickstart\n\n"
        "Run a small Population Based Training sweep of `tunekit.trainables.DigitsTrainable` (an MLP on "
        "scikit-learn's 8x8 digits) on a local Ray, then analyse it with `tunekit.analysis`: all "
        "results in one DataFrame, the best trial, the best checkpoint loaded for inference, and "
        "learning curves."
    ),
    _params("# Parameters (the test suite runs this notebook with smaller ones)\nNUM_SAMPLES = 4\nMAX_ITERATIONS = 12\nSTORAGE = None  # None: a temporary directory"),
    new_code_cell(
        "import tempfile\n\n"
        "import ray\n"
        "from tunekit.trainables.quickstart import run_quickstart\n\n"
        "storage = STORAGE or tempfile.mkdtemp(prefix='tunekit-nb-')\n"
        "ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)\n"
        "summary = run_quickstart(num_samples=NUM_SAMPLES, max_iterations=MAX_ITERATIONS,\n"
        "                         storage_path=storage, name='quickstart_nb')\n"
        "experiment = summary.experiment_path"
    ),
    new_markdown_cell("## Every result of every trial, each iteration once"),
    new_code_cell(
        "from tunekit.analysis import load_results\n\n"
        "df = load_results(experiment)\n"
        "df[['trial_id', 'training_iteration', 'accuracy', 'loss', 'config/lr', 'config/momentum']].head(10)"
    ),
    new_markdown_cell("## The best trial and its best checkpoint, loaded for inference"),
    new_code_cell(
        "import torch\n"
        "from tunekit.trainables.digits import digits_model, evaluate\n"
        "from tunekit.analysis import best_trial, load_best_model\n\n"
        "best = best_trial(experiment, metric='accuracy', mode='max', scope='max')\n"
        "model = load_best_model(experiment, digits_model(64), metric='accuracy', mode='max', scope='max')\n"
        "with torch.no_grad():\n"
        "    print(best.trial_id, best.checkpoint)\n"
        "    print('validation accuracy of the loaded model:', evaluate(model, torch.device('cpu'))['accuracy'])"
    ),
    new_markdown_cell("## Learning curves"),
    new_code_cell(
        "%matplotlib inline\n"
        "import matplotlib.pyplot as plt\n\n"
        "fig, ax = plt.subplots(figsize=(7, 4))\n"
        "for trial_id, rows in df.groupby('trial_id'):\n"
        "    ax.plot(rows['training_iteration'], rows['accuracy'], label=trial_id)\n"
        "ax.set_xlabel('training_iteration'); ax.set_ylabel('accuracy'); ax.legend(fontsize=7)\n"
        "plt.show()"
    ),
    new_code_cell("ray.shutdown()"),
]

PBT = [
    new_markdown_cell(
        "# PBT lineage and hyperparameter schedules\n\n"
        "A synchronous PBT run of `tunekit.trainables.DigitsTrainable` with `tunekit.callbacks.ParquetLogger`, then "
        "`tunekit.analysis.pbt_lineage`: every exploit (who copied whom, at which iteration, old and "
        "new config), the ancestry of each trial's final weights, and each trial's `lr` schedule. "
        "Last, `tunekit report` writes the HTML report of the run."
    ),
    _params("# Parameters (the test suite runs this notebook with smaller ones)\nNUM_SAMPLES = 4\nMAX_ITERATIONS = 12\nINTERVAL = 3"),
    new_code_cell(
        "import tempfile\n\n"
        "import ray\n"
        "from ray import tune\n"
        "from ray.tune.schedulers import PopulationBasedTraining\n\n"
        "from tunekit.callbacks import ParquetLogger\n"
        "from tunekit.trainables import DigitsTrainable\n\n"
        "storage = tempfile.mkdtemp(prefix='tunekit-nb-')\n"
        "ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)\n"
        "pbt = PopulationBasedTraining(time_attr='training_iteration', perturbation_interval=INTERVAL,\n"
        "                              quantile_fraction=0.5, synch=True,\n"
        "                              hyperparam_mutations={'lr': tune.loguniform(1e-3, 0.5)})\n"
        "grid = tune.Tuner(\n"
        "    DigitsTrainable,\n"
        "    param_space={'hidden_size': 32, 'seed': 0, 'lr': tune.loguniform(1e-3, 0.5)},\n"
        "    tune_config=tune.TuneConfig(metric='accuracy', mode='max', scheduler=pbt,\n"
        "                                num_samples=NUM_SAMPLES, reuse_actors=True),\n"
        "    run_config=tune.RunConfig(name='pbt_nb', storage_path=storage,\n"
        "                              stop={'training_iteration': MAX_ITERATIONS},\n"
        "                              callbacks=[ParquetLogger()], verbose=0),\n"
        ").fit()\n"
        "experiment = f'{storage}/pbt_nb'"
    ),
    new_markdown_cell("## Every exploit"),
    new_code_cell(
        "from tunekit.analysis import load_results, pbt_lineage\n\n"
        "df = load_results(experiment)\n"
        "lineage = pbt_lineage(experiment, results=df)\n"
        "lineage.exploits"
    ),
    new_markdown_cell("## Where each trial's final weights came from"),
    new_code_cell("for trial_id in sorted(lineage.ancestry):\n    print(trial_id, ':', lineage.describe(trial_id))"),
    new_markdown_cell("## Hyperparameter schedules"),
    new_code_cell(
        "%matplotlib inline\n"
        "import matplotlib.pyplot as plt\n\n"
        "fig, ax = plt.subplots(figsize=(7, 3.5))\n"
        "for trial_id, rows in df.groupby('trial_id'):\n"
        "    ax.step(rows['training_iteration'], rows['config/lr'], where='post', label=trial_id)\n"
        "ax.set_yscale('log'); ax.set_xlabel('training_iteration'); ax.set_ylabel('lr'); ax.legend(fontsize=7)\n"
        "plt.show()"
    ),
    new_markdown_cell("## The HTML report"),
    new_code_cell(
        "from tunekit.report import write_report\n\n"
        "report = write_report(experiment, metric='accuracy', mode='max')\n"
        "print(report.html)\n"
        "ray.shutdown()"
    ),
]


LIGHTNING = [
    new_markdown_cell(
        "# PyTorch Lightning sweeps with complete checkpoints\n\n"
        "A `LightningModule` on scikit-learn's bundled 8x8 digits, trained by a Lightning `Trainer` in each "
        "trial, with `tunekit.integrations.lightning.fit` in place of `trainer.fit`: every checkpoint holds "
        "Lightning's whole training state and every RNG stream, so PBT's exploits, retries and warm starts "
        "continue bit-exactly. Then: results, `tunekit verify`, the best weights loaded for inference, and a "
        "warm start that continues the best trial for two more epochs."
    ),
    _params("# Parameters (the test suite runs this notebook with smaller ones)\nNUM_SAMPLES = 4\nEPOCHS = 8"),
    new_code_cell(
        "import tempfile\n\n"
        "import lightning.pytorch as pl\n"
        "import ray\n"
        "import torch\n"
        "from ray import tune\n"
        "from sklearn.datasets import load_digits\n\n"
        "import tunekit\n"
        "from tunekit.integrations import lightning as tk_lightning\n"
        "from tunekit.pbt import pbt_setup\n\n\n"
        "class Digits(pl.LightningModule):\n"
        "    def __init__(self, lr=0.05, hidden=64):\n"
        "        super().__init__()\n"
        "        self.save_hyperparameters()\n"
        "        self.net = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),\n"
        "                                       torch.nn.Dropout(0.1), torch.nn.Linear(hidden, 10))\n\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        x, y = batch\n"
        "        loss = torch.nn.functional.cross_entropy(self.net(x), y)\n"
        "        self.log('train_loss', loss, on_step=False, on_epoch=True)\n"
        "        return loss\n\n"
        "    def validation_step(self, batch, batch_idx):\n"
        "        x, y = batch\n"
        "        self.log('val_accuracy', (self.net(x).argmax(1) == y).float().mean())\n\n"
        "    def configure_optimizers(self):\n"
        "        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)\n"
        "        return [opt], [torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)]\n\n\n"
        "def loaders(batch_size=64):\n"
        "    x, y = load_digits(return_X_y=True)\n"
        "    data = torch.utils.data.TensorDataset(torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y))\n"
        "    train, val = torch.utils.data.random_split(data, [1400, 397], generator=torch.Generator().manual_seed(0))\n"
        "    return (torch.utils.data.DataLoader(train, batch_size=batch_size, shuffle=True),\n"
        "            torch.utils.data.DataLoader(val, batch_size=512))\n\n\n"
        "def train(config):\n"
        "    tunekit.seed_everything(config['seed'])\n"
        "    model = Digits(lr=config['lr'])\n"
        "    train_loader, val_loader = loaders()\n"
        "    trainer = pl.Trainer(max_epochs=config['epochs'], accelerator='cpu', logger=False,\n"
        "                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)\n"
        "    tk_lightning.fit(trainer, model, train_dataloaders=train_loader, val_dataloaders=val_loader, config=config)"
    ),
    new_markdown_cell("## A PBT sweep over the learning rate"),
    new_code_cell(
        "storage = tempfile.mkdtemp(prefix='tunekit-nb-')\n"
        "ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)\n"
        "trainable = tunekit.function_trainable(train)\n"
        "setup = pbt_setup(trainable, metric='val_accuracy', mode='max', perturbation_interval=2,\n"
        "                  mutations={'lr': tune.loguniform(1e-3, 0.3)}, quantile_fraction=0.5)\n"
        "grid = tune.Tuner(\n"
        "    trainable,\n"
        "    param_space={'lr': tune.loguniform(1e-3, 0.3), 'seed': 0, 'epochs': EPOCHS},\n"
        "    tune_config=tune.TuneConfig(num_samples=NUM_SAMPLES, **setup.tune_config_kwargs()),\n"
        "    run_config=tune.RunConfig(name='lightning_nb', storage_path=storage, checkpoint_config=setup.checkpoint_config,\n"
        "                              stop={'training_iteration': EPOCHS}, verbose=0),\n"
        ").fit()\n"
        "experiment = f'{storage}/lightning_nb'\n"
        "grid.get_dataframe()[['trial_id', 'training_iteration', 'epoch', 'train_loss', 'val_accuracy', 'config/lr']]"
    ),
    new_markdown_cell("## Every checkpoint verified; the best weights loaded for inference"),
    new_code_cell(
        "from tunekit import load_model, verify_experiment\n\n"
        "print(verify_experiment(experiment).summary())\n"
        "best = grid.get_best_result(metric='val_accuracy', mode='max')\n"
        "model = load_model(best.checkpoint, Digits())\n"
        "x, y = next(iter(loaders()[1]))\n"
        "with torch.no_grad():\n"
        "    print('accuracy of the loaded model:', (model.net(x).argmax(1) == y).float().mean().item())"
    ),
    new_markdown_cell(
        "## Continue the best trial for two more epochs\n\n"
        "`tunekit.warm_start(checkpoint, mode='continue')` in the config: the trial goes on from the "
        "checkpoint's epoch with Lightning's optimizer, scheduler and loop state and the RNG streams, "
        "exactly as one longer run would."
    ),
    new_code_cell(
        "more = tune.Tuner(\n"
        "    trainable,\n"
        "    param_space={**best.config, 'epochs': EPOCHS + 2, **tunekit.warm_start(best.checkpoint, mode='continue')},\n"
        "    run_config=tune.RunConfig(name='lightning_more', storage_path=storage, verbose=0,\n"
        "                              checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True)),\n"
        ").fit()[0]\n"
        "print('continued:', list(more.metrics_dataframe['training_iteration']), 'val_accuracy', more.metrics['val_accuracy'])\n"
        "ray.shutdown()"
    ),
]

TRANSFORMERS = [
    new_markdown_cell(
        "# Hugging Face Trainer sweeps with complete checkpoints\n\n"
        "A tiny BERT built from a config (nothing is downloaded) learns a made-up sequence task with a "
        "`transformers.Trainer` in each trial; `tunekit.integrations.transformers.train` replaces "
        "`trainer.train()`, so each checkpoint holds the Trainer's whole state (weights, optimizer, scheduler, "
        "`trainer_state.json`) and every RNG stream, and a trial resumes bit-exactly. Then: results, "
        "`tunekit verify`, and the best checkpoint written out as a Trainer checkpoint directory."
    ),
    _params("# Parameters (the test suite runs this notebook with smaller ones)\nLEARNING_RATES = [3e-4, 1e-3, 3e-3]\nEPOCHS = 4"),
    new_code_cell(
        "import os\n"
        "import tempfile\n\n"
        "import ray\n"
        "import torch\n"
        "import transformers\n"
        "from ray import tune\n\n"
        "import tunekit\n"
        "from tunekit.integrations import transformers as tk_transformers\n\n\n"
        "class Sequences(torch.utils.data.Dataset):\n"
        "    \"\"\"Random token sequences; the label says whether token 7 occurs in them.\"\"\"\n\n"
        "    def __init__(self, n, seed):\n"
        "        self.ids = torch.randint(1, 30, (n, 16), generator=torch.Generator().manual_seed(seed))\n"
        "        self.labels = (self.ids == 7).any(1).long()\n\n"
        "    def __len__(self):\n"
        "        return len(self.ids)\n\n"
        "    def __getitem__(self, i):\n"
        "        return {'input_ids': self.ids[i], 'labels': self.labels[i]}\n\n\n"
        "def accuracy(prediction):\n"
        "    return {'accuracy': float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}\n\n\n"
        "def train(config):\n"
        "    transformers.set_seed(config['seed'])\n"
        "    model = transformers.BertForSequenceClassification(transformers.BertConfig(\n"
        "        vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,\n"
        "        max_position_embeddings=16, num_labels=2))\n"
        "    args = transformers.TrainingArguments(\n"
        "        output_dir=os.path.join(os.getcwd(), 'hf'), learning_rate=config['lr'], num_train_epochs=config['epochs'],\n"
        "        per_device_train_batch_size=32, eval_strategy='epoch', logging_strategy='epoch', save_strategy='no',\n"
        "        report_to='none', seed=config['seed'], use_cpu=True, disable_tqdm=True)\n"
        "    trainer = transformers.Trainer(model=model, args=args, train_dataset=Sequences(512, 0),\n"
        "                                   eval_dataset=Sequences(256, 1), compute_metrics=accuracy)\n"
        "    tk_transformers.train(trainer, config=config)"
    ),
    new_markdown_cell("## A sweep over the learning rate, one checkpoint per epoch"),
    new_code_cell(
        "storage = tempfile.mkdtemp(prefix='tunekit-nb-')\n"
        "ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)\n"
        "grid = tune.Tuner(\n"
        "    tunekit.function_trainable(train),\n"
        "    param_space={'lr': tune.grid_search(LEARNING_RATES), 'seed': 0, 'epochs': EPOCHS},\n"
        "    run_config=tune.RunConfig(name='transformers_nb', storage_path=storage, verbose=0,\n"
        "                              checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1, num_to_keep=2)),\n"
        ").fit()\n"
        "experiment = f'{storage}/transformers_nb'\n"
        "grid.get_dataframe()[['trial_id', 'training_iteration', 'loss', 'eval_loss', 'eval_accuracy', 'config/lr']]"
    ),
    new_markdown_cell("## Every checkpoint verified; the best one as a Trainer checkpoint directory"),
    new_code_cell(
        "from tunekit import verify_experiment\n\n"
        "print(verify_experiment(experiment).summary())\n"
        "best = grid.get_best_result(metric='eval_accuracy', mode='max')\n"
        "exported = tk_transformers.to_trainer_checkpoint(best.checkpoint, os.path.join(storage, 'best-trainer-checkpoint'))\n"
        "print('best lr:', best.config['lr'], 'eval_accuracy:', best.metrics['eval_accuracy'])\n"
        "print('trainer checkpoint files:', sorted(os.listdir(exported)))\n"
        "ray.shutdown()"
    ),
]


def build() -> None:
    for name, cells in (("quickstart.ipynb", QUICKSTART), ("pbt_analysis.ipynb", PBT),
                        ("lightning.ipynb", LIGHTNING), ("transformers.ipynb", TRANSFORMERS)):
        nb = new_notebook(cells=cells)
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, HERE / name)


if __name__ == "__main__":
    build()
