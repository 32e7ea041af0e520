"""Start trials from an existing tunekit checkpoint: continue its training, or fine-tune its weights.

A warm start is part of a trial's config, under :data:`WARM_START_KEY`, so it
goes wherever configs go (a sweep's ``param_space``, one trial of a search,
``tunekit resume --extend``) and is recorded with the trial: ``tunekit
status`` shows it, :func:`tunekit.load_results` has it as a config column.

Example:
    >>> param_space = {"lr": 0.05, **warm_start("runs/exp/trial/checkpoint_000003", mode="weights")}
    ... # doctest: +SKIP

Two modes, chosen explicitly:

* ``"continue"``: the complete state (models, optimizers, schedulers, scaler,
  data position, counters, RNG streams) - the trial goes on from the
  checkpoint's iteration exactly as a resume would (bit-exact against one
  longer run); mutable hyperparameters in the config that differ from the
  checkpoint's are applied, as after a PBT exploit.
* ``"weights"``: the models' weights only - fine-tuning: a fresh optimizer,
  counters from 0, the data stream and RNG streams as the config seeds them.

The checkpoint is verified against its manifest when a trial loads it. When
Tune later restores the trial from its own checkpoint (a retry, a pause, a
PBT exploit), that checkpoint wins; the warm start only shapes the start.
The trial's checkpoints carry the lineage (``extras["tunekit/warm_start"]``).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import pyarrow.fs as pafs

from tunekit.checkpoint._manifest import locate
from tunekit.checkpoint._directory import (MANIFEST_FILE, METADATA_FILE, CheckpointLocation, read_state)
from tunekit.checkpoint.loading import misfit_line
from tunekit.errors import CheckpointError, ConfigError, StorageError
from tunekit.trial.hparams import changed_hyperparameters
from tunekit.trial.state import TrainingState

__all__ = ["LINEAGE_KEY", "MODES", "WARM_START_KEY", "apply_warm_start", "warm_start", "warm_start_spec"]

#: The config key a warm start is given under.
WARM_START_KEY = "tunekit_warm_start"
#: The ``TrainingState.extras`` key of a warm-started trial's lineage.
LINEAGE_KEY = "tunekit/warm_start"
MODES = ("continue", "weights")


def _uri(checkpoint: CheckpointLocation) -> str:
    """A string that names ``checkpoint`` for any process: a local path or a URI."""
    if isinstance(checkpoint, str):
        return checkpoint
    where = locate(checkpoint)  # a ray.tune.Checkpoint, a Storage or an os.PathLike
    if where.is_local:
        return where.path
    kind = getattr(where.filesystem, "type_name", "")
    if kind == "s3":
        return f"s3://{where.path}"
    raise ConfigError(
        f"warm_start(checkpoint={where.uri!r}): a checkpoint on {kind or type(where.filesystem).__name__} "
        "storage must be given as a URI string"
    )


def _shapes(weights: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(getattr(v, "shape", ())) for k, v in weights.items()}


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def warm_start(checkpoint: CheckpointLocation, *, mode: str) -> dict[str, Any]:
    """Config entries that start a trial from ``checkpoint``: merge them into ``param_space``.

    Args:
        checkpoint: A tunekit checkpoint directory: a local path, a URI or a ``ray.tune.Checkpoint``.
        mode: ``"continue"`` (the complete state) or ``"weights"`` (fine-tune; see the module doc).

    Raises:
        ConfigError: ``mode`` is not one of :data:`MODES`.
        CheckpointError: ``checkpoint`` does not exist or is not a tunekit checkpoint.
    """
    if mode not in MODES:
        raise ConfigError(f"warm_start(mode={mode!r}): expected 'continue' (complete state) or 'weights' (fine-tune)")
    uri = _uri(checkpoint)
    _check_checkpoint(uri)
    return {WARM_START_KEY: {"checkpoint": uri, "mode": mode}}


def _check_checkpoint(uri: str) -> None:
    """A one-line error unless ``uri`` is a directory holding a tunekit checkpoint (no verification)."""
    try:
        where = locate(uri)
        info = where.filesystem.get_file_info([where.path, f"{where.path}/{MANIFEST_FILE}",
                                               f"{where.path}/{METADATA_FILE}"])
    except (OSError, StorageError, ValueError) as exc:
        raise CheckpointError(f"warm start from {uri}: cannot read it ({str(exc).splitlines()[0]})") from None
    if info[0].type != pafs.FileType.Directory:
        what = "no such directory" if info[0].type == pafs.FileType.NotFound else "not a directory"
        raise CheckpointError(f"warm start from {uri}: {what}; expected a tunekit checkpoint directory")
    if info[1].type != pafs.FileType.File or info[2].type != pafs.FileType.File:
        raise CheckpointError(
            f"warm start from {uri}: not a tunekit checkpoint (no {MANIFEST_FILE} or {METADATA_FILE}); "
            "expected a checkpoint_NNNNNN directory written by a tunekit trainable"
        )


def warm_start_spec(config: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(checkpoint, mode)`` of the warm start in a trial's config, or None.

    Raises:
        ConfigError: the entry is malformed.
    """
    spec = config.get(WARM_START_KEY)
    if spec is None or (isinstance(spec, Mapping) and spec.get("checkpoint") is None):
        return None  # none, or none said outright (a fresh trial among warm-started ones, see tunekit resume)
    if (not isinstance(spec, Mapping) or not isinstance(spec.get("checkpoint"), str)
            or spec.get("mode") not in MODES):
        raise ConfigError(
            f"config[{WARM_START_KEY!r}]={spec!r}: expected {{'checkpoint': PATH_OR_URI, 'mode': "
            "'continue' or 'weights'}} (use tunekit.warm_start())"
        )
    return spec["checkpoint"], spec["mode"]


def apply_warm_start(
    state: TrainingState,
    config: Mapping[str, Any],
    *,
    mutable: tuple[str, ...],
    apply: Callable[[dict[str, Any]], None],
) -> int | None:
    """Load the warm start named in ``config`` (if any) into a freshly built ``state``.

    Returns:
        None without a warm start; else the iteration the trial goes on from
        (the checkpoint's for ``"continue"``, 0 for ``"weights"``).

    Raises:
        CheckpointError: the checkpoint is missing, damaged, or does not fit the trainable's state.
    """
    spec = warm_start_spec(config)
    if spec is None:
        return None
    uri, mode = spec
    _check_checkpoint(uri)
    try:
        sd = read_state(uri)
    except CheckpointError as exc:
        raise CheckpointError(f"warm start from {uri}: {str(exc).splitlines()[0]}") from None
    previous = (sd.get("extras") or {}).get(LINEAGE_KEY)
    iteration = int((sd.get("counters") or {}).get("iteration", 0))
    try:
        check = getattr(state, "check_checkpoint", None)  # a framework integration's: the right kind?
        if check is not None:
            check(sd, weights_only=mode == "weights")
        for name, model in state.models.items():  # the first misfit named in one line, before anything is loaded
            saved = (sd.get("models") or {}).get(name)
            if isinstance(saved, dict) and _shapes(saved) != _shapes(model.state_dict()):
                raise CheckpointError(misfit_line(str(uri), name, saved, model).removeprefix(f"checkpoint {uri}: "))
        if mode == "continue":
            state.load_state_dict(sd)
        else:
            mine, theirs = sorted(state.models), sorted(sd.get("models") or {})
            if mine != theirs:
                raise CheckpointError(f"checkpoint has models {theirs}, this trainable has {mine}")
            for name, model in state.models.items():
                model.load_state_dict(sd["models"][name])
    except (CheckpointError, RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointError(
            f"warm start from {uri} ({mode}): {_one_line(exc)}; was it written by this trainable?"
        ) from None
    if mode == "continue":
        changed = changed_hyperparameters(sd.get("hparams") or {}, dict(config), mutable)
        if changed:
            apply(changed)
    lineage = {"checkpoint": uri, "mode": mode, "iteration": iteration}
    if previous:
        lineage["before"] = previous
    state.extras[LINEAGE_KEY] = lineage
    return iteration if mode == "continue" else 0
