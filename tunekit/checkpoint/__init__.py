"""The checkpoint layer: one checkpoint directory and every name around it on storage.

Owns: the format (``state.pt``, ``tunekit.json``, the manifest of XXH3-128 hashes written last), writing,
reading and verifying one checkpoint; the names in a trial directory (``checkpoint_NNNNNN``, staging, kept,
pinned, damaged) and one scan of them; announcements, PBT pins, durability (fsyncs), interrupted writes and
open uploads; multi-worker rank parts; the trials and checkpoints of an experiment directory; whole states and
models loaded from a checkpoint (:mod:`tunekit.checkpoint.loading`). May import: ``tunekit.storage`` and the
top-level modules. Neither Ray nor torch is imported until a state is read or written.
"""

from __future__ import annotations

from tunekit._lazy import lazy_exports

_EXPORTS = {
    "tunekit.checkpoint._directory": (
        "CheckpointLocation", "CheckpointReport", "MANIFEST_FILE", "MANIFEST_FORMAT", "METADATA_FILE", "STATE_FILE",
        "UnsupportedManifest", "confirm_upload", "fsync_paths", "is_foreign_checkpoint", "is_tunekit_checkpoint",
        "local_checkpoint", "manifest_version", "read_metadata", "read_state", "unsupported_format",
        "verify_checkpoint", "write_checkpoint"
    ),
    "tunekit.checkpoint.loading": ("export_dcp", "load_model", "misfit_line", "read_full_state"),
}
__getattr__, __dir__, _LAZY = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_LAZY)
