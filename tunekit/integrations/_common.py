"""What the framework integrations share: the state they checkpoint, when they report, how they apply PBT's values.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from tunekit.errors import CheckpointError, ConfigError
from tunekit.trial.function import FunctionSession
from tunekit.trial.hparams import put_learning_rate
from tunekit.trial.state import TrainingState

__all__ = [
    "FrameworkTrainingState", "KEY_PREFIX", "OPTIMIZER_KEYS", "Reporter", "apply_optimizer_values", "framework_of",
    "make_session", "new_state", "plain_metrics", "require"
]

#: ``TrainingState.extras`` key prefix of a framework's own training state.
KEY_PREFIX = "tunekit/framework:"
#: Hyperparameters an integration changes in place on the framework's optimizers (PBT).
OPTIMIZER_KEYS = ("lr", "learning_rate", "momentum", "weight_decay")


def require(module: str, *, extra: str, what: str) -> Any:
    """Import ``module`` or raise a one-line ImportError saying what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"tunekit.integrations.{extra} needs {what} ({exc.name or module} is not installed): "
            f"pip install 'tunekit[{extra}]'"
        ) from None


def framework_of(state: Mapping[str, Any]) -> str | None:
    """The framework whose trial wrote a checkpoint's state dict (None: a plain tunekit trainable)."""
    for key in (state.get("extras") or {}):
        if isinstance(key, str) and key.startswith(KEY_PREFIX):
            return key[len(KEY_PREFIX):]
    return None


@dataclass(eq=False)
class FrameworkTrainingState(TrainingState):
    """A TrainingState whose checkpoint also holds a framework's training state.

    ``models`` holds the framework's model (its weights are saved there, so
    ``tunekit.load_model`` and weights-only warm starts work as for any
    trainable); everything else the framework restores itself (optimizers,
    schedulers, loops, callbacks, trainer state) is saved under
    ``extras["tunekit/framework:<name>"]`` by ``dump()``. Loading keeps that
    part and the RNG streams aside (:attr:`restored`, :attr:`pending_rng`)
    for the integration to hand to the framework at the moment the framework
    restores (RNGs must not be set before the framework has rebuilt its data
    pipeline the way the first run did).
    """

    framework: str = ""
    dump: Callable[[], dict[str, Any]] | None = field(default=None, repr=False)
    restored: dict[str, Any] | None = field(default=None, repr=False)
    pending_rng: dict[str, Any] | None = field(default=None, repr=False)
    pending_changes: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def key(self) -> str:
        return KEY_PREFIX + self.framework

    def state_dict(self, *, into: Any = None) -> dict[str, Any]:
        if self.dump is None:
            raise CheckpointError(
                f"tunekit.integrations.{self.framework}: nothing to checkpoint before training has started"
            )
        self.extras[self.key] = self.dump()
        try:
            return super().state_dict(into=into)
        finally:
            self.extras.pop(self.key, None)

    def check_checkpoint(self, state: Mapping[str, Any], *, weights_only: bool = False) -> None:
        """Raise a one-line CheckpointError unless ``state`` may start this framework's trial."""
        kind = framework_of(state)
        if kind == self.framework or (kind is None and weights_only):
            return
        written = f"a {kind} trial's" if kind else "a plain tunekit trainable's (no framework state)"
        raise CheckpointError(
            f"it is {written} checkpoint; expected one written by tunekit.integrations.{self.framework}"
        )

    def load_state_dict(self, state: dict[str, Any], *, restore_rngs: bool = True) -> None:
        self.check_checkpoint(state)
        super().load_state_dict(state, restore_rngs=False)
        self.restored = self.extras.pop(self.key)
        self.pending_rng = state["rng"] if restore_rngs else None

    def defer(self, changed: dict[str, Any]) -> None:
        """Keep PBT's changed values until the framework has restored its optimizers."""
        unknown = sorted(k for k in changed if k not in OPTIMIZER_KEYS)
        if unknown:
            raise ConfigError(
                f"tunekit.integrations.{self.framework}: mutable hyperparameters {unknown} cannot be "
                f"changed in place; expected some of {list(OPTIMIZER_KEYS)} (others are read from the "
                "config when the training function builds its objects, so leave them out of mutable=)"
            )
        self.pending_changes.update(changed)


def new_state(framework: str, model: Any) -> Any:
    """A fresh :class:`FrameworkTrainingState` for ``framework`` holding ``model``."""
    return FrameworkTrainingState(models={"model": model}, framework=framework)


def apply_optimizer_values(
    optimizers: list[Any], schedulers: list[Any], changed: Mapping[str, Any], *, previous: Mapping[str, Any]
) -> None:
    """Set PBT's values on live optimizers; a new learning rate goes on under the LR schedule.

    ``lr`` and ``learning_rate`` both mean the learning rate: it is put in
    effect as if the schedule had been built at it, its progress kept
    (:func:`tunekit.trial.hparams.put_learning_rate`, from the value in
    ``previous``, the rate the restored checkpoint was saved with).
    """
    for key, value in changed.items():
        if key in ("lr", "learning_rate"):
            put_learning_rate(optimizers, schedulers, value, previous=previous.get(key))
            continue
        groups = [g for o in optimizers for g in o.param_groups if key in g]
        if not groups:
            raise ConfigError(f"hyperparameter {key}={value!r}: no optimizer param group has {key!r}")
        for group in groups:
            group[key] = value


class Reporter:
    """When an integration reports: one iteration per epoch or per ``every_n_steps`` optimizer steps.

    The framework's hooks mark an iteration done (:meth:`step_done`,
    :meth:`epoch_done`, :meth:`final`, with its metrics) and :meth:`fire`
    reports it, at the point of the framework's loop that a restored run
    resumes from (each integration says which hook that is).
    """

    def __init__(self, session: FunctionSession, state: Any, every_n_steps: int | None) -> None:
        if every_n_steps is not None and (isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int)
                                          or every_n_steps < 1):
            raise ConfigError(f"every_n_steps={every_n_steps!r}: expected a positive int, or None (one per epoch)")
        self.session = session
        self.state = state
        self.every_n_steps = every_n_steps
        self._due: Callable[[], dict[str, Any]] | None = None  # the metrics of the iteration done
        self._last_step = state.counters.step  # a restored trial reported up to here

    def step_done(self, step: int, metrics: Callable[[], dict[str, Any]]) -> None:
        if self.every_n_steps is not None and step > 0 and step % self.every_n_steps == 0:
            self._due = metrics

    def epoch_done(self, metrics: Callable[[], dict[str, Any]]) -> None:
        if self.every_n_steps is None:
            self._due = metrics

    def final(self, step: int, metrics: Callable[[], dict[str, Any]]) -> None:
        """At the end of training: the steps since the last report make one more (shorter) iteration."""
        if self.every_n_steps is not None and self._due is None and step > self._last_step:
            self._due = metrics

    def fire(self, *, epoch: int, step: int) -> None:
        """Report the iteration marked done, if any (blocks while Tune decides; it may save then)."""
        if self._due is None:
            return
        metrics, self._due = self._due(), None
        counters = self.state.counters
        counters.epoch, counters.step = epoch, step
        self._last_step = step
        self.session.report(metrics)


def plain_metrics(values: Mapping[str, Any]) -> dict[str, Any]:
    """Numbers as Python floats/ints (tensors' ``item()``), other values dropped."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[str(key)] = value
    return out


def make_session(state: Any, *, config: Mapping[str, Any], mutable: tuple[str, ...], name: str | None
                 ) -> FunctionSession:
    """The trial's FunctionSession: restores the checkpoint Tune hands over (or a warm start) into ``state``."""
    bad = sorted(k for k in mutable if k not in OPTIMIZER_KEYS)
    if bad:
        state.defer(dict.fromkeys(bad))  # raises the one-line error
    return FunctionSession(state, config=config, mutable=tuple(mutable), apply=state.defer, name=name)
