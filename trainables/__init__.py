"""Reference trainables built on tunekit, with the small real model and data they train.

Tested in ``tests/trainables/test_quickstart.py``.
"""

from __future__ import annotations

from tunekit.trainables.class_api import DigitsTrainable
from tunekit.trainables.digits import DEFAULTS, load_digits_data
from tunekit.trainables.function_api import TrainDigits, train_digits

__all__ = ["DEFAULTS", "DigitsTrainable", "TrainDigits", "load_digits_data", "train_digits"]
