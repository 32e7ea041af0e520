"""One leg of ``tunekit check``, in a process of its own: run a trainable without Ray, record what it did.

``python -m tunekit.commands._check_run SPEC.json`` reads the leg's spec (written by
:mod:`tunekit.commands.check`) and writes ``<work>/<name>.json``: the metrics of every
iteration, the checkpoint it saved at the end, and fingerprints of what the
trainable holds outside its saved state (attributes, the training function's
closure and locals, the global RNG streams) at the points the check compares.
Tensors among them go to ``<work>/<name>-<point>.pt`` for the largest difference.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import random
import sys
import tempfile
import traceback
import types
from typing import Any

from tunekit.trial.kind import declared

__all__ = ["fingerprints", "main", "rng_streams"]

#: How many items of one container or object the search for what the trainable holds reads.
_MAX_ITEMS = 64
_OPAQUE = (type, types.ModuleType, types.FunctionType, str, bytes)


def _children(obj: Any, limit: int | None = _MAX_ITEMS, sets: bool = False) -> list[tuple[str, Any, Any]]:
    """What a dict, list, tuple (a set with ``sets``) or plain object holds: ``(sep, key, value)``, sep ``[`` or ``.``.

    The first ``limit`` items, read at once (the trainable's threads may change them meanwhile).
    """
    if isinstance(obj, _OPAQUE):
        return []
    if isinstance(obj, dict):
        items: Any = (("[", k, v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)) or (sets and isinstance(obj, (set, frozenset))):
        items = (("[", i, v) for i, v in enumerate(obj))
    elif hasattr(obj, "__dict__"):
        items = ((".", k, v) for k, v in vars(obj).items())
    else:
        return []
    return list(itertools.islice(items, limit))


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _tensor_digest(t: Any) -> str:
    import torch

    t = t.detach().cpu().contiguous().reshape(-1)
    return _digest(t.view(torch.uint8).numpy().tobytes()) + f"/{t.dtype}/{t.numel()}"


def _nested_digest(obj: Any) -> str:
    """A digest of nested dicts, lists and tensors (a ``state_dict``, captured RNG state), the same in any process."""
    import torch

    if isinstance(obj, torch.Tensor):
        return _tensor_digest(obj)
    if isinstance(obj, dict):
        return _digest(repr({k: _nested_digest(v) for k, v in obj.items()}).encode())
    if isinstance(obj, (list, tuple)):
        return _digest(repr([_nested_digest(v) for v in obj]).encode())
    return repr(obj)


#: The global random streams as ``tunekit.trial.rng.capture_rng`` names them -> as the check's findings name them.
_STREAMS = {"python": "random (Python's global)", "numpy": "numpy.random (global)", "torch": "torch (CPU)",
            "cuda": "torch (CUDA)"}


def rng_streams() -> dict[str, str]:
    """Digests of the global random streams: Python's, NumPy's, torch's (and CUDA's when in use)."""
    from tunekit.trial.rng import capture_rng

    captured = capture_rng()
    return {name: _nested_digest(captured[key]) for key, name in _STREAMS.items() if key != "cuda" or captured[key]}


def _number_digest(x: Any) -> str:
    return "nan" if isinstance(x, float) and math.isnan(x) else repr(x)


def _fingerprint(obj: Any) -> tuple[str, str, Any] | None:
    """(kind, digest, tensor or None) of an object whose state the check compares; None for any other object."""
    import numpy as np
    import torch

    kinds: list[tuple[Any, str, Any]] = [
        (torch.Tensor, "tensor", _tensor_digest),
        (torch.nn.Module, "module", lambda m: _nested_digest(m.state_dict())),
        (torch.optim.Optimizer, "optimizer", lambda o: _nested_digest(o.state_dict())),
        (torch.Generator, "torch.Generator", lambda g: _tensor_digest(g.get_state())),
        (random.Random, "random.Random", lambda r: _digest(repr(r.getstate()).encode())),
        (np.random.Generator, "numpy.random.Generator", lambda g: _digest(repr(g.bit_generator.state).encode())),
        (np.random.RandomState, "numpy.random.RandomState", lambda r: _digest(repr(r.get_state()).encode())),
        (np.ndarray, "numpy array", lambda a: _digest(a.tobytes())),
        ((bool, int, float), "number", _number_digest),
    ]
    for types_, kind, digest in kinds:
        if isinstance(obj, types_):
            return kind, digest(obj), (obj.detach().cpu().clone() if kind == "tensor" else None)
    if isinstance(obj, (types.GeneratorType, types.CoroutineType)) or (
            hasattr(obj, "__next__") and hasattr(obj, "__iter__") and not isinstance(obj, (str, bytes))):
        return "iterator", "", None  # where it stands cannot be read without moving it
    return None


def _state_ids(roots: list[Any]) -> set[int]:
    """Ids of every object reachable from the saved state (tunekit's ``TrainingState`` objects among ``roots``)."""
    from tunekit.trial.state import TrainingState

    states: list[Any] = []
    seen: set[int] = set()

    def find(obj: Any, depth: int) -> None:
        if id(obj) in seen or depth > 4:
            return
        seen.add(id(obj))
        if isinstance(obj, TrainingState):
            states.append(obj)
            return
        for _, _, v in _children(obj):
            find(v, depth + 1)

    for root in roots:
        find(root, 0)
    ids: set[int] = set()

    def mark(obj: Any, depth: int) -> None:
        if id(obj) in ids or depth > 12 or isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            return
        ids.add(id(obj))
        for _, _, v in _children(obj, limit=None, sets=True):
            mark(v, depth + 1)

    for state in states:
        mark(state, 0)
    return ids


def fingerprints(named_roots: dict[str, Any], skip: set[int]) -> dict[str, tuple[str, str, Any]]:
    """``{path: (kind, digest, tensor or None)}`` of what ``named_roots`` hold outside the objects in ``skip``."""
    from tunekit.trial.state import TrainingState

    out: dict[str, tuple[str, str, Any]] = {}
    seen: set[int] = set(skip)

    def walk(obj: Any, path: str, depth: int) -> None:
        if isinstance(obj, (TrainingState, *_OPAQUE)):
            return
        if not isinstance(obj, (bool, int, float)):  # (small numbers are shared objects: compared by value)
            if id(obj) in seen:
                return
            seen.add(id(obj))
        found = _fingerprint(obj)
        if found is not None:
            out[path] = found
            return
        if depth >= 3 or (not isinstance(obj, (dict, list, tuple))
                          and type(obj).__module__.split(".")[0] in ("ray", "torch", "tunekit")):
            return  # (the libraries' own objects: what they hold is theirs, or in the saved state)
        for sep, key, v in _children(obj):
            walk(v, f"{path}[{key!r}]" if sep == "[" else f"{path}.{key}", depth + 1)

    for name, root in named_roots.items():
        walk(root, name, 0)
    return out


def _user_roots(trainable: Any, baseline: set[str]) -> dict[str, Any]:
    """What the user's code holds: the trainable's own attributes; for a training function, its closure and locals."""
    roots = {f"self.{k}": v for k, v in vars(trainable).items() if k not in baseline}
    fn = declared(type(trainable)).train_fn
    if fn is not None:
        code = getattr(fn, "__code__", None)
        for name, cell in zip(getattr(code, "co_freevars", ()), getattr(fn, "__closure__", None) or ()):
            try:
                roots[f"{fn.__name__}: closure variable {name}"] = cell.cell_contents
            except ValueError:
                pass
        for frame in sys._current_frames().values():
            while frame is not None:
                if frame.f_code is code:
                    roots.update({f"{fn.__name__}: local variable {k}": v for k, v in frame.f_locals.items()
                                  if k != "config"})
                    break
                frame = frame.f_back
    return roots


def _baseline(storage: Any) -> set[str]:
    """Attribute names Ray's and tunekit's trainable machinery set (not the user's)."""
    import torch
    from ray import tune

    from tunekit import TorchTrainable, TrainingState

    class Tiny(TorchTrainable):
        def build(self, config: dict[str, Any]) -> TrainingState:
            return TrainingState(models={"m": torch.nn.Linear(1, 1)})

        def train_iteration(self) -> dict[str, Any]:
            return {}

    tiny = Tiny(config={}, storage=storage)
    try:
        return set(vars(tune.Trainable(config={}))) | set(vars(tiny)) | {"_last_training_result", "_session"}
    finally:
        tiny.stop()


def _run(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from tunekit import _ray
    from tunekit.commands._find_trainable import import_trainable
    from tunekit.commands.check import as_trainable_class

    cls = as_trainable_class(import_trainable(spec["trainable"]), spec["trainable"])
    work, name = spec["work"], spec["name"]
    multi = declared(cls).multiworker
    if multi:  # its Train workers are Ray actors: a Ray of this leg's own, as large as the trial needs
        _start_ray(cls, spec["config"])
    storage = _ray.offline_storage(os.path.join(work, "storage"), name)
    baseline = set() if multi else _baseline(_ray.offline_storage(os.path.join(work, "storage"), f"{name}-baseline"))
    trainable = cls(config=dict(spec["config"]), storage=storage)
    points: dict[str, dict[str, tuple[str, str, Any]]] = {}
    rngs: dict[str, dict[str, str]] = {}

    def snap(point: str) -> None:
        if multi:  # what this process holds is the trial's driver, not its workers' state
            return
        roots = _user_roots(trainable, baseline)
        points[point] = fingerprints(roots, _state_ids([trainable, *roots.values()]))
        rngs[point] = rng_streams()

    metrics = []
    try:
        if spec["leg"] == "resume":
            trainable.restore(spec["checkpoint"])
            snap("restored")
        for i in range(spec["iterations"]):
            result = trainable.train()
            metrics.append({k: v for k, v in result.items() if _plain(v)})
            if spec["leg"] == "run" and i + 1 == spec["at"]:
                snap("at")
            if (spec["leg"] == "run" and i + 1 == spec["at"] + 1) or (spec["leg"] == "resume" and i == 0):
                snap("next")
        saved = trainable.save()
    finally:
        trainable.stop()
    tensors = {}
    out_points = {}
    for point, found in points.items():
        out_points[point] = {path: [kind, digest] for path, (kind, digest, _) in found.items()}
        tensors[point] = {path: t for path, (_, _, t) in found.items() if t is not None}
        torch.save(tensors[point], os.path.join(work, f"{name}-{point}.pt"))
    return {"metrics": metrics, "checkpoint": saved.checkpoint.path, "points": out_points, "rngs": rngs}


def _start_ray(cls: Any, config: dict[str, Any]) -> None:
    """A local Ray with the CPUs (logical) and GPUs a multi-worker trial's Train run asks for."""
    import math

    import ray

    need = declared(cls).resources or {}
    workers = int(config.get("workers", need.get("workers", 2)))
    cpus = math.ceil(workers * float(need.get("cpus_per_worker", 1.0))) + 1
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)


def _plain(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str)) or value is None


def main(argv: list[str] | None = None) -> int:
    (spec_path,) = argv if argv is not None else sys.argv[1:]
    with open(spec_path) as fh:
        spec = json.load(fh)
    out = os.path.join(spec["work"], f"{spec['name']}.json")
    try:
        data = _run(spec)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which says it in one line
        data = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0], "traceback": traceback.format_exc()}
    fd, tmp = tempfile.mkstemp(dir=spec["work"])
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, default=repr)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
