"""The suite's helper library: the trainable contract helpers (:mod:`tests.support.contract`), one way to
run ``Tuner.fit`` (:mod:`tests.support.fit`) and ways to damage checkpoints (:mod:`tests.support.faults`)."""
