"""Keep tunekit's JSON record of the experiment (``tunekit-experiment.json``) up to date.

Tested in ``tests/tunekit/test_resume_torn.py``.
"""

from __future__ import annotations

from typing import Any

from ray import tune
from ray.tune.experiment import Trial
from typing_extensions import override

from tunekit import _env, record

__all__ = ["ExperimentRecord", "TunekitCallback"]


class TunekitCallback(tune.Callback):
    """Base of tunekit's callbacks: each keeps the run's record (one of them writes it, see :mod:`tunekit.record`).

    A subclass that overrides ``setup``, ``on_step_end`` or ``on_experiment_end`` calls ``super()``.
    """

    def _recorded_kwargs(self) -> dict[str, Any] | None:
        """The keyword arguments that rebuild this callback (None: it cannot be rebuilt from the record)."""
        return None

    @override
    def setup(self, **info: Any) -> None:
        _env.check_all()  # a bad TUNEKIT_* value stops the run before it starts, in one line
        self._record_info = {k: info.get(k) for k in ("stop", "num_samples", "total_num_samples")}

    @override
    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        record.observe(self, trials, info=getattr(self, "_record_info", None))

    @override
    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        record.finish(self, trials)


class ExperimentRecord(TunekitCallback):
    """Write ``tunekit-experiment.json``, tunekit's plain-JSON record of the run, beside Ray's files.

    ``tunekit resume`` continues the experiment from it and the trials'
    checkpoints when Ray's ``tuner.pkl`` or experiment state is torn. Every
    tunekit callback and :func:`tunekit.pbt_setup` keep the record already;
    add this one to a ``Tuner`` that uses neither::

        tune.RunConfig(callbacks=[ExperimentRecord()])
    """

    def _recorded_kwargs(self) -> dict[str, Any] | None:
        return {}
