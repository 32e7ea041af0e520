"""Storage resolution and the up-front probe, against real local disk and a real S3 server."""

from __future__ import annotations

import fsspec
import pyarrow.fs as pafs
import pytest

from tests.conftest import S3_SECRET
from tunekit import Storage, StorageError, probe_storage, resolve_storage


def test_default_location_is_under_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    storage = resolve_storage(None)
    assert storage.is_local and storage.path == str(tmp_path / "tunekit_results")


def test_relative_and_tilde_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_storage("runs").path == str(tmp_path / "runs")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_storage("~/x").path == str(tmp_path / "home" / "x")
    assert resolve_storage(f"file://{tmp_path}/y").path == f"{tmp_path}/y"


def test_s3_uri_keeps_options_for_display_and_strips_them_from_the_path():
    storage = resolve_storage("s3://bucket/a/b?endpoint_override=http://127.0.0.1:9&region=eu-west-1")
    assert isinstance(storage.filesystem, pafs.S3FileSystem)
    assert storage.path == "bucket/a/b"
    assert storage.join("exp").uri == "s3://bucket/a/b/exp?endpoint_override=http://127.0.0.1:9&region=eu-west-1"
    assert storage.join("exp").path == "bucket/a/b/exp"


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("s3://bucket/p?secret_key=" + S3_SECRET, "credentials (secret_key) do not belong in the URI"),
        ("s3://bucket/p?access_key=AKIA&region=x", "credentials (access_key)"),
        ("s3://user:" + S3_SECRET + "@bucket/p", "user information in the URI"),
        ("s3://bucket/p?colour=blue", "Unexpected query parameter"),
        ("nosuchfs://x/y", "Unrecognized filesystem type"),
        ("   ", "expected a path or URI"),
    ],
)
def test_bad_locations_are_refused_in_one_line_without_secrets(uri, expected):
    with pytest.raises(StorageError) as info:
        resolve_storage(uri)
    message = str(info.value)
    assert expected in message and len(message.splitlines()) == 1
    assert S3_SECRET not in message


def test_pyarrow_and_fsspec_filesystems_are_accepted(tmp_path):
    local = resolve_storage(str(tmp_path / "pa"), filesystem=pafs.LocalFileSystem())
    probe_storage(local)
    assert (tmp_path / "pa").is_dir() and not list((tmp_path / "pa").iterdir())

    memory = fsspec.filesystem("memory")
    storage = resolve_storage("/tunekit-test/runs", filesystem=memory)
    assert isinstance(storage.filesystem, pafs.PyFileSystem)
    probe_storage(storage)
    assert memory.exists("/tunekit-test/runs")
    with pytest.raises(StorageError, match="expected a pyarrow.fs.FileSystem or an fsspec filesystem"):
        resolve_storage("/x", filesystem=object())


def test_probe_refuses_a_file_and_leaves_it_alone(tmp_path):
    target = tmp_path / "results"
    target.write_text("precious")
    with pytest.raises(StorageError, match="is a file, expected a directory"):
        probe_storage(resolve_storage(str(target)))
    assert target.read_text() == "precious"


def test_probe_on_s3_writes_and_cleans_up(s3_bucket):
    probe_storage(resolve_storage(s3_bucket.uri("runs")))
    assert [k for k in s3_bucket.keys() if ".tunekit-probe" in k] == []


def test_probe_names_a_missing_bucket(s3_bucket):
    uri = s3_bucket.uri("runs").replace(s3_bucket.name, s3_bucket.name + "-missing", 1)
    with pytest.raises(StorageError) as info:
        probe_storage(resolve_storage(uri))
    message = str(info.value)
    assert "no such bucket" in message and s3_bucket.name + "-missing" in message
    assert len(message.splitlines()) == 1 and S3_SECRET not in message


def test_probe_names_an_unreachable_endpoint(s3_bucket):
    s3_bucket.server.stop()
    try:
        with pytest.raises(StorageError) as info:
            probe_storage(resolve_storage(s3_bucket.uri("runs")))
    finally:
        s3_bucket.server.start()
    message = str(info.value)
    assert "endpoint unreachable" in message and s3_bucket.server.endpoint in message
    assert S3_SECRET not in message


def test_storage_is_a_plain_value():
    storage = resolve_storage("/tmp/a")
    assert storage == Storage(storage.filesystem, "/tmp/a", "/tmp/a") or storage.path == "/tmp/a"
    assert resolve_storage(storage) is storage
    kwargs = storage.run_config_kwargs()
    assert kwargs["storage_path"] == "/tmp/a" and isinstance(kwargs["storage_filesystem"], pafs.LocalFileSystem)


def test_a_large_file_on_s3_is_read_in_one_request_and_a_missing_one_in_none(s3_bucket):
    """Ray's experiment state of a large sweep is megabytes: read as a stream it costs a request per 256 KiB."""
    from tunekit.storage._files import file_bytes

    where = resolve_storage(s3_bucket.uri("exp"))
    data = bytes(range(256)) * 4096 * 3  # 3 MiB
    with where.filesystem.open_output_stream(where.join("state.json").path) as out:
        out.write(data)
    with s3_bucket.server.recording() as seen:
        assert file_bytes(where.filesystem, where.join("state.json").path) == data
    assert [r.split()[0] for r in seen].count("GET") == 1, seen
    assert file_bytes(where.filesystem, where.join("none.json").path) is None
    assert file_bytes(where.filesystem, where.path) is None  # (a directory: no file there)
