"""Reference trainables built on tunekit, with the small real model and data they train: the quickstart's PBT
sweep, class and function trainables over scikit-learn's digits, a DDP trial. They sit above tunekit's core and
use it as a user's trainable does; the core never imports them (but ``tunekit quickstart`` runs one).
"""

from __future__ import annotations

from tunekit.trainables.class_api import DigitsTrainable
from tunekit.trainables.digits import DEFAULTS, load_digits_data
from tunekit.trainables.function_api import TrainDigits, train_digits

__all__ = ["DEFAULTS", "DigitsTrainable", "TrainDigits", "load_digits_data", "train_digits"]
