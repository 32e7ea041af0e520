"""``tunekit.schedulers``, the import path the docs show: an alias of :mod:`tunekit.schedule.schedulers`."""
from tunekit.schedule.schedulers import *  # noqa: F401,F403
from tunekit.schedule.schedulers import __all__  # noqa: F401
