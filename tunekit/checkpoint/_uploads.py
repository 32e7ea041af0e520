"""Multipart uploads a kill left open under an experiment on S3.

A worker (or a whole node) killed while it uploads a large file leaves that file's multipart upload neither
completed nor aborted: its parts stay in the bucket, billed and invisible to listings. pyarrow has no call to
list them; boto3 has (``pip install 'tunekit[s3]'``). :func:`open_uploads` lists those under an experiment's
prefix, :func:`abort_uploads` aborts them. Only while nothing writes to the experiment: ``tunekit resume``
(under the experiment's lease) and ``tunekit gc --leftovers`` (which refuses while the run's driver runs).
A trial's worker aborts those into its own checkpoint directories at its first save
(:func:`abort_checkpoint_uploads`): only that trial's worker writes there, one save at a time.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from tunekit.checkpoint._trial_dir import CHECKPOINT_DIR
from tunekit.storage._location import Storage

__all__ = ["CANNOT_LIST", "abort_checkpoint_uploads", "abort_uploads", "open_uploads"]

#: Said when the uploads cannot be listed (boto3 is not installed).
CANNOT_LIST = ("interrupted multipart uploads (a kill during an upload leaves them) cannot be listed without boto3: "
               "pip install 'tunekit[s3]', or give the bucket the lifecycle rule AbortIncompleteMultipartUpload")


def _boto3(endpoint: str | None, scheme: str | None, region: str | None, **credentials: str | None) -> Any:
    """A boto3 S3 client for pyarrow's way of naming an endpoint (``host:port`` plus a scheme); None when
    there is no boto3. Credentials not given come from boto3's own chain (the environment, a profile)."""
    try:
        import boto3
    except ImportError:
        return None
    if endpoint and "://" not in endpoint:
        endpoint = f"{scheme or 'https'}://{endpoint}"
    return boto3.client("s3", endpoint_url=endpoint or None, region_name=region or None,
                        **{k: v for k, v in credentials.items() if v})


def _split(path: str) -> tuple[str, str]:
    """``bucket/a/b`` -> ``("bucket", "a/b/")`` (a key prefix: empty for the whole bucket)."""
    bucket, _, prefix = path.partition("/")
    return bucket, prefix.strip("/") + "/" if prefix.strip("/") else ""


def _client(storage: Storage) -> tuple[Any, str, str] | None:
    """``(boto3 S3 client, bucket, key prefix)`` for an S3 ``storage``; None when there is no boto3."""
    query = {k: v[0] for k, v in parse_qs(storage.uri.partition("?")[2]).items()}
    client = _boto3(query.get("endpoint_override"), query.get("scheme"), query.get("region"))
    return None if client is None else (client, *_split(storage.path))


def _list(client: Any, bucket: str, prefix: str) -> list[tuple[str, str]]:
    """The open multipart uploads under ``prefix``: ``(key relative to it, upload id)`` each."""
    out = []
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
        out += [(u["Key"][len(prefix):], u["UploadId"]) for u in page.get("Uploads", [])]
    return out


def _abort(client: Any, bucket: str, prefix: str, uploads: list[tuple[str, str]]) -> int:
    aborted = 0
    for key, upload_id in uploads:
        try:
            client.abort_multipart_upload(Bucket=bucket, Key=prefix + key, UploadId=upload_id)
            aborted += 1
        except client.exceptions.NoSuchUpload:
            pass
    return aborted


def open_uploads(storage: Storage) -> list[tuple[str, str]] | None:
    """The open multipart uploads under experiment ``storage``: ``(key, upload id)`` each, the key relative to the
    experiment; ``[]`` where there are none or the storage is not S3; None where they cannot be listed (no boto3)."""
    if storage.filesystem.type_name.rpartition("+")[2] != "s3":
        return []
    found = _client(storage)
    if found is None:
        return None
    return _list(*found)


def abort_uploads(storage: Storage, uploads: list[tuple[str, str]]) -> int:
    """Abort ``uploads`` (from :func:`open_uploads`) of experiment ``storage``; returns how many were aborted (one
    that completed or was aborted meanwhile is not counted)."""
    found = _client(storage) if uploads else None
    if found is None:
        return 0
    return _abort(*found, uploads)


def abort_checkpoint_uploads(filesystem: Any, trial_path: str) -> int:
    """Abort the multipart uploads open in trial ``trial_path``'s own checkpoint directories
    (``checkpoint_N/...``: not pins, not a multi-worker run's ``train/``) on pyarrow S3 ``filesystem``.

    For the trial's worker at its first save, when none of its own uploads is open: those are an earlier
    worker's, killed inside an upload. Returns how many were aborted; 0 on other filesystems or without boto3.
    """
    import pyarrow.fs as pafs

    if not isinstance(filesystem, pafs.S3FileSystem):
        return 0
    named = filesystem.__reduce__()[1][0]  # (the arguments it was made with: how pyarrow pickles it)
    client = _boto3(named.get("endpoint_override"), named.get("scheme"), named.get("region"),
                    aws_access_key_id=named.get("access_key"), aws_secret_access_key=named.get("secret_key"),
                    aws_session_token=named.get("session_token"))
    if client is None:
        return 0
    bucket, prefix = _split(trial_path)
    return _abort(client, bucket, prefix, [u for u in _list(client, bucket, prefix)
                                           if CHECKPOINT_DIR.match(u[0].partition("/")[0]) and "/" in u[0]])
