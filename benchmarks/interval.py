"""The checkpoint interval under real failures: fixed intervals against CheckpointAutopilot.

One trial with a known iteration time (``--iter-s`` of sleep: the training) and a real checkpoint cost
(``--mb`` of weights written by ``save()``, background saves off, so what the save costs is what training
waits) runs ``--work`` iterations while the failure injector (``tunekit.testing``) SIGKILLs its
worker at random, at exponential intervals of mean M, for real, on a shortened time scale
(``FailureConfig(max_failures=-1)``). Policies: a checkpoint every 1, 10 and 50 iterations
(``CheckpointConfig(checkpoint_frequency=k)``), ``CheckpointAutopilot`` with its defaults (no prior: it
learns M from the kills; checkpoints within 5% of training time) and ``daly``: the autopilot with
``max_overhead=None`` (no checkpoint until the first failure is seen, then Daly's interval alone). Three regimes of M (``--regimes``, seconds). For each run: the wall time to finish, the work lost
(iterations run again after a kill), the kills, and Daly's expected runtime for that interval
(:func:`tunekit.schedule.interval.expected_runtime`, with C measured in the run, the restart cost R and Tune's
fixed start-and-end cost given: ``--restart-s``, ``--fixed-s``).

    python benchmarks/interval.py --regimes 4,15,60 --work 150 --iter-s 0.2 --mb 16 --policies 1,10,50,autopilot --seed S

(the figures at the head of ``benchmarks/README.md``: 0.2 s iterations and ~0.02 s saves put Daly's optimum
at 2 to 8 iterations over the three regimes, between the fixed 1 and 10; with 0.1 s iterations and 40 MB,
the earlier configuration, "every 10" sits within a few percent of the optimum in all three.) Each seed is
one schedule of kill times for every policy of a regime (a kill that finds no worker, one restarting, is
skipped).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from tunekit import TorchTrainable, TrainingState  # noqa: E402
from tunekit._keys import SAVE_BLOCKED_KEY
from tunekit.schedule.interval import expected_runtime  # noqa: E402


class Steady(TorchTrainable):
    """``iter_s`` of training per iteration; a checkpoint of ``width``x1024 floats, written by ``save()``."""

    background_saves = False

    def build(self, config: dict[str, Any]) -> TrainingState:
        return TrainingState(models={"model": torch.nn.Linear(1024, config["width"], bias=False)})

    def train_iteration(self) -> dict[str, Any]:
        time.sleep(self.config["iter_s"])
        counter = Path(self.config["dir"]) / "executed"
        temp = counter.with_suffix(f".{os.getpid()}")  # atomic: a kill never leaves the counter torn
        temp.write_text(str(int(counter.read_text()) + 1 if counter.exists() else 1))
        os.replace(temp, counter)
        return {"loss": 0.0}


def _run(policy: str, mtbf: float, args: argparse.Namespace, seed: int) -> dict[str, float]:
    from ray import tune

    from tunekit.testing import Injector
    from tunekit.callbacks import CheckpointAutopilot

    with tempfile.TemporaryDirectory() as storage:
        callbacks: list[Any] = []
        checkpoint = tune.CheckpointConfig(num_to_keep=2)
        if policy == "autopilot":  # the defaults: no prior, checkpoints within 5% of training time
            callbacks.append(CheckpointAutopilot(max_interval_s=args.work * args.iter_s))
        elif policy == "daly":  # no overhead bound: Daly's interval alone once a failure was seen
            callbacks.append(CheckpointAutopilot(max_overhead=None, max_interval_s=args.work * args.iter_s))
        else:
            checkpoint = tune.CheckpointConfig(num_to_keep=2, checkpoint_frequency=int(policy))
        injector = Injector(storage, writes=0.0, mean_interval_s=mtbf, max_kills=10_000, seed=seed, trainable="Steady")
        start = time.monotonic()
        with injector:
            grid = tune.Tuner(
                Steady,
                param_space={"iter_s": args.iter_s, "width": int(args.mb * 1e6 / 4 / 1024), "dir": storage},
                run_config=tune.RunConfig(name="interval", storage_path=storage, callbacks=callbacks, verbose=0,
                                          stop={"training_iteration": args.work}, checkpoint_config=checkpoint,
                                          failure_config=tune.FailureConfig(max_failures=-1)),
            ).fit()
        wall = time.monotonic() - start
        executed = int((Path(storage) / "executed").read_text())
        df = grid[0].metrics_dataframe
        cost = float(df[SAVE_BLOCKED_KEY].dropna().mean()) if SAVE_BLOCKED_KEY in df else 0.0
        interval = float(df["tunekit/checkpoint_interval_s"].dropna().iloc[-1]) if not policy.isdigit() else \
            int(policy) * args.iter_s
    kills = len(injector.kills)
    work_s = args.work * args.iter_s
    return {"wall": wall, "lost": executed - args.work, "kills": kills, "cost": cost, "interval": interval,
            "work_s": work_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regimes", default="4,15,60", help="mean seconds between kills, comma-separated")
    parser.add_argument("--policies", default="1,10,50,autopilot,daly")
    parser.add_argument("--work", type=int, default=300, help="iterations to finish")
    parser.add_argument("--iter-s", type=float, default=0.1)
    parser.add_argument("--mb", type=float, default=40.0, help="MB of weights in each checkpoint")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--restart-s", type=float, default=2.0, help="the model's restart cost R (a new worker)")
    parser.add_argument("--fixed-s", type=float, default=8.0, help="the model's fixed cost (Tune's start and end)")
    args = parser.parse_args(argv)
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    print(f"interval: {args.work} iterations of {args.iter_s} s ({args.work * args.iter_s:.0f} s of work), "
          f"{args.mb:.0f} MB checkpoints; worker SIGKILLed at exponential intervals of mean M", flush=True)
    table = {}
    for mtbf in [float(m) for m in args.regimes.split(",")]:
        runs = {p: _run(p, mtbf, args, args.seed) for p in args.policies.split(",")}
        for policy, r in runs.items():
            model = expected_runtime(r["work_s"], r["interval"], r["cost"], mtbf, args.restart_s) + args.fixed_s
            print(f"M={mtbf:>5.0f} s  {policy:>9}: T={r['interval']:6.2f} s  wall {r['wall']:6.1f} s  "
                  f"(model {model:6.1f} s)  lost {r['lost']:4d} it  kills {r['kills']:3d}  C={r['cost']:.3f} s",
                  flush=True)
        table[mtbf] = {p: r["wall"] for p, r in runs.items()}
    print("\nwall time / best fixed interval (hindsight), per regime")
    fixed = [p for p in args.policies.split(",") if p.isdigit()]
    means = {p: 0.0 for p in args.policies.split(",")}
    for mtbf, walls in table.items():
        best = min(walls[p] for p in fixed)
        print(f"M={mtbf:>5.0f} s  " + "  ".join(f"{p}: {walls[p] / best:.2f}x" for p in walls))
        for p in walls:
            means[p] += walls[p] / best / len(table)
    print("mean     " + "  ".join(f"{p}: {v:.2f}x" for p, v in means.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
