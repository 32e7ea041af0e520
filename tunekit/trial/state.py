"""Everything a trial carries so that a restored run continues bit-exactly."""

from __future__ import annotations

import copy
import dataclasses
import io
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from tunekit.errors import CheckpointError, ConfigError, first_line
from tunekit.trial.rng import capture_rng, restore_rng

__all__ = ["Counters", "StateBuffers", "Stateful", "TrainingState", "to_cpu"]

FORMAT = "tunekit-state/1"


class Stateful(Protocol):
    """Anything with ``state_dict()``/``load_state_dict()`` (torch convention)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


@dataclass
class Counters:
    """Progress counters: reported iterations, epochs, optimizer steps, samples."""

    iteration: int = 0
    epoch: int = 0
    step: int = 0
    samples_seen: int = 0


def to_cpu(obj: Any) -> Any:
    """Copy every tensor in a nested structure to the CPU (device-independent)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_cpu(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_cpu(v) for v in obj)
    return obj


class StateBuffers:
    """CPU copies of a state's tensors, reused from save to save.

    The in-memory half of a two-phase save: :meth:`copy` returns the state
    with every tensor replaced by a CPU buffer holding its current value, so
    training may go on changing the live tensors while the copy is written.
    The buffers are kept and overwritten by the next :meth:`copy` (the caller
    lets at most one write of them be in flight), so the extra memory is one
    copy of the state's tensors (:attr:`nbytes`). Tensors on a GPU are copied
    into pinned buffers without blocking; :meth:`wait_copied` (called by the
    writer before it reads them) waits for those copies.
    """

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []
        self._next = 0
        self._event: Any = None

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers."""
        return sum(b.numel() * b.element_size() for b in self._buffers)

    def copy(self, obj: Any) -> Any:
        """``obj`` with every tensor copied into a reused CPU buffer (containers and values copied too)."""
        self._next, self._event = 0, None
        out = self._copy(obj)
        del self._buffers[self._next:]
        return out

    def wait_copied(self) -> None:
        """Block until the copies from a GPU have landed (no-op for CPU tensors)."""
        event, self._event = self._event, None
        if event is not None:
            event.synchronize()

    def clear(self) -> None:
        """Give the buffers' memory back."""
        self._buffers.clear()

    def _copy(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj)
        if isinstance(obj, dict):
            return {k: self._copy(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._copy(v) for v in obj]
        if isinstance(obj, tuple):
            return tuple(self._copy(v) for v in obj)
        return copy.deepcopy(obj)

    def _tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach()
        if tensor.layout != torch.strided or tensor.is_quantized:
            return tensor.to("cpu", copy=True)  # rare kinds: a fresh copy, not reused
        on_gpu = tensor.device.type == "cuda"
        index, self._next = self._next, self._next + 1
        buffer = self._buffers[index] if index < len(self._buffers) else None
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype or (
            on_gpu and not buffer.is_pinned()
        ):
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=on_gpu)
            if index < len(self._buffers):
                self._buffers[index] = buffer
            else:
                self._buffers.append(buffer)
        buffer.copy_(tensor, non_blocking=on_gpu)
        if on_gpu:
            if self._event is None:
                self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(tensor.device))
        return buffer


@dataclass
class TrainingState:
    """The complete state of one training run.

    Holds named models, optimizers, LR schedulers, an optional AMP grad scaler,
    a resumable data stream, counters and JSON-like user extras. RNG streams
    (Python, NumPy, torch CPU and CUDA) are captured by :meth:`state_dict` and
    restored by :meth:`load_state_dict`.

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> state = TrainingState(models={"model": model})
        >>> sd = state.state_dict()
        >>> state.load_state_dict(sd)
    """

    models: dict[str, torch.nn.Module]
    optimizers: dict[str, torch.optim.Optimizer] = field(default_factory=dict)
    schedulers: dict[str, Any] = field(default_factory=dict)
    scaler: Any | None = None
    data: Stateful | None = None
    counters: Counters = field(default_factory=Counters)
    extras: dict[str, Any] = field(default_factory=dict)
    #: The mutable hyperparameters the last loaded checkpoint was saved with
    #: (what its LR schedule was built at); PBT's new values are applied against them.
    hparams: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.models, dict) or not self.models:
            raise ConfigError(
                "TrainingState(models=...): must be a non-empty dict of name -> "
                "torch.nn.Module"
            )
        for group in ("optimizers", "schedulers", "extras"):
            if not isinstance(getattr(self, group), dict):
                raise ConfigError(f"TrainingState({group}=...): expected a dict of name -> object, got "
                                  f"{type(getattr(self, group)).__name__}")
        for group, kind in (
            ("models", torch.nn.Module),
            ("optimizers", torch.optim.Optimizer),
        ):
            for name, obj in getattr(self, group).items():
                if not isinstance(obj, kind):
                    raise ConfigError(
                        f"TrainingState({group}[{name!r}]): expected a "
                        f"{kind.__module__}.{kind.__qualname__}, got {type(obj).__name__}"
                    )
        for where, obj in [*((f"schedulers[{k!r}]", v) for k, v in self.schedulers.items()),
                           *((("scaler", self.scaler),) if self.scaler is not None else ()),
                           *((("data", self.data),) if self.data is not None else ())]:
            if not all(callable(getattr(obj, m, None)) for m in ("state_dict", "load_state_dict")):
                raise ConfigError(f"TrainingState({where}): expected an object with state_dict() and "
                                  f"load_state_dict() (a torch LR scheduler, a GradScaler, a resumable data "
                                  f"stream), got {type(obj).__name__}")
        if not isinstance(self.counters, Counters):
            raise ConfigError(f"TrainingState(counters=...): expected a tunekit.trial.state.Counters, got "
                              f"{type(self.counters).__name__} (the iteration is counted for you)")
        for name, value in self.extras.items():  # saved in state.pt, read back weights_only: said now, not later
            try:
                buffer = io.BytesIO()
                torch.save(value, buffer)
                buffer.seek(0)
                torch.load(buffer, weights_only=True)
            except Exception as exc:  # noqa: BLE001 - what pickling raises varies by object
                raise ConfigError(f"TrainingState(extras[{name!r}]): cannot be saved in a checkpoint "
                                  f"({type(exc).__name__}: {first_line(exc)}); expected plain data (numbers, "
                                  "strings, lists, dicts, tensors)") from None

    @property
    def model(self) -> torch.nn.Module:
        """The first (usually only) model."""
        return next(iter(self.models.values()))

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The first (usually only) optimizer."""
        if not self.optimizers:
            raise ConfigError("TrainingState.optimizer: this state has no optimizer")
        return next(iter(self.optimizers.values()))

    def state_dict(self, *, into: StateBuffers | None = None) -> dict[str, Any]:
        """Return the whole state with every tensor on the CPU.

        ``into``: copy every tensor into these reused buffers (a snapshot that
        training may run on from), instead of returning CPU tensors that may
        be the live ones.
        """
        live = {
            "format": FORMAT,
            "models": {k: m.state_dict() for k, m in self.models.items()},
            "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
            "schedulers": {k: s.state_dict() for k, s in self.schedulers.items()},
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "data": self.data.state_dict() if self.data is not None else None,
            "counters": dataclasses.asdict(self.counters),
            "extras": dict(self.extras),
            "rng": capture_rng(),
        }
        return into.copy(live) if into is not None else to_cpu(live)

    def load_state_dict(self, state: dict[str, Any], *, restore_rngs: bool = True) -> None:
        """Restore a state produced by :meth:`state_dict` (any device to any)."""
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise CheckpointError(
                f"TrainingState.load_state_dict(): not a {FORMAT} state "
                f"(format={state.get('format') if isinstance(state, dict) else None!r})"
            )
        for group in ("models", "optimizers", "schedulers"):
            mine, theirs = set(getattr(self, group)), set(state[group])
            if mine != theirs:
                raise CheckpointError(
                    f"TrainingState.load_state_dict(): checkpoint has {group} "
                    f"{sorted(theirs)}, this run has {sorted(mine)}"
                )
        for name, model in self.models.items():
            model.load_state_dict(state["models"][name])
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state["optimizers"][name])
        for name, sched in self.schedulers.items():
            sched.load_state_dict(state["schedulers"][name])
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        if self.data is not None and state["data"] is not None:
            self.data.load_state_dict(state["data"])
        self.counters = Counters(**state["counters"])
        self.extras = dict(state["extras"])
        self.hparams = dict(state.get("hparams") or {})
        if restore_rngs:
            restore_rng(state["rng"])
