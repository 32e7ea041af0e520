"""``tunekit.check``, the import path the docs show: an alias of :mod:`tunekit.commands.check`."""
from tunekit.commands.check import *  # noqa: F401,F403
from tunekit.commands.check import __all__  # noqa: F401
