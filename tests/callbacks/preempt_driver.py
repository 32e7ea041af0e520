"""A real Tune driver for the preemption test: `start STORAGE` or `resume STORAGE`."""

from __future__ import annotations

import sys

import ray
from ray import tune

from tests.callbacks.scripted import ScriptedTrainable
from tunekit.callbacks import CheckpointOnPreemption

STOP = 60
NAME = "preempt"


def main(mode: str, storage: str) -> int:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    if mode == "start":
        tuner = tune.Tuner(
            ScriptedTrainable,
            param_space={"scores": [1.0], "sleep": 0.25, "seed": tune.grid_search([1, 2])},
            run_config=tune.RunConfig(
                name=NAME,
                storage_path=storage,
                stop={"training_iteration": STOP},
                callbacks=[CheckpointOnPreemption()],
                checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True),
                verbose=0,
            ),
        )
    else:
        tuner = tune.Tuner.restore(f"{storage}/{NAME}", trainable=ScriptedTrainable, resume_unfinished=True)
    grid = tuner.fit()
    done = [r.metrics.get("training_iteration") for r in grid]
    print(f"iterations at exit: {done}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
