"""Benchmark: tunekit.analysis._load.load_results against Ray's own loaders.

Generates an experiment of TRIALS x ITERATIONS in Ray Tune's layout (a real
Tune run of two trials is the template; its trial state is replicated with
Ray's own Trial API so Ray's loaders accept every trial), plus the Parquet
dataset ParquetLogger writes (1,000-row batches), then times, in the same run:

* Ray:     ExperimentAnalysis(EXP).trial_dataframes
* Ray:     Tuner.restore(EXP, trainable).get_results() + each result's metrics_dataframe
* tunekit: load_results(EXP) from Parquet, and from result.json (source="json")

round by round (each of ours against Ray's run of the same round), with Ray shut down once the
experiment is generated (the readers run as after a sweep; none needs Ray), and prints the ratios. Usage::

    python benchmarks/load_results.py                      # 1000 x 200
    python benchmarks/load_results.py --trials 100 --iterations 50
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "0")


def trainable(config):  # the template experiment's trainable (also what Tuner.restore gets)
    from ray import tune

    for i in range(2):
        tune.report({"loss": 1.0 / (i + 1), "accuracy": i / 2})


def _template(root: Path) -> Path:
    from ray import tune

    tune.Tuner(
        trainable, param_space={"lr": tune.grid_search([0.1, 0.2])},
        run_config=tune.RunConfig(name="bench", storage_path=str(root), verbose=0),
    ).fit()
    return root / "bench"


def generate(root: Path, trials: int, iterations: int) -> Path:
    """Write the experiment; returns its directory."""
    import pyarrow.parquet as pq
    from ray.tune.experiment.trial import Trial

    from tunekit.table import RESULTS_DIR, flatten_result, rows_to_table

    exp = _template(root)
    state_file = sorted(exp.glob("experiment_state-*.json"))[-1]
    state = json.loads(state_file.read_text())
    template_json, runtime_json = state["trial_data"][0]
    template = Trial.from_json_state(template_json, stub=True)
    for d in exp.iterdir():
        if d.is_dir():
            shutil.rmtree(d)
    rng = random.Random(0)
    trial_data, buffer, part = [], [], 0
    (exp / RESULTS_DIR).mkdir()
    for t in range(trials):
        trial_id = f"bench_{t:05d}"
        name = f"trainable_{trial_id}_{t}_lr={t / trials:.4f}"
        config = {"lr": t / trials, "width": rng.choice([32, 64, 128])}
        trial = copy.deepcopy(template)
        trial.trial_id, trial.relative_logdir, trial.config = trial_id, name, config
        storage = copy.copy(trial.storage)
        storage.trial_dir_name = name
        trial.storage = storage
        trial._state_json = None
        trial_data.append([trial.get_json_state()[0], runtime_json])
        rows = []
        for i in range(1, iterations + 1):
            rows.append({
                "loss": rng.random(), "accuracy": rng.random(), "lr_now": config["lr"] * 0.99 ** i,
                "timestamp": 1_700_000_000 + i, "done": i == iterations, "training_iteration": i,
                "trial_id": trial_id, "date": "2026-11-22_00-00-00", "time_this_iter_s": 0.01,
                "time_total_s": 0.01 * i, "pid": 1, "hostname": "bench", "node_ip": "127.0.0.1",
                "config": config, "time_since_restore": 0.01 * i, "iterations_since_restore": i,
            })
        d = exp / name
        d.mkdir()
        (d / "params.json").write_text(json.dumps(config))
        (d / "result.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
        import pandas as pd

        pd.DataFrame([flatten_result(r) for r in rows]).to_csv(d / "progress.csv", index=False)
        for r in rows:
            buffer.append(flatten_result(r))
            if len(buffer) == 1000:
                pq.write_table(rows_to_table(buffer), exp / RESULTS_DIR / f"part-bench-{part:06d}.parquet")
                buffer, part = [], part + 1
    if buffer:
        pq.write_table(rows_to_table(buffer), exp / RESULTS_DIR / f"part-bench-{part:06d}.parquet")
    state["trial_data"] = trial_data
    state_file.write_text(json.dumps(state))
    return exp


def _compact(exp: Path) -> None:
    """What ParquetLogger does when the experiment ends: one file instead of the batches."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tunekit.analysis._result_frames import by_trial
    from tunekit.table import RESULTS_DIR

    parts = sorted((exp / RESULTS_DIR).glob("part-bench-0*.parquet"))
    if parts:
        merged = by_trial(pa.concat_tables([pq.read_table(p) for p in parts], promote_options="permissive"))
        pq.write_table(merged, exp / RESULTS_DIR / "part-bench-all.parquet")
        for p in parts:
            p.unlink()


def _time(fn, repeat: int) -> tuple[list[float], object]:
    import gc

    runs, value = [], None
    for _ in range(repeat):
        value = None
        gc.collect()  # (not timed) the reader before it leaves no garbage for this one to collect: for every reader
        t0 = time.perf_counter()
        value = fn()
        runs.append(time.perf_counter() - t0)
    return runs, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3, help="time each reader N times; every run is shown")
    parser.add_argument("--keep", default=None, help="generate into this directory and keep it")
    args = parser.parse_args(argv)

    import ray
    from ray import tune
    from ray.tune import ExperimentAnalysis

    from tunekit.analysis import load_results

    root = Path(args.keep or tempfile.mkdtemp(prefix="tunekit-bench-"))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        t0 = time.perf_counter()
        exp = generate(root, args.trials, args.iterations)
        compacted = root / "bench-compacted"
        shutil.copytree(exp, compacted)
        _compact(compacted)  # as ParquetLogger leaves it at the end of a run (not timed)
        print(f"generated {args.trials} trials x {args.iterations} iterations in {time.perf_counter() - t0:.1f}s: {exp}", flush=True)
        ray.shutdown()  # the readers run as after a sweep: no Ray beside them (none of them needs one)
        rows = args.trials * args.iterations

        def ray_analysis():
            return ExperimentAnalysis(str(exp)).trial_dataframes

        def ray_restore():
            grid = tune.Tuner.restore(str(exp), trainable).get_results()
            return [r.metrics_dataframe for r in grid]

        readers = [
            ("tunekit load_results (Parquet, 1000-row batches)", lambda: load_results(str(exp))),
            ("tunekit load_results (Parquet, compacted)", lambda: load_results(str(compacted))),
            ("tunekit load_results (result.json)", lambda: load_results(str(exp), source="json")),
            ("Ray ExperimentAnalysis.trial_dataframes", ray_analysis),
            ("Ray Tuner.restore().get_results() metrics_dataframe", ray_restore),
        ]
        for _, fn in readers:  # a warm-up round, not timed (imports, the page cache)
            fn()
        timings: dict[str, list[float]] = {label: [] for label, _ in readers}
        for _ in range(args.repeat):  # round by round: each of ours against Ray's of the same round
            for label, fn in readers:
                runs, value = _time(fn, 1)
                timings[label] += runs
                n = len(value) if label.startswith("tunekit") else sum(
                    len(df) for df in (value.values() if isinstance(value, dict) else value))
                if label.startswith("tunekit"):
                    assert n == rows, f"{label}: {n} rows, expected {rows}"
        for label, runs in timings.items():
            print(f"{label:55s} {min(runs):8.3f}s best; runs {', '.join(f'{r:.3f}' for r in runs)}", flush=True)
        print()
        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, ray {ray.__version__}")
        for ray_label in ("Ray ExperimentAnalysis.trial_dataframes", "Ray Tuner.restore().get_results() metrics_dataframe"):
            for ours, target in (
                ("tunekit load_results (Parquet, compacted)", 20),
                ("tunekit load_results (Parquet, 1000-row batches)", 20),
                ("tunekit load_results (result.json)", 3),
            ):
                each = ", ".join(f"{a / r:.1f}x" for a, r in zip(timings[ray_label], timings[ours]))
                print(f"ratio {ray_label} / {ours[len('tunekit load_results '):]}, round by round: {each}  "
                      f"(target >= {target}x)")
    finally:
        ray.shutdown()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
