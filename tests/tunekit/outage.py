"""A Tune callback that takes the test S3 server down for a few seconds mid-run."""

from __future__ import annotations

import threading
from typing import Any

from ray import tune


class S3Outage(tune.Callback):
    """Stop the S3 server when a trial reports iteration ``at``; start it again ``seconds`` later."""

    def __init__(self, server: Any, *, at: int, seconds: float) -> None:
        self.server, self.at, self.seconds, self.happened = server, at, seconds, False

    def __getstate__(self) -> dict[str, Any]:
        # Tune saves callbacks with the experiment; the live server stays out of it.
        return {**self.__dict__, "server": None}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if self.happened or self.server is None or result["training_iteration"] != self.at:
            return
        self.happened = True
        self.server.stop()
        threading.Timer(self.seconds, self.server.start).start()
