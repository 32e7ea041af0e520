"""Run training code written for a framework as checkpoint-complete Tune trials.

* :mod:`tunekit.integrations.lightning`: a PyTorch Lightning ``Trainer.fit``
  (``pip install 'tunekit[lightning]'``);
* :mod:`tunekit.integrations.transformers`: a Hugging Face ``Trainer.train``
  (``pip install 'tunekit[transformers]'``).

Each is one call that replaces the framework's own ``fit``/``train`` inside a
training function given to :func:`tunekit.function_trainable`. The trial's
checkpoints are tunekit checkpoints (``state.pt``, metadata, manifest) holding
the framework's complete training state plus every RNG stream, so they are
verified, resumed bit-exactly, cloned by PBT, warm-started
(:func:`tunekit.warm_start`) and read by ``tunekit verify`` like any other.
Importing these modules imports neither framework; the first call does, and
says what to install when it is missing.
"""

from __future__ import annotations

__all__: list[str] = []
