"""Turn a storage location into ``(pyarrow FileSystem, path)``, once, and probe it.

Where a location enters tunekit (the CLI, :func:`tunekit.trainables.run_quickstart`,
:func:`tunekit.verify_experiment`, ...), it goes through
:func:`resolve_storage`; nothing below that point parses URIs again.

Accepted locations:

* a local path (``~`` is expanded, relative paths become absolute); ``None``
  means the default, ``~/tunekit_results``;
* ``file:///abs/path``;
* ``s3://bucket/prefix`` with pyarrow's query options, for instance
  ``s3://bucket/prefix?endpoint_override=http://127.0.0.1:9000&region=us-east-1``
  (also ``scheme``, ``allow_bucket_creation``, ...). Credentials come from the
  usual places (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
  ``AWS_SESSION_TOKEN``, ``~/.aws``, instance roles) and are refused in the URI,
  because Ray Tune records the URI in the experiment state;
* other URIs pyarrow knows (``gs://``, ``hdfs://``, ...);
* any ``pyarrow.fs.FileSystem`` or fsspec filesystem, passed as
  ``filesystem=`` with the path on it.

Example:
    >>> storage = resolve_storage("/tmp/tunekit_doc")
    >>> storage.path, storage.is_local
    ('/tmp/tunekit_doc', True)
    >>> storage.join("exp").uri
    '/tmp/tunekit_doc/exp'
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qsl, urlsplit

import pyarrow
import pyarrow.fs as pafs

from tunekit.errors import ConfigError, StorageError, TunekitError, first_line

__all__ = [
    "DEFAULT_STORAGE_PATH", "Storage", "check_cluster_storage", "directory_bytes", "not_s3", "probe_storage",
    "redact", "resolve_storage", "storage_errors"
]

DEFAULT_STORAGE_PATH = "~/tunekit_results"

# Query keys that would put a secret into a URI (and so into Tune's state).
_SECRET_KEY = re.compile(r"(key|secret|token|password|credential)", re.IGNORECASE)


def redact(text: str) -> str:
    """Hide secret-looking query values and ``user:password@`` in ``text``.

    >>> redact("s3://b/p?region=x&secret_key=abc")
    's3://b/p?region=x&secret_key=***'
    """
    text = re.sub(r"(://[^/@\s:]+):[^/@\s]+@", r"\1:***@", text)
    return re.sub(
        r"([?&][^=&\s]*(?:key|secret|token|password|credential)[^=&\s]*=)[^&\s]*",
        r"\1***",
        text,
        flags=re.IGNORECASE,
    )


def _join(a: str, b: str) -> str:
    """``posixpath.join(a, b)`` for a relative ``b`` (a trial's name), at a third of its cost."""
    return a + b if not a or a.endswith("/") else f"{a}/{b}"


@dataclass(frozen=True)
class Storage:
    """A resolved storage location: a pyarrow filesystem and a path on it.

    Attributes:
        filesystem: Where the bytes live.
        path: The path on ``filesystem`` (no scheme, no query).
        uri: A display form: the local path, or the URI with its query options
            (never credentials).
    """

    filesystem: pafs.FileSystem
    path: str
    uri: str

    @property
    def is_local(self) -> bool:
        return isinstance(self.filesystem, pafs.LocalFileSystem)

    def join(self, *parts: str) -> Storage:
        """The location ``parts`` below this one, on the same filesystem."""
        if len(parts) == 1 and parts[0] and not parts[0].startswith("/") and "?" not in self.uri:
            return Storage(self.filesystem, _join(self.path, parts[0]), _join(self.uri, parts[0]))  # (readers: per trial)
        path = posixpath.join(self.path, *parts)
        base, sep, query = self.uri.partition("?")
        uri = posixpath.join(base, *parts) + (sep + query if sep else "")
        return Storage(self.filesystem, path, uri)

    def run_config_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``tune.RunConfig`` (and ``Tuner.restore``).

        >>> from ray import tune
        >>> run_config = tune.RunConfig(**resolve_storage("/tmp/x").run_config_kwargs())
        """
        return {"storage_path": self.path, "storage_filesystem": self.filesystem}

    def __str__(self) -> str:
        return self.uri


def directory_bytes(fs: pafs.FileSystem, path: str) -> int:
    """The bytes of every file under ``path`` on ``fs`` (0 when it is not there), from one recursive listing."""
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return sum(info.size or 0 for info in infos if info.type == pafs.FileType.File)


@contextlib.contextmanager
def storage_errors(action: str, where: Storage | str) -> Iterator[None]:
    """Turn an error of the storage itself into one :class:`~tunekit.StorageError` line.

    ``cannot {action} {where}: {first line of the error}``, secrets redacted;
    tunekit's own errors pass through unchanged. Every reader of storage goes
    through this, so a storage failure always reads the same way.

    >>> with storage_errors("read", "s3://b/x"):
    ...     raise OSError("Access Denied\\nrequest id: 1")
    Traceback (most recent call last):
    tunekit.errors.StorageError: cannot read s3://b/x: Access Denied
    """
    try:
        yield
    except (OSError, pyarrow.ArrowException) as exc:
        if isinstance(exc, TunekitError):
            raise
        shown = where.uri if isinstance(where, Storage) else str(where)
        raise StorageError(f"cannot {action} {redact(shown)}: {redact(first_line(exc))}") from None


def _wrap_filesystem(filesystem: Any) -> pafs.FileSystem:
    if isinstance(filesystem, pafs.FileSystem):
        return filesystem
    try:
        import fsspec
    except ImportError:  # pragma: no cover - fsspec ships with the test extra
        fsspec = None
    if fsspec is not None and isinstance(filesystem, fsspec.AbstractFileSystem):
        return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem))
    raise StorageError(
        f"filesystem={type(filesystem).__name__}: expected a pyarrow.fs.FileSystem "
        "or an fsspec filesystem"
    )


def resolve_storage(
    location: str | os.PathLike[str] | Storage | None = None,
    *,
    filesystem: Any = None,
) -> Storage:
    """Resolve ``location`` into a :class:`Storage`; no I/O happens here.

    Args:
        location: A local path, a URI, a :class:`Storage`, or ``None`` for
            ``~/tunekit_results``. With ``filesystem``, the path on it.
        filesystem: A ``pyarrow.fs.FileSystem`` or fsspec filesystem.

    Raises:
        StorageError: the URI is malformed, names an unknown scheme or
            option, or carries credentials.
    """
    if isinstance(location, Storage):
        return location
    if filesystem is not None:
        fs = _wrap_filesystem(filesystem)
        if location is None or not str(location):
            raise StorageError("resolve_storage(filesystem=...): a path on that filesystem is required")
        path = str(location)
        return Storage(fs, path, f"{fs.type_name}:{path}")
    text = os.fspath(location) if location is not None else DEFAULT_STORAGE_PATH
    if not isinstance(text, str) or not text.strip():
        raise StorageError(f"storage location {location!r}: expected a path or URI")
    split = urlsplit(text)
    if not split.scheme or len(split.scheme) == 1:  # plain path (or a Windows drive)
        path = str(Path(text).expanduser().absolute())
        return Storage(pafs.LocalFileSystem(), path, path)
    shown = redact(text)
    for key, _ in parse_qsl(split.query, keep_blank_values=True):
        if _SECRET_KEY.search(key):
            raise StorageError(
                f"storage location {shown}: credentials ({key}) do not belong in the URI, "
                "which is recorded in the experiment state; set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or a profile) instead"
            )
    if "@" in split.netloc:
        raise StorageError(
            f"storage location {shown}: user information in the URI is not supported; "
            "pass credentials through the environment"
        )
    try:
        fs, path = pafs.FileSystem.from_uri(text)
    except (pyarrow.ArrowInvalid, pyarrow.ArrowNotImplementedError, ValueError) as exc:
        raise StorageError(f"storage location {shown}: {first_line(exc)}") from None
    except OSError as exc:  # S3 resolves a bucket's region over the network when the URI names none
        hint = "; add ?region=... (or endpoint_override=...) to the URI" if "region" in str(exc).lower() else ""
        raise StorageError(f"storage location {shown}: {_classify(exc)} ({first_line(exc)}){hint}") from None
    if isinstance(fs, pafs.LocalFileSystem):
        return Storage(fs, path, path)
    if split.scheme == "s3" and not split.netloc:
        raise StorageError(f"storage location {shown}: expected s3://bucket[/prefix]")
    return Storage(fs, path.rstrip("/"), shown)


def _classify(exc: BaseException) -> str:
    """Name the cause of a storage error in words a user can act on."""
    message = str(exc)
    upper = message.upper()
    if (
        "NO_SUCH_BUCKET" in upper
        or "NOSUCHBUCKET" in upper
        or "BUCKET DOES NOT EXIST" in upper
        or ("BUCKET" in upper and "NOT FOUND" in upper)
    ):
        return "no such bucket"
    if "NETWORK_CONNECTION" in upper or "COULD NOT CONNECT" in upper or "COULDN'T CONNECT" in upper:
        return "endpoint unreachable"
    if "RESOLVE" in upper and "HOST" in upper:
        return "endpoint unreachable (host name does not resolve)"
    if (
        "INVALIDACCESSKEYID" in upper
        or "INVALID_ACCESS_KEY" in upper
        or "SIGNATUREDOESNOTMATCH" in upper
        or "NO CREDENTIALS" in upper
        or "UNABLE TO LOCATE CREDENTIALS" in upper
        or "MISSING_AUTHENTICATION" in upper
    ):
        return "no valid credentials"
    if "ACCESS_DENIED" in upper or "ACCESSDENIED" in upper or "PERMISSION DENIED" in upper:
        return "permission denied"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if "READ-ONLY" in upper or "READ ONLY" in upper:
        return "read-only file system"
    if "NO SPACE" in upper:
        return "no space left"
    return redact(first_line(exc))


def not_s3(storage: Storage) -> str | None:
    """Why ``storage``'s S3 endpoint is not an S3 server (it answers HTTP, but not as S3 does: a web server, a
    proxy's page), else None; asked only once a path was not found there, so that "no such experiment" is not
    said of an endpoint that holds no buckets at all."""
    import urllib.error
    import urllib.parse
    import urllib.request

    if storage.filesystem.type_name.rpartition("+")[2] != "s3" or "endpoint_override=" not in storage.uri:
        return None
    query = urllib.parse.parse_qs(storage.uri.partition("?")[2])
    endpoint = (query.get("endpoint_override") or [""])[0]
    if not endpoint:
        return None
    url = endpoint if "://" in endpoint else f"http://{endpoint}"
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:  # noqa: S310 - the user's own endpoint
            headers, body = reply.headers, reply.read(2048)
    except urllib.error.HTTPError as reply:  # an S3 server refuses an anonymous listing in XML
        headers, body = reply.headers, reply.read(2048)
    except (OSError, ValueError):
        return None  # unreachable: the storage error says so elsewhere
    speaks = any(k.lower().startswith("x-amz-") for k in headers) or b"<?xml" in body[:100] or b"<Error>" in body
    if speaks:
        return None
    kind = headers.get("Content-Type", "no content type")
    return (f"{endpoint} does not speak S3 (it answered with {kind}, not an S3 reply); expected the address of "
            "an S3-compatible server (endpoint_override=http://host:port)")


def probe_storage(storage: Storage) -> None:
    """Check that ``storage`` is reachable and writable, before any trial starts.

    Creates the directory, writes, reads back and deletes a small marker file.

    Raises:
        StorageError: naming the location and the cause (no such bucket, no
            valid credentials, permission denied, endpoint unreachable, ...).
    """
    fs, base = storage.filesystem, storage.path
    marker = posixpath.join(base, f".tunekit-probe-{uuid.uuid4().hex}")
    payload = b"tunekit storage probe\n"
    step = "create the directory"
    try:
        info = fs.get_file_info(base)
        if info.type == pafs.FileType.File:
            raise StorageError(f"storage location {storage.uri}: is a file, expected a directory")
        if info.type == pafs.FileType.NotFound:
            fs.create_dir(base, recursive=True)
        step = "write"
        with fs.open_output_stream(marker) as out:
            out.write(payload)
        step = "read back"
        with fs.open_input_stream(marker) as inp:
            back = inp.read()
        if back != payload:
            raise StorageError(
                f"storage location {storage.uri}: a file written there read back differently"
            )
        step = "delete"
        fs.delete_file(marker)
    except StorageError:
        raise
    except (OSError, pyarrow.ArrowException) as exc:
        raise StorageError(
            f"storage location {storage.uri} is not usable: {_classify(exc)} "
            f"(could not {step}: {redact(first_line(exc))})"
        ) from None


def check_cluster_storage(storage: Storage, *, shared: bool = False, nodes: int | None = None) -> None:
    """Refuse a local storage path on a multi-node Ray cluster, before any trial starts.

    Trials on other nodes write their checkpoints to the storage path; a path
    on the driver's disk is not there for them (Ray would fail at the first
    checkpoint of a remote trial). ``shared=True`` says the path is a shared
    filesystem mounted at the same place on every node (NFS, EFS, Lustre).

    Args:
        storage: Where the experiment goes.
        shared: The local path is a shared mount on every node.
        nodes: Alive nodes in the cluster (default: asked from the running Ray).

    Raises:
        ConfigError: local storage, not declared shared, and more than one node.
    """
    if not storage.is_local or shared:
        return
    if nodes is None:
        import ray

        nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    if nodes > 1:
        raise ConfigError(
            f"storage {storage.uri} is a local path, but the Ray cluster has {nodes} nodes: trials on "
            "other nodes cannot write their checkpoints there; use cloud storage (s3://bucket/prefix) "
            "or a shared filesystem mounted at the same path on every node (and say so: --shared-storage)"
        )
