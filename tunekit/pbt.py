"""``tunekit.pbt``, the import path the docs show: an alias of :mod:`tunekit.schedule.pbt`."""
from tunekit.schedule.pbt import *  # noqa: F401,F403
from tunekit.schedule.pbt import __all__  # noqa: F401
