"""Ways to damage a checkpoint directory in place, on any pyarrow filesystem."""

from __future__ import annotations

import posixpath

import pyarrow.fs as pafs

from tunekit.checkpoint import MANIFEST_FILE, METADATA_FILE, STATE_FILE

FILES = (STATE_FILE, METADATA_FILE, MANIFEST_FILE)


def _read(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as stream:
        return stream.read()


def _write(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    with fs.open_output_stream(path) as out:
        out.write(data)


def truncate(fs, path):
    data = _read(fs, posixpath.join(path, STATE_FILE))
    _write(fs, posixpath.join(path, STATE_FILE), data[: len(data) // 2])


def flip_byte(fs, path, name=STATE_FILE, *, this_copy_only=False):
    """Flip the bits of one byte in the middle of a file of the checkpoint.

    The file is rewritten in place, so a checkpoint hard-linked to it (a second
    save of the same iteration, a kept copy) is damaged too, as bit rot would
    damage it. ``this_copy_only``: write a new file instead, leaving such twins whole.
    """
    file = posixpath.join(path, name)
    data = bytearray(_read(fs, file))
    data[len(data) // 2] ^= 0xFF
    if this_copy_only:
        fs.delete_file(file)
    _write(fs, file, bytes(data))


def delete_file(fs, path):
    fs.delete_file(posixpath.join(path, METADATA_FILE))


def delete_manifest(fs, path):
    fs.delete_file(posixpath.join(path, MANIFEST_FILE))


def half_copy(fs, path):
    """Replace the directory by what an interrupted copy leaves: files in name order, the last one cut."""
    contents = {name: _read(fs, posixpath.join(path, name)) for name in FILES}
    fs.delete_dir_contents(path)
    _write(fs, posixpath.join(path, MANIFEST_FILE), contents[MANIFEST_FILE])
    _write(fs, posixpath.join(path, STATE_FILE), contents[STATE_FILE][: len(contents[STATE_FILE]) // 3])


def copy_experiment(source, where: str):
    """A copy of the experiment directory ``source`` at ``where`` (a local path or an S3 URI): its Storage."""
    from tunekit.storage import resolve_storage

    target = resolve_storage(where)
    pafs.copy_files(str(source), target.path, destination_filesystem=target.filesystem)
    return target
