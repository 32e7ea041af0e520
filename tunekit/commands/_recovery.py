"""What ``tunekit resume`` does around Ray's own files: damaged ones set aside, ``tuner.pkl`` rebuilt, runs beside.
"""

from __future__ import annotations

import contextlib
import dataclasses
import posixpath
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow.fs as pafs

from tunekit.commands._connect import ray_for
from tunekit.commands._find_trainable import import_trainable
from tunekit.experiment._pickles import TUNER_PKL, pickle_globals
from tunekit.errors import ConfigError, ExperimentError
from tunekit.experiment.snapshot import CheckpointSummary, ExperimentSnapshot, TrialSnapshot
from tunekit.storage._location import Storage

__all__ = ["ResumeSummary", "callbacks_from", "has_tuner_pickle", "newest_good", "not_restored", "parent_of", "quiet",
           "rebuild_tuner", "run_beside", "searcher_of", "set_aside", "space_of"]


def has_tuner_pickle(experiment: Storage) -> bool:
    return experiment.filesystem.get_file_info(posixpath.join(experiment.path, TUNER_PKL)).type == pafs.FileType.File


def set_aside(experiment: Storage, name: str) -> str:
    """Rename a damaged file of Ray's to ``NAME.damaged`` (``.damaged-2``, ... if taken): kept, out of Ray's way."""
    fs = experiment.filesystem
    for n in range(1, 100):
        kept = f"{name}.damaged" + (f"-{n}" if n > 1 else "")
        target = posixpath.join(experiment.path, kept)
        if fs.get_file_info(target).type == pafs.FileType.NotFound:
            fs.move(posixpath.join(experiment.path, name), target)
            return kept
    raise ExperimentError(f"{experiment.uri}: too many damaged copies of {name} kept; remove some")


def callbacks_from(record: dict[str, Any] | None) -> tuple[list[Any], list[str]]:
    """tunekit's callbacks of the recorded run, rebuilt with their settings, and the names of those that cannot be."""
    built, lost = [], []
    for entry in (record or {}).get("callbacks") or []:
        name, kwargs = entry.get("class"), entry.get("kwargs")
        short = str(name).rpartition(":")[2]
        if not isinstance(name, str) or not isinstance(kwargs, dict):
            lost.append(short)
            continue
        try:
            built.append(import_trainable(name)(**kwargs))
        except (ConfigError, TypeError, ValueError):
            lost.append(short)
    return built, lost


def searcher_of(experiment: Storage) -> str | None:
    """The search algorithm whose state Ray saved beside the experiment (``searcher-state-*.pkl``), by name."""
    fs = experiment.filesystem
    infos = fs.get_file_info(pafs.FileSelector(experiment.path))
    states = sorted(i.path for i in infos if i.base_name.startswith("searcher-state-") and i.base_name.endswith(".pkl"))
    if not states:
        return None
    with fs.open_input_stream(states[-1]) as stream:
        refs = pickle_globals(stream.read())
    names = [name for module, name in refs if module.startswith("ray.tune.search.") and name.endswith("Search")]
    # Ray's searchers save their own __dict__: the library's classes name the searcher
    names += [_SEARCHERS[m.partition(".")[0]] for m, _ in refs if m.partition(".")[0] in _SEARCHERS]
    return names[0] if names else "a search algorithm"


_SEARCHERS = {"optuna": "OptunaSearch", "hyperopt": "HyperOptSearch", "ax": "AxSearch", "bayes_opt": "BayesOptSearch",
              "nevergrad": "NevergradSearch", "zoopt": "ZOOptSearch", "hebo": "HEBOSearch"}


def not_restored(experiment: Storage, record: dict[str, Any] | None, lost_callbacks: list[str]) -> str:
    """What lived only in ``tuner.pkl`` and is not restored, in a few words."""
    lost = []
    searcher = searcher_of(experiment)
    if searcher:
        lost.append(f"the search algorithm's history ({searcher}): its started trials continue, trials it had not "
                    "suggested yet are not run")
    scheduler = (record or {}).get("scheduler")
    lost.append(f"the scheduler's state ({scheduler.rpartition(':')[2]})" if scheduler else
                "a scheduler, if one was used (trials run to their stop)")
    if lost_callbacks:
        lost.append(f"callbacks {', '.join(lost_callbacks)}")
    lost.append("callbacks other than tunekit's")
    return "; ".join(lost)


def rebuild_tuner(experiment: Storage, obj: Any, record: dict[str, Any] | None, record_problem: str | None,
                   torn: str) -> str:
    """Write a new ``tuner.pkl`` for ``Tuner.restore`` from tunekit's record; the torn one kept. One line says so."""
    from ray import tune

    kept = f" (kept as {set_aside(experiment, TUNER_PKL)})" if has_tuner_pickle(experiment) else ""
    callbacks, lost_callbacks = callbacks_from(record)
    stop = (record or {}).get("stop") if (record or {}).get("stop_is_dict", True) else None
    checkpoint = (record or {}).get("checkpoint_config") or {}
    fields = {f.name for f in dataclasses.fields(tune.CheckpointConfig)}
    parent = posixpath.dirname(experiment.path.rstrip("/"))
    tune.Tuner(
        obj,
        param_space={},
        # nothing new is sampled: Ray restores the trials from the experiment state, and the default
        # searcher's own saved state (if there is one) with them
        tune_config=tune.TuneConfig(num_samples=0, metric=(record or {}).get("metric"),
                                    mode=(record or {}).get("mode")),
        run_config=tune.RunConfig(
            name=posixpath.basename(experiment.path.rstrip("/")), storage_path=parent,
            storage_filesystem=experiment.filesystem, stop=stop or None, callbacks=callbacks, verbose=0,
            checkpoint_config=tune.CheckpointConfig(**{k: v for k, v in checkpoint.items() if k in fields}),
        ),
    )
    source = "tunekit's record (tunekit-experiment.json)" if record else f"the checkpoints ({record_problem})"
    return (f"{torn}{kept}: rebuilt from {source}; not restored: "
            f"{not_restored(experiment, record, lost_callbacks)}")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Ray's notices that do not apply to a resume (its config box, PBT's num_to_keep warning) left out."""
    import warnings

    from tunekit._ray import quiet_ray_notices, quiet_tune_banner

    undo = [quiet_ray_notices(), quiet_tune_banner()]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Using `CheckpointConfig.num_to_keep <= 2` with PBT")
            yield
    finally:
        for restore in undo:
            restore()


def parent_of(experiment: Storage) -> Storage:
    """The location an experiment is in; its URI keeps the storage options (``?endpoint_override=...``)."""
    base, sep, query = experiment.uri.partition("?")
    return Storage(experiment.filesystem, posixpath.dirname(experiment.path.rstrip("/")),
                   posixpath.dirname(base.rstrip("/")) + (sep + query if sep else ""))


def run_beside(target: Storage, obj: Any, configs: list[dict[str, Any]], what: str, *, stop: Any,
                checkpoint_config: Any, callbacks: list[Any] | None = None, address: str | None,
                cpus: int | None) -> None:
    """Run ``configs`` (warm starts and fresh configs) as the new experiment ``target``."""
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    parent = parent_of(target)
    with quiet(), ray_for(what, address=address, cpus=cpus):
        tune.Tuner(
            obj,
            tune_config=tune.TuneConfig(search_alg=BasicVariantGenerator(points_to_evaluate=configs),
                                        num_samples=len(configs)),
            param_space=space_of(configs),
            run_config=tune.RunConfig(
                name=posixpath.basename(target.path.rstrip("/")), stop=stop, verbose=0,
                checkpoint_config=checkpoint_config, callbacks=callbacks or [],
                storage_path=parent.path, storage_filesystem=parent.filesystem,
            ),
        ).fit()


def space_of(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """A param_space every config in ``configs`` fits, so that Ray takes each as a preset point quietly.

    Ray resolves each point against the space (every key must be in it) and
    warns when a point differs from a constant there: a key whose values
    differ between the configs becomes a choice of them.
    """
    from ray import tune

    space: dict[str, Any] = {}
    for key in dict.fromkeys(k for c in configs for k in c):
        values = [c[key] for c in configs if key in c]
        if all(isinstance(v, dict) for v in values):
            space[key] = space_of(values)
            continue
        distinct: list[Any] = []
        for value in values:
            if value not in distinct:
                distinct.append(value)
        space[key] = distinct[0] if len(distinct) == 1 else tune.choice(distinct)
    return space


@dataclass
class ResumeSummary:
    """What ``tunekit resume`` did."""

    experiment: str
    trainable: str
    before: dict[str, int]
    after: ExperimentSnapshot
    #: False when there was nothing to do (every trial finished): nothing was started or written.
    ran: bool = True
    #: Where the trials went on when Ray's experiment state was torn: a new experiment beside it (else None).
    into: str | None = None

    @property
    def ok(self) -> bool:
        return all(t.status == "TERMINATED" for t in self.after.trials)


def newest_good(snapshot: ExperimentSnapshot, trial: TrialSnapshot) -> tuple[CheckpointSummary | None, list[str]]:
    """A trial's newest checkpoint that verifies, and one line for each newer one that does not."""
    damaged = []
    for ckpt in sorted(trial.checkpoints, key=lambda c: (c.iteration or 0, c.name), reverse=True):
        ok, why = snapshot.verdict(ckpt)
        if ok:
            return ckpt, damaged
        damaged.append(f"{ckpt.name} is {why}")
    return None, damaged
