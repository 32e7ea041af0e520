"""``train_digits``: the function-API reference trainable.
"""

from __future__ import annotations

from typing import Any

from tunekit import FunctionSession, function_trainable, reusable, trial_device
from tunekit.trial.rng import seed_everything
from tunekit.trainables.digits import DEFAULTS, build_digits_state, digits_on_device, evaluate, train_steps

__all__ = ["TrainDigits", "train_digits"]


def train_digits(config: dict[str, Any]) -> None:
    """Train the digits MLP, reporting with ``tune.report`` each iteration.

    Resumes from ``tune.get_checkpoint()`` with the full training state.
    ``config["max_iterations"]`` (optional) ends the loop; otherwise Tune's
    stop criteria do. ``config["checkpoint_every"]`` (optional) makes the
    training code itself ask for a checkpoint every N iterations, which also
    works when the function is given to Tune unwrapped.
    """
    device = trial_device()
    # The dataset on the device depends on no hyperparameter: a reused worker keeps it.
    data = reusable("tunekit.trainables.digits", config, (), lambda: digits_on_device(device))
    seed_everything(config.get("seed", DEFAULTS["seed"]))
    state = build_digits_state(config, device, data)
    session = FunctionSession(state, config=config, name="tunekit.trainables.function_api:train_digits")
    steps = config.get("steps_per_iteration", DEFAULTS["steps_per_iteration"])
    every = config.get("checkpoint_every")
    max_iterations = config.get("max_iterations")
    while max_iterations is None or session.iteration < max_iterations:
        train_loss = train_steps(state, steps)
        metrics = {"train_loss": train_loss, **evaluate(state.model, device, data)}
        wants = bool(every) and (session.iteration + 1) % every == 0
        session.report(metrics, checkpoint=wants)


#: ``train_digits`` wrapped by :func:`tunekit.function_trainable`: honours
#: ``CheckpointConfig`` frequency/at-end and callback checkpoint requests.
TrainDigits = function_trainable(train_digits, name="TrainDigits")
