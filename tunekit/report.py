"""``tunekit.report``, the import path the docs show: an alias of :mod:`tunekit.analysis.report`."""
from tunekit.analysis.report import *  # noqa: F401,F403
from tunekit.analysis.report import __all__  # noqa: F401
