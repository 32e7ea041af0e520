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


def build() -> None:
    for name, cells in (("quickstart.ipynb", QUICKSTART), ("pbt_analysis.ipynb", PBT)):
        nb = new_notebook(cells=cells)
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, HERE / name)


if __name__ == "__main__":
    build()
