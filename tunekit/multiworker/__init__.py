"""Multi-worker trials: a Ray Train worker loop, DDP or FSDP, checkpoint-complete inside Tune.

* :class:`WorkerSession`: in ``train_loop_per_worker``, restores this rank's state bit-exactly from
  the checkpoint Train hands back and reports metrics with or without a checkpoint. Replicated state
  is written once (rank 0), each rank's RNG streams and data position by that rank, sharded state
  (FSDP2, FSDP1, DTensor) by every rank through ``torch.distributed.checkpoint``: nobody gathers the
  model. A checkpoint verifies only when every rank's part does; restore falls back to the newest
  one that verifies on every rank, and an FSDP checkpoint reshards onto another number of workers.
* :func:`train_trial`: a Tune trainable running one Ray Train ``TorchTrainer`` per trial; Tune's
  ``CheckpointConfig`` frequency and at-end, callbacks' ``should_checkpoint`` and schedulers' saves each get
  a checkpoint of the iteration Tune saw (the workers wait for Tune's decision on each report).

* :func:`train_checkpoint_of`: the Train checkpoint a trial's Tune checkpoint (``Result.checkpoint``) points at.
  Read one without Ray: :func:`tunekit.checkpoint.loading.read_full_state` (the whole state, shards gathered) and
  :func:`tunekit.checkpoint.loading.export_dcp` (a plain ``torch.distributed.checkpoint`` directory).

See ``docs/multiworker.md``. Tested in ``tests/tunekit/test_multiworker.py``.
"""

from __future__ import annotations

from tunekit.multiworker.session import WorkerSession
from tunekit.multiworker.trial import train_checkpoint_of, train_trial

__all__ = ["WorkerSession", "train_checkpoint_of", "train_trial"]
