"""Resume an interrupted experiment: find its trainable, ``Tuner.restore``, run to the end.

The trainable is found, in this order, from:

1. ``trainable="module:attr"`` given by the caller;
2. the ``trainable`` recorded in ``tunekit.json`` of the experiment's
   checkpoints (tunekit trainables record their ``module:qualname``);
3. the references in ``tuner.pkl`` whose name is the recorded
   ``trainable_name``, found by reading the pickle's opcodes (never loading it).

A function found this way that is not a Tune trainable class is wrapped with
:func:`tunekit.function_trainable` if it uses a :class:`~tunekit.FunctionSession`
(tunekit records those), and handed to Tune as is otherwise.
"""

from __future__ import annotations

import contextlib
import importlib
import pickletools
import posixpath
import sys
from dataclasses import dataclass
from typing import Any, Iterator, TextIO

from tunekit.checkpoint import read_metadata
from tunekit.errors import CheckpointError, ConfigError, ExperimentError
from tunekit.snapshot import ExperimentSnapshot, format_counts, read_experiment
from tunekit.storage import Storage, resolve_storage

__all__ = ["ResumeSummary", "extend_experiment", "find_trainable", "import_trainable", "resume_experiment"]


def import_trainable(spec: str) -> Any:
    """Import ``module:attr`` (``attr`` may be dotted).

    Raises:
        ConfigError: malformed, or the module or attribute does not exist.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"trainable {spec!r}: expected module:attr, e.g. tunekit.trainables:DigitsTrainable")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        moved = _moved_module(module_name)
        if moved is None:
            raise ConfigError(f"trainable {spec!r}: cannot import {module_name} ({exc})") from None
        obj = importlib.import_module(moved)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"trainable {spec!r}: {module_name} has no attribute {attr}") from None
    return obj


#: Top-level packages of tunekit before 0.2, now inside tunekit.
_MOVED_PACKAGES = ("trainables", "callbacks")


def _moved_module(module_name: str) -> str | None:
    """``trainables.class_api`` -> ``tunekit.trainables.class_api`` (experiments of older tunekit)."""
    if module_name.split(".")[0] in _MOVED_PACKAGES:
        return f"tunekit.{module_name}"
    return None


def _alias_moved_packages(references: list[tuple[str, str]]) -> None:
    """Let ``Tuner.restore`` unpickle an older experiment that refers to ``callbacks.…``/``trainables.…``.

    Only names the experiment refers to, and only where no module of that name
    exists (a user's own ``callbacks`` module is left alone).
    """
    import importlib.util

    for module_name in sorted({m for m, _ in references if _moved_module(m)}):
        top = module_name.split(".")[0]
        existing = sys.modules.get(top)
        if existing is not None and not existing.__name__.startswith("tunekit."):
            continue  # the user's own module of that name: theirs wins
        if existing is None and importlib.util.find_spec(top) is not None:
            continue
        for name in (top, module_name):
            sys.modules.setdefault(name, importlib.import_module(f"tunekit.{name}"))


def _pickle_globals(data: bytes) -> list[tuple[str, str]]:
    """(module, name) references in a pickle, read from its opcodes; nothing is executed."""
    found, strings = [], []
    try:
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                strings.append(arg)
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append((strings[-2], strings[-1]))
            elif opcode.name == "GLOBAL" and isinstance(arg, str):
                module, _, name = arg.partition(" ")
                found.append((module, name))
    except Exception:  # a damaged pickle: use what was read up to there
        pass
    return found


def _recorded_trainables(snapshot: ExperimentSnapshot) -> list[str]:
    specs = []
    for trial in snapshot.trials:
        for ckpt in reversed(trial.checkpoints):
            try:
                spec = read_metadata(ckpt.uri).get("trainable")
            except CheckpointError:
                continue
            if isinstance(spec, str) and ":" in spec and spec not in specs:
                specs.append(spec)
            break
    return specs


def _as_trainable(obj: Any) -> Any:
    from ray.tune import Trainable

    if isinstance(obj, type) and issubclass(obj, Trainable):
        return obj
    if callable(obj):
        import inspect

        from tunekit.function import function_trainable

        try:
            source = inspect.getsource(obj)
        except (OSError, TypeError):
            source = ""
        return function_trainable(obj) if "FunctionSession" in source else obj
    raise ConfigError(f"{obj!r} is not a Tune trainable (a Trainable class or a function)")


def find_trainable(experiment: Storage, snapshot: ExperimentSnapshot, spec: str | None = None) -> tuple[Any, str]:
    """The trainable to resume ``experiment`` with, and where it was found."""
    if spec:
        return _as_trainable(import_trainable(spec)), spec
    for recorded in _recorded_trainables(snapshot):
        try:
            return _as_trainable(import_trainable(recorded)), f"{recorded} (recorded in its checkpoints)"
        except ConfigError:
            continue
    names = {t.trainable_name for t in snapshot.trials if t.trainable_name}
    raw = _tuner_pickle(experiment)
    if raw and names:
        for module, name in _pickle_globals(raw):
            if name.split(".")[-1] in names and not module.startswith(("ray.", "builtins", "__main__")):
                spec = f"{module}:{name}"
                try:
                    return _as_trainable(import_trainable(spec)), f"{spec} (referenced by tuner.pkl)"
                except ConfigError:
                    continue
    shown = ", ".join(sorted(names)) or "unknown"
    raise ConfigError(
        f"cannot tell which trainable ran {experiment.uri} (trainable name: {shown}); "
        "pass --trainable module:attr"
    )


def _tuner_pickle(experiment: Storage) -> bytes | None:
    """The bytes of ``tuner.pkl`` (read, never unpickled here), or None."""
    path = posixpath.join(experiment.path, "tuner.pkl")
    if experiment.filesystem.get_file_info(path).type.name != "File":
        return None
    with experiment.filesystem.open_input_stream(path) as stream:
        return stream.read()


@contextlib.contextmanager
def _local_ray(cpus: int | None) -> Iterator[None]:
    """Ray as it is, or a local one started (and shut down after) when none is running."""
    import ray

    if ray.is_initialized():
        yield
        return
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


@dataclass
class ResumeSummary:
    """What ``tunekit resume`` did."""

    experiment: str
    trainable: str
    before: dict[str, int]
    after: ExperimentSnapshot

    @property
    def ok(self) -> bool:
        return all(t.status == "TERMINATED" for t in self.after.trials)


def resume_experiment(
    location: str | Storage,
    *,
    trainable: str | None = None,
    resume_errored: bool = False,
    restart_errored: bool = False,
    cpus: int | None = None,
    stream: TextIO | None = None,
) -> ResumeSummary:
    """Restore the experiment at ``location`` with ``Tuner.restore`` and run it to the end.

    Args:
        location: The experiment directory (path or URI).
        trainable: ``module:attr`` of the trainable (default: found, see module doc).
        resume_errored: Resume errored trials from their last checkpoint.
        restart_errored: Restart errored trials from scratch.
        cpus: CPUs of the local Ray started when none is running.
        stream: Where progress goes (default stdout).

    Raises:
        ExperimentError: not an experiment, or its state cannot be read.
        ConfigError: conflicting options, or no trainable can be found.
    """
    out = stream or sys.stdout
    if resume_errored and restart_errored:
        raise ConfigError("resume: --resume-errored and --restart-errored exclude each other")
    experiment = resolve_storage(location)
    before = read_experiment(experiment)
    if before.state_file is None:
        raise ExperimentError(f"{experiment.uri}: no experiment_state-*.json, so Ray Tune cannot restore it")
    damaged = [p for p in before.problems if p.startswith("experiment_state")]
    if damaged:
        raise ExperimentError(f"{experiment.uri}: {damaged[0]}; Ray Tune cannot restore from it")
    obj, found = find_trainable(experiment, before, trainable)

    from ray import tune

    counts = before.counts()
    summary = format_counts(counts)
    print(f"resuming {experiment.uri}: {len(before.trials)} trials ({summary})", file=out)
    print(f"trainable: {found}", file=out, flush=True)
    _alias_moved_packages(_pickle_globals(_tuner_pickle(experiment) or b""))
    with _local_ray(cpus):
        tuner = tune.Tuner.restore(
            experiment.path,
            obj,
            resume_unfinished=True,
            resume_errored=resume_errored,
            restart_errored=restart_errored,
            storage_filesystem=experiment.filesystem,
        )
        tuner.fit()
    after = read_experiment(experiment)
    return ResumeSummary(experiment.uri, found, counts, after)


def extend_experiment(
    location: str | Storage,
    iterations: int,
    *,
    trainable: str | None = None,
    cpus: int | None = None,
    stream: TextIO | None = None,
) -> ResumeSummary:
    """Continue every trial of a finished experiment to ``iterations`` in a new experiment beside it.

    Each trial of ``EXP`` is started again from its newest checkpoint, complete
    state (:func:`tunekit.warm_start` with ``mode="continue"``: bit-exact with
    one longer run), with its config, and stops at ``training_iteration ==
    iterations``. The new experiment is ``EXP-to-ITERATIONS`` in the same
    storage; :func:`tunekit.load_results` of it holds every iteration once
    (the rows up to the checkpoint come from ``EXP``, marked ``inherited_from``).
    ``EXP`` itself is not changed. Schedulers, search algorithms and
    callbacks of the original run are not carried over: the trials run to the
    new stopping point, a checkpoint at the end.

    Raises:
        ConfigError: ``iterations`` is not above every trial's checkpoint, or no trainable is found.
        ExperimentError: not an experiment, a trial without a checkpoint, or the target exists.
    """
    from tunekit.warm import WARM_START_KEY, warm_start

    out = stream or sys.stdout
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ConfigError(f"extend: iterations={iterations!r}: expected a positive whole number")
    experiment = resolve_storage(location)
    before = read_experiment(experiment)
    if not before.trials:
        raise ExperimentError(f"{experiment.uri}: no trials to extend")
    configs = []
    for trial in before.trials:
        good = [c for c in trial.checkpoints if c.iteration is not None and not c.unsupported]
        if not good:
            raise ExperimentError(f"extend {experiment.uri}: trial {trial.trial_id} has no checkpoint to continue from")
        newest = max(good, key=lambda c: c.iteration or 0)
        if (newest.iteration or 0) >= iterations:
            raise ConfigError(
                f"extend {experiment.uri} to {iterations}: trial {trial.trial_id} has a checkpoint at iteration "
                f"{newest.iteration} already; give more iterations than that"
            )
        config = {k: v for k, v in trial.config.items() if k != WARM_START_KEY}
        configs.append({**config, **warm_start(newest.uri, mode="continue")})
    obj, found = find_trainable(experiment, before, trainable)
    parent = Storage(experiment.filesystem, posixpath.dirname(experiment.path.rstrip("/")),
                     posixpath.dirname(experiment.uri.partition("?")[0].rstrip("/")))
    name = f"{posixpath.basename(experiment.path.rstrip('/'))}-to-{iterations}"
    target = parent.join(name)
    if experiment.filesystem.get_file_info(target.path).type.name != "NotFound":
        raise ExperimentError(f"extend: {target.uri} exists already; remove it or resume it with tunekit resume")

    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    print(f"extending {experiment.uri}: {len(configs)} trials to iteration {iterations}, into {target.uri}", file=out)
    print(f"trainable: {found}", file=out, flush=True)
    with _local_ray(cpus):
        space: dict[str, Any] = {}
        for config in configs:  # Ray resolves each point against the space: every key must be in it
            for key, value in config.items():
                space.setdefault(key, value)
        tune.Tuner(
            obj,
            param_space=space,
            tune_config=tune.TuneConfig(search_alg=BasicVariantGenerator(points_to_evaluate=configs),
                                        num_samples=len(configs)),
            run_config=tune.RunConfig(
                name=name, stop={"training_iteration": iterations}, verbose=0,
                checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True),
                storage_path=parent.path, storage_filesystem=parent.filesystem,
            ),
        ).fit()
    after = read_experiment(target)
    return ResumeSummary(target.uri, found, before.counts(), after)
