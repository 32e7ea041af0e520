"""``tunekit.loading``, the import path the docs show: an alias of :mod:`tunekit.checkpoint.loading`."""
from tunekit.checkpoint.loading import *  # noqa: F401,F403
from tunekit.checkpoint.loading import __all__  # noqa: F401
