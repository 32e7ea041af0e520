"""Find an experiment's trainable without unpickling anything: the recorded spec, else ``tuner.pkl``'s opcodes.

Implementation tier of :mod:`tunekit.commands.resume` (which exports
:func:`find_trainable` and :func:`import_trainable`); the order in which the
trainable is looked for is stated there.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from tunekit.experiment._pickles import pickle_globals, read_tuner_pickle
from tunekit.checkpoint._directory import read_metadata
from tunekit.errors import CheckpointError, ConfigError, first_line
from tunekit.experiment.snapshot import ExperimentSnapshot
from tunekit.storage._location import Storage
from tunekit.trial.kind import declared

__all__ = ["alias_moved_packages", "find_trainable", "import_trainable", "project_on_path"]


def project_on_path() -> None:
    """Make the user's project (the working directory) importable, as ``python -m`` does: a command run
    from it finds ``mymodule:MyTrainable`` there (and Ray's local workers get the directory too)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def import_trainable(spec: str) -> Any:
    """Import ``module:attr`` (``attr`` may be dotted), from the working directory too.

    Raises:
        ConfigError: malformed, or the module or attribute does not exist.
    """
    project_on_path()
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
    except SyntaxError as exc:  # the user's module does not parse: where
        raise ConfigError(f"trainable {spec!r}: {module_name} does not parse: {exc.msg} "
                          f"({exc.filename}, line {exc.lineno})") from None
    except Exception as exc:  # noqa: BLE001 - whatever the module raises at import is the user's code's error
        raise ConfigError(f"trainable {spec!r}: importing {module_name} raised {type(exc).__name__}: "
                          f"{first_line(exc)}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"trainable {spec!r}: {module_name} has no attribute {attr}") from None
    return obj


#: Top-level packages of tunekit before 0.2, now inside tunekit.
_MOVED_PACKAGES = ("trainables", "callbacks")
#: Modules of tunekit before 0.4, now inside its layer packages: an experiment started before refers to them.
_MOVED_MODULES = {
    "tunekit._announced": "tunekit.checkpoint._announced",
    "tunekit._check_run": "tunekit.commands._check_run",
    "tunekit._checkpointer": "tunekit.trial._checkpointer",
    "tunekit._connect": "tunekit.commands._connect",
    "tunekit._durability": "tunekit.checkpoint._durability",
    "tunekit._experiment_state": "tunekit.experiment._experiment_state",
    "tunekit._exploit_log": "tunekit.experiment._exploit_log",
    "tunekit._faults": "tunekit.checkpoint._faults",
    "tunekit._find_trainable": "tunekit.commands._find_trainable",
    "tunekit._index": "tunekit.experiment._index",
    "tunekit._interrupted": "tunekit.checkpoint._interrupted",
    "tunekit._lease": "tunekit.experiment._lease",
    "tunekit._lineage": "tunekit.analysis._lineage",
    "tunekit._manifest": "tunekit.checkpoint._manifest",
    "tunekit._pickles": "tunekit.experiment._pickles",
    "tunekit._pins": "tunekit.checkpoint._pins",
    "tunekit._priority": "tunekit.checkpoint._priority",
    "tunekit._ranks": "tunekit.checkpoint._ranks",
    "tunekit._recovery": "tunekit.commands._recovery",
    "tunekit._report_plots": "tunekit.analysis._report_plots",
    "tunekit._restoring": "tunekit.trial._restoring",
    "tunekit._result_frames": "tunekit.analysis._result_frames",
    "tunekit._saving": "tunekit.trial._saving",
    "tunekit._signals": "tunekit.experiment._signals",
    "tunekit._snapshot_model": "tunekit.experiment._snapshot_model",
    "tunekit._status_text": "tunekit.analysis._status_text",
    "tunekit._trial_dir": "tunekit.checkpoint._trial_dir",
    "tunekit._uploads": "tunekit.checkpoint._uploads",
    "tunekit.data": "tunekit.trial.data",
    "tunekit.device": "tunekit.trial.device",
    "tunekit.experiment_dir": "tunekit.checkpoint._layout",
    "tunekit.function": "tunekit.trial.function",
    "tunekit.gc": "tunekit.experiment.gc",
    "tunekit.hparams": "tunekit.trial.hparams",
    "tunekit.interval": "tunekit.schedule.interval",
    "tunekit.record": "tunekit.experiment.record",
    "tunekit.results": "tunekit.experiment.results",
    "tunekit.resume": "tunekit.commands.resume",
    "tunekit.retention": "tunekit.experiment.retention",
    "tunekit.reuse": "tunekit.trial.reuse",
    "tunekit.rng": "tunekit.trial.rng",
    "tunekit.snapshot": "tunekit.experiment.snapshot",
    "tunekit.state": "tunekit.trial.state",
    "tunekit.torch_trainable": "tunekit.trial.torch_trainable",
    "tunekit.verify": "tunekit.experiment.verify",
    "tunekit.warm": "tunekit.trial.warm",
}


def _moved_module(module_name: str) -> str | None:
    """``trainables.class_api`` -> ``tunekit.trainables.class_api``, ``tunekit.function`` ->
    ``tunekit.trial.function`` (experiments of older tunekit)."""
    if module_name in _MOVED_MODULES:
        return _MOVED_MODULES[module_name]
    if module_name.split(".")[0] in _MOVED_PACKAGES:
        return f"tunekit.{module_name}"
    return None


def _alias_moved_packages(references: list[tuple[str, str]]) -> None:
    """Let ``Tuner.restore`` unpickle an older experiment that refers to ``callbacks.…``/``trainables.…`` or to a
    tunekit module that has moved into a layer package.

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
    for module_name in sorted({m for m, _ in references if m in _MOVED_MODULES}):
        sys.modules.setdefault(module_name, importlib.import_module(_MOVED_MODULES[module_name]))


def _recorded_trainables(snapshot: ExperimentSnapshot) -> list[str]:
    specs = []
    for trial in snapshot.trials:
        for ckpt in reversed(trial.checkpoints):
            try:
                spec = read_metadata(ckpt.where).get("trainable")
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
    if callable(obj) and not isinstance(obj, type):
        import inspect

        from tunekit.trial.function import function_trainable

        try:
            params = list(inspect.signature(obj).parameters.values())
        except (TypeError, ValueError):
            params = []
        required = [p for p in params if p.default is inspect.Parameter.empty
                    and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
        if len(required) != 1:
            raise ConfigError(f"{getattr(obj, '__qualname__', obj)!s} is not a Tune trainable: expected a Trainable "
                              "class or a training function of one argument, config")

        try:
            source = inspect.getsource(obj)
        except (OSError, TypeError):
            source = ""
        return function_trainable(obj) if "FunctionSession" in source else obj
    raise ConfigError(f"{getattr(obj, '__qualname__', obj)!s} is not a Tune trainable: expected a Trainable class "
                      "or a training function of one argument, config")


def find_trainable(experiment: Storage, snapshot: ExperimentSnapshot, spec: str | None = None,
                   record: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The trainable to resume ``experiment`` with, and where it was found.

    In this order: ``spec``; the checkpoints' ``tunekit.json``; tunekit's
    experiment record (``record``); the references in ``tuner.pkl``.
    """
    if spec:
        return _as_trainable(import_trainable(spec)), spec
    raw = read_tuner_pickle(experiment)
    in_record = (record or {}).get("trainable")
    candidates = [(c, "recorded in its checkpoints") for c in _recorded_trainables(snapshot)]
    if isinstance(in_record, str) and ":" in in_record:
        candidates.append((in_record, "recorded in tunekit-experiment.json"))
    names = {t.trainable_name for t in snapshot.trials if t.trainable_name}
    failed = []
    for recorded, where in candidates:
        if recorded.startswith("ray."):  # tunekit < 0.4 recorded the class tune.with_resources made
            recorded = _unwrapped(recorded, raw)
        try:
            return _named_as(_as_trainable(import_trainable(recorded)), names), f"{recorded} ({where})"
        except ConfigError as exc:
            failed.append(f"{recorded} ({where}): {str(exc).removeprefix(f'trainable {recorded!r}: ')}")
            continue
    if raw and names:
        for module, name in pickle_globals(raw):
            if name.split(".")[-1] in names and not module.startswith(("ray.", "builtins", "__main__")):
                spec = f"{module}:{name}"
                try:
                    return _as_trainable(import_trainable(spec)), f"{spec} (referenced by tuner.pkl)"
                except ConfigError:
                    continue
    shown = ", ".join(sorted(names)) or "unknown"
    tried = (f"; tried {'; '.join(dict.fromkeys(failed))} (run from the directory that holds the module, or "
             "set PYTHONPATH)") if failed else ""
    raise ConfigError(
        f"cannot tell which trainable ran {experiment.uri} (trainable name: {shown}){tried}; "
        "pass --trainable module:attr"
    )


def _named_as(obj: Any, names: set[str]) -> Any:
    """A function trainable under the name Ray registered it by (``function_trainable(fn, name=...)``).

    Checkpoints record the training function; ``Tuner.restore`` accepts only a
    trainable of the name the run used, so the wrapper is renamed to it.
    """
    if len(names) != 1 or declared(obj).train_fn is None or obj.__name__ in names:
        return obj
    name = next(iter(names))
    return type(name, (obj,), {"__module__": obj.__module__, "_name": name})


def _unwrapped(spec: str, raw: bytes | None) -> str:
    """``ray.tune.trainable.util:Name`` -> the user's ``module:Name`` that tuner.pkl refers to (else tunekit's)."""
    name = spec.partition(":")[2]
    for module, attr in pickle_globals(raw or b""):
        if attr == name and not module.startswith(("ray.", "builtins", "__main__")):
            return f"{module}:{attr}"
    return f"tunekit.trainables:{name}"


def alias_moved_packages(experiment: Storage) -> None:
    """Before ``Tuner.restore``: make the old top-level module names ``tuner.pkl`` refers to importable."""
    _alias_moved_packages(pickle_globals(read_tuner_pickle(experiment) or b""))
