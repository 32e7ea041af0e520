"""Multipart uploads a kill left open under an experiment on S3.

A worker (or a whole node) killed while it uploads a large file leaves that file's multipart upload neither
completed nor aborted: its parts stay in the bucket, billed and invisible to listings. pyarrow has no call to
list them; boto3 has (``pip install 'tunekit[s3]'``). :func:`open_uploads` lists those under an experiment's
prefix, :func:`abort_uploads` aborts them. Only while nothing writes to the experiment: ``tunekit resume``
(under the experiment's lease) and ``tunekit gc --leftovers`` (which refuses while the run's driver runs).

Tested in ``tests/tunekit/test_gc.py`` and ``tests/tunekit/test_resume.py``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from tunekit.storage import Storage

__all__ = ["CANNOT_LIST", "abort_uploads", "open_uploads"]

#: Said when the uploads cannot be listed (boto3 is not installed).
CANNOT_LIST = ("interrupted multipart uploads (a kill during an upload leaves them) cannot be listed without boto3: "
               "pip install 'tunekit[s3]', or give the bucket the lifecycle rule AbortIncompleteMultipartUpload")


def _client(storage: Storage) -> tuple[Any, str, str] | None:
    """``(boto3 S3 client, bucket, key prefix)`` for an S3 ``storage``; None when there is no boto3."""
    try:
        import boto3
    except ImportError:
        return None
    query = parse_qs(storage.uri.partition("?")[2])
    endpoint = (query.get("endpoint_override") or [None])[0]
    if endpoint and "://" not in endpoint:
        endpoint = f"{(query.get('scheme') or ['https'])[0]}://{endpoint}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name=(query.get("region") or [None])[0])
    bucket, _, prefix = storage.path.partition("/")
    return client, bucket, prefix.strip("/") + "/" if prefix.strip("/") else ""


def open_uploads(storage: Storage) -> list[tuple[str, str]] | None:
    """The open multipart uploads under experiment ``storage``: ``(key, upload id)`` each, the key relative to the
    experiment; ``[]`` where there are none or the storage is not S3; None where they cannot be listed (no boto3)."""
    if storage.filesystem.type_name.rpartition("+")[2] != "s3":
        return []
    found = _client(storage)
    if found is None:
        return None
    client, bucket, prefix = found
    out = []
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
        out += [(u["Key"][len(prefix):], u["UploadId"]) for u in page.get("Uploads", [])]
    return out


def abort_uploads(storage: Storage, uploads: list[tuple[str, str]]) -> int:
    """Abort ``uploads`` (from :func:`open_uploads`) of experiment ``storage``; returns how many were aborted (one
    that completed or was aborted meanwhile is not counted)."""
    found = _client(storage) if uploads else None
    if found is None:
        return 0
    client, bucket, prefix = found
    aborted = 0
    for key, upload_id in uploads:
        try:
            client.abort_multipart_upload(Bucket=bucket, Key=prefix + key, UploadId=upload_id)
            aborted += 1
        except client.exceptions.NoSuchUpload:
            pass
    return aborted
