"""The storage layer: a location (a path, a URI or a filesystem) turned once into a :class:`Storage`
(``pyarrow.fs.FileSystem`` and a path), probed, and files on it read whole.

Owns: resolving and probing locations, storage errors, whole-file reads. May import: ``tunekit.errors`` and
the other modules at the top of ``tunekit`` (nothing of a layer).
"""

from __future__ import annotations

from tunekit._lazy import lazy_exports

_EXPORTS = {
    "tunekit.storage._location": (
        "DEFAULT_STORAGE_PATH", "Storage", "check_cluster_storage", "directory_bytes", "not_s3", "probe_storage",
        "redact", "resolve_storage", "storage_errors"
    ),
}
__getattr__, __dir__, _LAZY = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_LAZY)
