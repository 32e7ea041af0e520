"""``tunekit check``: prove that a trainable resumes bit-exactly, or name what breaks it.

Three runs of the trainable, each in a fresh process, without Ray: A runs
``iterations`` (N) iterations; B runs them again; C runs ``at`` (K)
iterations, saves, and a new process restores that checkpoint and runs the
other N-K. The metrics of every iteration and, at the end, every tensor of
the saved states (models, optimizers, schedulers, RNG streams, counters, data
position) are compared (metrics that measure time, such as ``*_runtime`` or
``*_per_second``, are not):

* A and B differ: the trainable is not deterministic even without a resume
  (the first difference is named, with the switches that make it so);
* else A and C differ: the resume loses something. The first difference is
  named (metric or tensor, iteration, largest absolute difference), and what
  the trainable holds outside its saved state is compared between A and C
  right after iteration K+1 (attributes, the training function's closure and
  local variables, the global RNG streams): what differs is named as the cause; an iterator held outside the state is named
  as a suspect (a data iterator that restarts its epoch).

The trainable: a :class:`tunekit.TorchTrainable` subclass, a class made by
:func:`tunekit.function_trainable`, or a training function using
:class:`tunekit.FunctionSession` (Lightning and the Hugging Face ``Trainer``
through tunekit's integrations included), as ``module:attr``. A multi-worker
trial (:func:`tunekit.multiworker.train_trial`): each run starts a local Ray of
its own for its Train workers, and the saved states compared are every rank's
part and the bytes of every rank's shard.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from tunekit.errors import ConfigError
from tunekit.trial.kind import declared

__all__ = ["CheckReport", "add_parser", "as_trainable_class", "check_resume", "flatten", "parse_config",
           "run_cli"]

#: What the verdict of a check says.
Verdict = Literal["pass", "not deterministic", "resume differs"]

#: Metrics that measure time, not training (Ray's ``time_*``, the HF ``Trainer``'s ``*_runtime``, ``*_per_second``):
#: never compared.
_TIMING = re.compile(r"(^time_|runtime$|per_second$|_per_sec$|(^|_)(time|timestamp|duration|elapsed)(_s)?$)")

_DETERMINISM = ("make it deterministic first: seed every random source from the config, "
                "torch.use_deterministic_algorithms(True), and on a GPU CUBLAS_WORKSPACE_CONFIG=:4096:8")


@dataclass
class CheckReport:
    """What ``tunekit check`` found."""

    trainable: str
    iterations: int
    at: int
    device: str
    verdict: Verdict
    #: The first difference, in words (None on a pass).
    difference: str | None = None
    #: What was named as the cause (or suspected), one line each.
    diagnosis: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def lines(self) -> list[str]:
        head = (f"{self.trainable}: {self.iterations} iterations, interrupted after {self.at} "
                f"and resumed in a new process ({self.device}, {self.seconds:.1f} s)")
        if self.passed:
            return [f"PASS {head}: metrics and saved state bit-exact"]
        out = [f"FAIL {head}: {self.verdict}", f"  first difference: {self.difference}"]
        out += [f"  {line}" for line in self.diagnosis]
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"trainable": self.trainable, "iterations": self.iterations, "at": self.at, "device": self.device,
                "verdict": self.verdict, "passed": self.passed, "difference": self.difference,
                "diagnosis": list(self.diagnosis), "seconds": round(self.seconds, 3)}


def as_trainable_class(obj: Any, spec: str) -> type:
    """The trainable class to run for ``obj``: a Trainable class as it is, a training function wrapped."""
    from ray import tune

    from tunekit.trial.function import function_trainable

    if declared(obj).multiworker and declared(obj).train_fn is None:  # (lockstep: a function trainable of its own)
        raise ConfigError(f"trainable {spec!r}: a multi-worker trial made with train_trial(lockstep=False), whose "
                          "workers run ahead of Tune; tunekit check runs those made with lockstep=True (the "
                          "default) (docs/multiworker.md)")
    if isinstance(obj, type) and issubclass(obj, tune.Trainable):
        return obj
    if callable(obj) and not isinstance(obj, type):
        try:
            return function_trainable(obj)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"trainable {spec!r}: {exc}") from None
    raise ConfigError(f"trainable {spec!r}: {type(obj).__name__} is not a trainable; expected a "
                      "tunekit.TorchTrainable subclass, a function_trainable class or a training function")


def parse_config(text: str | None) -> dict[str, Any]:
    """``--config``: inline JSON, or the path of a JSON file; an object."""
    if text is None:
        return {}
    source = "--config"
    first = text.lstrip()[:1]
    if first != "{" and os.path.isfile(text):
        source = f"--config file {text}"
        text = Path(text).read_text()
    elif first not in ("{", "[", '"') and (os.sep in text or text.endswith(".json")):  # no JSON value looks so
        raise ConfigError(f"--config: no such file {text}; expected inline JSON or the path of a JSON file")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: expected a JSON object of hyperparameters, got {type(config).__name__}")
    return config


def _spec_of(trainable: Any) -> str:
    if isinstance(trainable, str):
        return trainable
    from tunekit.trial._saving import trainable_spec

    if isinstance(trainable, type):
        spec = trainable_spec(trainable)
        fn = declared(trainable).train_fn
        if fn is not None:  # a function_trainable class: the function is what can be imported
            spec = f"{fn.__module__}:{fn.__qualname__}"
    else:
        spec = f"{getattr(trainable, '__module__', '')}:{getattr(trainable, '__qualname__', '')}"
    if spec.startswith("__main__:") or "<locals>" in spec:
        raise ConfigError(f"trainable {spec}: the check runs it in new processes, so it must be importable "
                          "as module:attr (define it in a module, not in __main__ or inside a function)")
    return spec


def check_resume(trainable: Any, config: Mapping[str, Any] | None = None, *, iterations: int = 4,
                 at: int | None = None, device: Literal["cpu", "cuda"] = "cpu") -> CheckReport:
    """Check that ``trainable`` resumes bit-exactly (see the module docstring).

    Args:
        trainable: ``module:attr``, or the class or function itself (importable by that name).
        config: The trial's config.
        iterations: N, the iterations of each run (>= 2).
        at: K, where run C is interrupted (1..N-1; default N // 2).
        device: ``"cpu"`` (CUDA hidden from the runs) or ``"cuda"``.

    Raises:
        ConfigError: bad input (not importable, not a trainable, N or K out of range), or a run failed.
    """
    from tunekit.commands._find_trainable import import_trainable, project_on_path
    project_on_path()  # (before the runs' PYTHONPATH is built from sys.path)
    spec = _spec_of(trainable)
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 2:
        raise ConfigError(f"--iterations {iterations!r}: expected a whole number >= 2")
    at = iterations // 2 if at is None else at
    if isinstance(at, bool) or not isinstance(at, int) or not 1 <= at <= iterations - 1:
        raise ConfigError(f"--at {at!r}: expected an iteration in 1..{iterations - 1} (inside the {iterations} "
                          "iterations, so that the run is interrupted)")
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device!r}: expected 'cpu' or 'cuda'")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():  # the legs would run on the CPU and PASS for the wrong device
            raise ConfigError("--device cuda: no CUDA GPU is visible here (torch.cuda.is_available() is False); "
                              f"use --device cpu, or run where a GPU is (torch {torch.__version__})")
    as_trainable_class(import_trainable(spec), spec)  # bad input is said here, before any process starts
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tunekit-check-") as work:
        base = {"trainable": spec, "config": dict(config or {}), "work": work, "at": at}
        first = _legs(work, device, [
            {**base, "name": "A", "leg": "run", "iterations": iterations},
            {**base, "name": "B", "leg": "run", "iterations": iterations},
            {**base, "name": "C1", "leg": "save", "iterations": at},
        ])
        (c2,) = _legs(work, device, [{**base, "name": "C2", "leg": "resume", "iterations": iterations - at,
                                      "checkpoint": first[2]["checkpoint"]}])
        a, b, c1 = first
        a_saved = _saved(a["checkpoint"])  # compared with B's and with C's
        report = CheckReport(spec, iterations, at, device, "pass")
        again = _first_difference(a, a_saved, b["metrics"], b["checkpoint"])
        if again is not None:
            report.verdict, report.difference = "not deterministic", again
            report.diagnosis = ["runs A and B differ without any resume: the check cannot judge the resume; "
                                + _DETERMINISM]
        else:
            resumed = _first_difference(a, a_saved, c1["metrics"] + c2["metrics"], c2["checkpoint"], at=at)
            if resumed is not None:
                report.verdict, report.difference = "resume differs", resumed
                report.diagnosis = _diagnose(work, a, c2, at)
        report.seconds = time.perf_counter() - start
    return report


def _legs(work: str, device: str, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run the legs in parallel processes; their outputs, or one line naming the leg that failed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "RAY_AUTH_MODE": "disabled"}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    # Three legs share the machine's cores, as trials do under Tune (which sets OMP_NUM_THREADS per trial):
    # more threads than cores slows small kernels down several times over. Every leg gets the same number:
    # another number of threads sums in another order, and the runs would differ in the last bits.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // 3)))
    procs = []
    for spec in specs:
        path = os.path.join(work, f"{spec['name']}-spec.json")
        Path(path).write_text(json.dumps(spec))
        procs.append(subprocess.Popen([sys.executable, "-m", "tunekit.commands._check_run", path], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    out = []
    for spec, proc in zip(specs, procs):
        _, err = proc.communicate()
        result = Path(work, f"{spec['name']}.json")
        if not result.is_file():
            raise ConfigError(f"run {spec['name']} of the check died (exit {proc.returncode}): "
                              f"{(err or '').strip().splitlines()[-1:] or ['no output']}")
        data = json.loads(result.read_text())
        if "error" in data:
            raise ConfigError(f"run {spec['name']} of the check failed: {data['error']}")
        out.append(data)
    return out


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return bool(x == y)


def _first_difference(a: dict[str, Any], a_saved: dict[str, Any], metrics: list[dict[str, Any]], checkpoint: str,
                      *, at: int | None = None) -> str | None:
    """The first metric (by iteration) or saved tensor where ``metrics``/``checkpoint`` differ from run A's."""
    from tunekit.experiment._snapshot_model import RAY_KEYS

    for i, (mine, theirs) in enumerate(zip(a["metrics"], metrics), start=1):
        for key in sorted(set(mine) | set(theirs)):
            if key in RAY_KEYS or key.startswith("config") or _TIMING.search(key):
                continue
            x, y = mine.get(key), theirs.get(key)
            if not _same(x, y):
                where = f" ({i - at} after the resume at {at})" if at is not None and i > at else ""
                delta = f", absolute difference {abs(x - y):.3g}" if isinstance(x, (int, float)) and \
                    isinstance(y, (int, float)) else ""
                return f"metric {key!r} at iteration {i}{where}: {x!r} against {y!r}{delta}"
    return _state_difference(a_saved, _saved(checkpoint))


def _state_difference(left: dict[str, Any], right: dict[str, Any]) -> str | None:
    """The first tensor or value of two final saved states (``_saved``) that differs, with the largest difference."""
    for key in sorted(set(left) | set(right)):
        if key not in left or key not in right:
            return f"saved state entry {key!r} is in only one of the runs' final checkpoints"
        x, y = left[key], right[key]
        if hasattr(x, "shape") and hasattr(y, "shape"):
            if x.shape != y.shape or x.dtype != y.dtype:
                return f"saved tensor {key}: shape/dtype {tuple(x.shape)}/{x.dtype} against {tuple(y.shape)}/{y.dtype}"
            same = x.equal(y) or (x.is_floating_point() and bool(x.isclose(y, rtol=0, atol=0, equal_nan=True).all()))
            if not same:
                diff = (x.double() - y.double()).abs().max().item()
                return f"saved tensor {key} at the end: largest absolute difference {diff:.3g}"
        elif not _same(x, y):
            return f"saved value {key} at the end: {x!r} against {y!r}"
    return None


def _saved(checkpoint: str) -> dict[str, Any]:
    """Every tensor and plain value of a final checkpoint, flattened (``weights_only`` loads, nothing unpickled)."""
    import torch

    from tunekit.checkpoint._manifest import STATE_FILE, read_metadata
    from tunekit.checkpoint._directory import read_state
    import pyarrow.fs as pafs

    from tunekit.checkpoint._layout import POINTER_KEY, pointer_target

    flat: list[tuple[str, Any]] = []
    whole = os.path.isfile(os.path.join(checkpoint, STATE_FILE))
    value = read_metadata(checkpoint).get(POINTER_KEY) if whole else None
    target = pointer_target(pafs.LocalFileSystem(), checkpoint, value) if isinstance(value, str) else None
    if isinstance(target, str):  # a multi-worker trial's: its Train checkpoint, every rank's part and shard
        flatten(read_state(target), "", flat)
        for rank in sorted(Path(target).glob("rank-*")):
            flatten(read_state(str(rank)), rank.name, flat)
            for shard in sorted(rank.glob("*.distcp")):  # (the shard's bytes: equal state, equal bytes)
                with open(shard, "rb") as fh:
                    flat.append((f"{rank.name}/{shard.name}", hashlib.file_digest(fh, "sha256").hexdigest()))
    elif whole:
        flatten(read_state(checkpoint), "", flat)
    else:  # a framework's own checkpoint (Lightning, Transformers): each file torch can load safely
        for path in sorted(Path(checkpoint).rglob("*")):
            if path.is_file():
                try:
                    loaded = torch.load(path, map_location="cpu", weights_only=True)
                except Exception:  # noqa: BLE001 - not a torch file (config, tokenizer): not compared
                    continue
                flatten(loaded, str(path.relative_to(checkpoint)), flat)
    return {k: v for k, v in flat if not _TIMING.search(k.rsplit(".", 1)[-1])}


def flatten(obj: Any, prefix: str, out: list[tuple[str, Any]]) -> None:
    """Append ``(dotted path, leaf)`` of every leaf of nested dicts, lists and tuples to ``out``."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            flatten(v, f"{prefix}[{i}]", out)
    else:
        out.append((prefix, obj))


def _diagnose(work: str, a: dict[str, Any], c2: dict[str, Any], at: int) -> list[str]:
    """What the trainable holds outside its saved state that differs between run A and the resumed run."""
    import torch

    if "next" not in a["points"]:  # a multi-worker trial: its state lives in its Train workers
        return ["a multi-worker trial: what its workers hold outside the saved state is not searched; check that "
                "each rank's data position and random streams are in the state its WorkerSession saves"]
    found: list[str] = []
    after = {name: (kind, digest) for name, (kind, digest) in a["points"].get("next", {}).items()}
    resumed = {name: (kind, digest) for name, (kind, digest) in c2["points"].get("next", {}).items()}
    tensors_a = torch.load(os.path.join(work, "A-next.pt"), weights_only=True)
    tensors_c = torch.load(os.path.join(work, "C2-next.pt"), weights_only=True)
    suspects = []
    for name in sorted(set(after) | set(resumed)):
        kind, digest = after.get(name) or resumed[name]
        if kind == "iterator":
            suspects.append(f"suspect: {name} is an iterator outside the saved state: a data iterator restarts "
                            "from its beginning in the resumed run (keep its position in the state, e.g. "
                            "tunekit's TrainingState data)")
            continue
        if name not in after or name not in resumed or after[name][1] != resumed[name][1]:
            detail = ""
            if name in tensors_a and name in tensors_c and tensors_a[name].shape == tensors_c[name].shape:
                diff = (tensors_a[name].double() - tensors_c[name].double()).abs().max().item()
                detail = f", largest absolute difference {diff:.3g}"
            what = {"number": "a value", "tensor": "a tensor", "module": "a module", "optimizer": "an optimizer",
                    "random.Random": "a random.Random", "numpy.random.Generator": "a numpy.random.Generator",
                    "numpy.random.RandomState": "a numpy.random.RandomState",
                    "torch.Generator": "a torch.Generator"}.get(kind, kind)
            found.append(f"cause: {name} ({what}) is not in the saved state: after iteration {at + 1} it differs "
                         f"between the uninterrupted run and the resumed one{detail}")
    streams_a, streams_c = a["rngs"].get("next", {}), c2["rngs"].get("next", {})
    for stream in sorted(set(streams_a) & set(streams_c)):
        if streams_a[stream] != streams_c[stream]:
            found.append(f"cause: the {stream} random stream differs after iteration {at + 1} between the "
                         "uninterrupted run and the resumed one: it is neither in the saved state nor reseeded "
                         "from it")
    found += suspects
    return found or ["no cause found outside the saved state; compare what the trainable computes from its "
                     "config and state at the first difference"]


def add_parser(sub: Any, whole: Any) -> None:
    """The ``check`` subcommand of ``tunekit`` (``whole(low)``: the CLI's parser of whole numbers >= low)."""
    check = sub.add_parser(
        "check", help="prove that a trainable resumes bit-exactly, or name what breaks it",
        description="Run TRAINABLE three times without Ray (a multi-worker trial: with a local Ray of its own), "
        "each in a new process: N iterations (A), again (B), "
        "and K iterations, save, restore in a new process, N-K more (C). Compare the metrics of every iteration "
        "and the final saved states. Exit 0 PASS, 1 a difference (named, with its cause where one is found), "
        "2 bad input.")
    check.add_argument("trainable", metavar="TRAINABLE", help="module:attr, e.g. tunekit.trainables:DigitsTrainable")
    check.add_argument("--config", default=None, help="the trial's config: inline JSON or a JSON file")
    check.add_argument("--iterations", type=whole(2), default=4, metavar="N", help="iterations per run (default 4)")
    check.add_argument("--at", type=whole(1), default=None, metavar="K", help="where run C is interrupted (default N/2)")
    check.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the runs train (default cpu)")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(func=run_cli)


def run_cli(args: Any) -> int:
    """``tunekit check``: print the report (or ``--json``); 0 pass, 1 a difference found."""
    report = check_resume(args.trainable, parse_config(args.config), iterations=args.iterations, at=args.at,
                          device=args.device)
    if args.json:
        print(json.dumps(report.as_dict(), indent=1))
    else:
        print("\n".join(report.lines()))
    return 0 if report.passed else 1
