"""Fault injection for proving that a sweep survives real kills: the layer above everything else, which only
tests and benchmarks import (nothing in tunekit imports it).

:class:`Injector` is a thread in the driver that SIGKILLs trial workers while a ``Tuner.fit()`` runs: inside
their checkpoint writes (it sees each two-phase write's staging directory, which names its writer's pid), or
at random. :func:`invariant_violations` then reads what the run left, through tunekit's own records only,
and says in one line each what was lost: trials in ERROR, a newest checkpoint that does not verify, writes left
over, rows twice or missing, a trial past its stop, ``tunekit verify``/``status`` not clean.
:func:`run_and_reap` runs a driver that kills itself and then ends every process it started
(:func:`kill_until_gone`).
:func:`tensors_equal` compares two states bit for bit. See ``docs/resume.md`` ("Proving your own sweep").
"""

from tunekit.testing._injector import Injector, Kill, invariant_violations, tensors_equal
from tunekit.testing._processes import kill_until_gone, run_and_reap

__all__ = ["Injector", "Kill", "invariant_violations", "kill_until_gone", "run_and_reap", "tensors_equal"]
