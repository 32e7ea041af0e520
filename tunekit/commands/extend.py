"""``tunekit resume --extend``: a finished experiment's trials continued to more iterations, beside it.
"""

from __future__ import annotations

import posixpath
import sys
from typing import TextIO

import pyarrow.fs as pafs

from tunekit.commands._find_trainable import find_trainable
from tunekit.commands._recovery import ResumeSummary, newest_good, parent_of, run_beside
from tunekit.errors import ConfigError, ExperimentError
from tunekit.experiment.snapshot import read_experiment
from tunekit.storage._location import Storage, probe_storage, resolve_storage

__all__ = ["extend_experiment"]


def extend_experiment(
    location: str | Storage,
    iterations: int,
    *,
    trainable: str | None = None,
    cpus: int | None = None,
    address: str | None = None,
    stream: TextIO | None = None,
) -> ResumeSummary:
    """Continue every trial of a finished experiment to ``iterations`` in a new experiment beside it.

    Each trial of ``EXP`` is started again from its newest checkpoint, complete
    state (:func:`tunekit.warm_start` with ``mode="continue"``: bit-exact with
    one longer run), with its config, and stops at ``training_iteration ==
    iterations``. The new experiment is ``EXP-to-ITERATIONS`` in the same
    storage; :func:`tunekit.load_results` of it holds every iteration once
    (the rows up to the checkpoint come from ``EXP``, marked ``inherited_from``).
    ``EXP`` itself is not changed. A trial whose newest checkpoint does not
    verify continues from its newest one that does, and says so. Schedulers, search algorithms and
    callbacks of the original run are not carried over: the trials run to the
    new stopping point, a checkpoint at the end.

    Raises:
        ConfigError: ``iterations`` is not above every trial's checkpoint, or no trainable is found.
        ExperimentError: not an experiment, a trial without a checkpoint, or the target exists.
    """
    from tunekit.trial.warm import WARM_START_KEY, warm_start

    out = stream or sys.stdout
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ConfigError(f"extend: iterations={iterations!r}: expected a positive whole number")
    experiment = resolve_storage(location)
    before = read_experiment(experiment)
    if not before.trials:
        raise ExperimentError(f"{experiment.uri}: no trials to extend")
    configs = []
    notes = []
    for trial in before.trials:
        newest, damaged = newest_good(before, trial)
        if newest is None or newest.iteration is None:
            passed = f" ({'; '.join(damaged)})" if damaged else ""
            raise ExperimentError(f"extend {experiment.uri}: trial {trial.trial_id} has no checkpoint that verifies "
                                  f"to continue from{passed}")
        if damaged:
            notes.append(f"  {trial.trial_id}: continues from {newest.name} (iteration {newest.iteration}); "
                         f"passed over: {'; '.join(damaged)}")
        if (newest.iteration or 0) >= iterations:
            raise ConfigError(
                f"extend {experiment.uri} to {iterations}: trial {trial.trial_id} has a checkpoint at iteration "
                f"{newest.iteration} already; give more iterations than that"
            )
        config = {k: v for k, v in trial.config.items() if k != WARM_START_KEY}
        configs.append({**config, **warm_start(newest.uri, mode="continue")})
    obj, found = find_trainable(experiment, before, trainable)
    parent = parent_of(experiment)
    name = f"{posixpath.basename(experiment.path.rstrip('/'))}-to-{iterations}"
    target = parent.join(name)
    if experiment.filesystem.get_file_info(target.path).type != pafs.FileType.NotFound:
        raise ExperimentError(f"extend: {target.uri} exists already; remove it or resume it with tunekit resume")
    probe_storage(parent)  # (read-only storage said in one line here, before Ray starts)

    from ray import tune

    print(f"extending {experiment.uri}: {len(configs)} trials to iteration {iterations}, into {target.uri}", file=out)
    print(f"trainable: {found}", file=out, flush=True)
    for note in notes:
        print(note, file=out, flush=True)
    run_beside(target, obj, configs, "resume --extend", stop={"training_iteration": iterations},
                checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True), address=address, cpus=cpus)
    after = read_experiment(target)
    return ResumeSummary(target.uri, found, before.counts(), after)
