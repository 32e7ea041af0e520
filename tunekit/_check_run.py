"""One leg of ``tunekit check``, in a process of its own: run a trainable without Ray, record what it did.

``python -m tunekit._check_run SPEC.json`` reads the leg's spec (written by
:mod:`tunekit.check`) and writes ``<work>/<name>.json``: the metrics of every
iteration, the checkpoint it saved at the end, and fingerprints of what the
trainable holds outside its saved state (attributes, the training function's
closure and locals, the global RNG streams) at the points the check compares.
Tensors among them go to ``<work>/<name>-<point>.pt`` for the largest difference.

Tested in ``tests/tunekit/test_check.py``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import sys
import tempfile
import traceback
import types
from typing import Any

__all__ = ["fingerprints", "main", "rng_streams"]

#: Objects whose state ``fingerprints`` reads (kind, how).
_MAX_ITEMS = 64


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _tensor_digest(t: Any) -> str:
    import torch

    t = t.detach().cpu().contiguous().reshape(-1)
    return _digest(t.view(torch.uint8).numpy().tobytes()) + f"/{t.dtype}/{t.numel()}"


def rng_streams() -> dict[str, str]:
    """Digests of the global random streams: Python's, NumPy's, torch's (and CUDA's when in use)."""
    import numpy as np
    import torch

    out = {"random (Python's global)": _digest(repr(random.getstate()).encode()),
           "numpy.random (global)": _digest(repr(np.random.get_state()).encode()),
           "torch (CPU)": _digest(torch.get_rng_state().numpy().tobytes())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["torch (CUDA)"] = _digest(b"".join(s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()))
    return out


def _kind(obj: Any) -> str | None:
    import numpy as np
    import torch

    if isinstance(obj, torch.Tensor):
        return "tensor"
    if isinstance(obj, torch.nn.Module):
        return "module"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(obj, torch.Generator):
        return "torch.Generator"
    if isinstance(obj, random.Random):
        return "random.Random"
    if isinstance(obj, np.random.Generator):
        return "numpy.random.Generator"
    if isinstance(obj, np.random.RandomState):
        return "numpy.random.RandomState"
    if isinstance(obj, np.ndarray):
        return "numpy array"
    if isinstance(obj, (bool, int, float)):
        return "number"
    if isinstance(obj, (types.GeneratorType, types.CoroutineType)) or (
            hasattr(obj, "__next__") and hasattr(obj, "__iter__") and not isinstance(obj, (str, bytes))):
        return "iterator"
    return None


def _value(kind: str, obj: Any) -> tuple[str, Any]:
    """(digest, tensor or None) of one object outside the saved state."""
    import torch

    if kind == "tensor":
        return _tensor_digest(obj), obj.detach().cpu().clone()
    if kind in ("module", "optimizer"):
        sd = obj.state_dict()
        from tunekit.check import flatten

        flat: list[tuple[str, Any]] = []
        flatten(sd, "", flat)
        return _digest("".join(f"{k}={_tensor_digest(v) if isinstance(v, torch.Tensor) else repr(v)}"
                               for k, v in flat).encode()), None
    if kind == "torch.Generator":
        return _digest(obj.get_state().numpy().tobytes()), None
    if kind == "random.Random":
        return _digest(repr(obj.getstate()).encode()), None
    if kind == "numpy.random.Generator":
        return _digest(repr(obj.bit_generator.state).encode()), None
    if kind == "numpy.random.RandomState":
        return _digest(repr(obj.get_state()).encode()), None
    if kind == "numpy array":
        return _digest(obj.tobytes()), None
    if kind == "number":
        return ("nan" if isinstance(obj, float) and math.isnan(obj) else repr(obj)), None
    return "", None  # an iterator: where it stands cannot be read without moving it


def _state_ids(roots: list[Any]) -> set[int]:
    """Ids of every object reachable from the saved state (tunekit's ``TrainingState`` objects among ``roots``)."""
    from tunekit.state import TrainingState

    states: list[Any] = []
    seen: set[int] = set()

    def find(obj: Any, depth: int) -> None:
        if id(obj) in seen or depth > 4:
            return
        seen.add(id(obj))
        if isinstance(obj, TrainingState):
            states.append(obj)
            return
        if isinstance(obj, dict):
            for v in list(obj.values())[:_MAX_ITEMS]:
                find(v, depth + 1)
        elif isinstance(obj, (list, tuple)):
            for v in list(obj)[:_MAX_ITEMS]:
                find(v, depth + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            for v in list(vars(obj).values())[:_MAX_ITEMS]:
                find(v, depth + 1)

    for root in roots:
        find(root, 0)
    ids: set[int] = set()

    def mark(obj: Any, depth: int) -> None:
        if id(obj) in ids or depth > 12 or isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            return
        ids.add(id(obj))
        if isinstance(obj, dict):
            for v in obj.values():
                mark(v, depth + 1)
        elif isinstance(obj, (list, tuple, set)):
            for v in obj:
                mark(v, depth + 1)
        elif hasattr(obj, "__dict__"):
            for v in vars(obj).values():
                mark(v, depth + 1)

    for state in states:
        mark(state, 0)
    return ids


def fingerprints(named_roots: dict[str, Any], skip: set[int]) -> dict[str, tuple[str, str, Any]]:
    """``{path: (kind, digest, tensor or None)}`` of what ``named_roots`` hold outside the objects in ``skip``."""
    from tunekit.state import TrainingState

    out: dict[str, tuple[str, str, Any]] = {}
    seen: set[int] = set(skip)

    def walk(obj: Any, path: str, depth: int) -> None:
        if isinstance(obj, (TrainingState, type, types.ModuleType, types.FunctionType, str, bytes)):
            return
        if not isinstance(obj, (bool, int, float)):  # (small numbers are shared objects: compared by value)
            if id(obj) in seen:
                return
            seen.add(id(obj))
        kind = _kind(obj)
        if kind is not None:
            digest, tensor = _value(kind, obj)
            out[path] = (kind, digest, tensor)
            return
        if depth >= 3:
            return
        if isinstance(obj, dict):
            for k, v in list(obj.items())[:_MAX_ITEMS]:
                walk(v, f"{path}[{k!r}]", depth + 1)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(list(obj)[:_MAX_ITEMS]):
                walk(v, f"{path}[{i}]", depth + 1)
        elif hasattr(obj, "__dict__") and type(obj).__module__.split(".")[0] not in ("ray", "torch", "tunekit"):
            for k, v in list(vars(obj).items())[:_MAX_ITEMS]:
                walk(v, f"{path}.{k}", depth + 1)

    for name, root in named_roots.items():
        walk(root, name, 0)
    return out


def _user_roots(trainable: Any, baseline: set[str]) -> dict[str, Any]:
    """What the user's code holds: the trainable's own attributes; for a training function, its closure and locals."""
    roots = {f"self.{k}": v for k, v in vars(trainable).items() if k not in baseline}
    fn = getattr(type(trainable), "_train_fn", None)
    if fn is not None:
        fn = getattr(fn, "__func__", fn)
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
    from tunekit._find_trainable import import_trainable
    from tunekit.check import as_trainable_class

    cls = as_trainable_class(import_trainable(spec["trainable"]), spec["trainable"])
    work, name = spec["work"], spec["name"]
    storage = _ray.offline_storage(os.path.join(work, "storage"), name)
    baseline = _baseline(_ray.offline_storage(os.path.join(work, "storage"), f"{name}-baseline"))
    trainable = cls(config=dict(spec["config"]), storage=storage)
    points: dict[str, dict[str, tuple[str, str, Any]]] = {}
    rngs: dict[str, dict[str, str]] = {}

    def snap(point: str) -> None:
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
