"""``tunekit.tensorboard``, the import path the docs show: an alias of :mod:`tunekit.analysis.tensorboard`."""
from tunekit.analysis.tensorboard import *  # noqa: F401,F403
from tunekit.analysis.tensorboard import __all__  # noqa: F401
