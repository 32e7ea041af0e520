"""Every kind of damage to a real checkpoint is detected, by verify and by load, locally and on S3."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import pyarrow.fs as pafs
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support.faults import FILES, delete_file, delete_manifest, flip_byte, half_copy, truncate
from tunekit import (
    CheckpointError,
    load_model,
    read_state,
    resolve_storage,
    verify_checkpoint,
    write_checkpoint,
)
from tunekit.checkpoint import MANIFEST_FILE, METADATA_FILE, STATE_FILE, confirm_upload
from tunekit.storage import Storage
from tunekit.trainables.digits import build_digits_state, digits_model, train_steps


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A real checkpoint of the digits MLP after a few SGD steps."""
    state = build_digits_state({"seed": 3, "hidden_size": 16}, torch.device("cpu"))
    train_steps(state, 5)
    directory = tmp_path_factory.mktemp("pristine") / "checkpoint_000004"
    write_checkpoint(directory, state.state_dict(), metadata={"iteration": 5})
    return directory


FAULTS: dict[str, tuple[Callable, str]] = {
    "truncated file": (truncate, "corrupt"),
    "flipped byte": (flip_byte, "corrupt"),
    "deleted file": (delete_file, "corrupt"),
    "deleted manifest": (delete_manifest, "incomplete"),
    "half-copied directory": (half_copy, "corrupt"),
}


@pytest.fixture(params=["local", "s3"])
def place(request, tmp_path) -> Callable[[Path], Storage]:
    """Put a copy of a checkpoint on local disk or on the S3 server; return where it is."""

    def put(source: Path) -> Storage:
        if request.param == "local":
            target = tmp_path / source.name
            shutil.copytree(source, target)
            return resolve_storage(str(target))
        bucket = request.getfixturevalue("s3_bucket")
        storage = resolve_storage(bucket.uri("ckpts", source.name))
        pafs.copy_files(str(source), storage.path, destination_filesystem=storage.filesystem)
        return storage

    return put


def test_pristine_checkpoint_is_good_everywhere(pristine, place):
    where = place(pristine)
    assert verify_checkpoint(where).status == "good"
    model = load_model(where, digits_model(16))
    expected = read_state(pristine)["models"]
    assert all(torch.equal(v, expected["model"][k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_is_detected_by_verify_and_by_load(fault, pristine, place):
    damage, expected_status = FAULTS[fault]
    where = place(pristine)
    damage(where.filesystem, where.path)
    report = verify_checkpoint(where)
    assert report.status == expected_status, report
    assert report.problems and where.path.split("/")[-1] in report.path
    with pytest.raises(CheckpointError, match=expected_status):
        read_state(where)
    with pytest.raises(CheckpointError):
        load_model(where, digits_model(16))


# -- property: any corruption of any file is detected ---------------------------------

corruptions = st.one_of(
    st.tuples(st.just("truncate"), st.sampled_from(FILES), st.floats(0, 0.999)),
    st.tuples(st.just("flip"), st.sampled_from(FILES), st.tuples(st.floats(0, 0.999), st.integers(1, 255))),
    st.tuples(st.just("delete"), st.sampled_from(FILES), st.none()),
    st.tuples(st.just("append"), st.sampled_from(FILES), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("insert"), st.sampled_from(FILES), st.tuples(st.floats(0, 1), st.binary(min_size=1, max_size=16))),
    st.tuples(
        st.just("overwrite"), st.sampled_from(FILES), st.tuples(st.floats(0, 0.999), st.binary(min_size=1, max_size=32))
    ),
)


def _corrupt(directory: Path, kind: str, name: str, arg) -> bool:
    """Apply one corruption; False if it happened to change nothing."""
    file = directory / name
    data = file.read_bytes()
    if kind == "delete":
        file.unlink()
        return True
    if kind == "truncate":
        new = data[: int(arg * len(data))]
    elif kind == "flip":
        pos, mask = arg
        new = bytearray(data)
        new[int(pos * len(data))] ^= mask
        new = bytes(new)
    elif kind == "append":
        new = data + arg
    elif kind == "insert":
        pos, extra = arg
        cut = int(pos * len(data))
        new = data[:cut] + extra + data[cut:]
    else:
        pos, patch = arg
        start = int(pos * len(data))
        new = data[:start] + patch + data[start + len(patch) :]
        new = new[: max(len(data), start + len(patch))]
    file.write_bytes(new)
    return new != data


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corruption=corruptions)
# Changes that keep the JSON meaning: only the canonical-form check sees them.
@example(corruption=("append", MANIFEST_FILE, b" "))
@example(corruption=("flip", MANIFEST_FILE, (0.99999, 0x2A)))  # trailing newline -> space
@example(corruption=("append", METADATA_FILE, b"\n"))
def test_every_random_corruption_is_detected(pristine, corruption):
    kind, name, arg = corruption
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / pristine.name
        shutil.copytree(pristine, directory)
        if not _corrupt(directory, kind, name, arg):
            return  # e.g. overwriting bytes with the same bytes: nothing to detect
        assert verify_checkpoint(directory).status in ("corrupt", "incomplete")
        with pytest.raises(CheckpointError):
            read_state(directory)


@pytest.mark.parametrize("fault", ["truncated file", "deleted file", "deleted manifest", "half-copied directory"])
def test_confirm_upload_catches_a_checkpoint_that_did_not_arrive_whole(fault, pristine, s3_bucket):
    where = resolve_storage(s3_bucket.uri("ckpts", pristine.name))
    pafs.copy_files(str(pristine), where.path, destination_filesystem=where.filesystem)
    confirm_upload(where)  # whole: no error
    FAULTS[fault][0](where.filesystem, where.path)
    with pytest.raises(CheckpointError, match="did not arrive whole"):
        confirm_upload(where)


def test_checkpoint_written_for_background_sync_is_good_and_hashes_match_the_files(tmp_path):
    """durable=False: the streamed hashes are those of the bytes on disk; fsync later."""
    from tunekit.trial._saving import Durability

    state = build_digits_state({"seed": 4, "hidden_size": 16}, torch.device("cpu"))
    train_steps(state, 3)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "user.txt").write_text("rides along")  # a user file is listed too
    directory = write_checkpoint(tmp_path / "ckpt", state.state_dict(), metadata={"iteration": 3}, durable=False)
    durability = Durability()
    durability.sync(directory)
    durability.wait()
    report = verify_checkpoint(str(directory))
    assert report.status == "good", report.problems
    flip_byte(pafs.LocalFileSystem(), str(directory), "user.txt")
    assert verify_checkpoint(str(directory)).status == "corrupt"


def test_in_place_save_leaves_only_committed_checkpoints(ray_session, storage):
    """TorchTrainable on local storage writes each checkpoint once, beside its final place."""
    from ray import tune

    from tunekit.trainables import DigitsTrainable

    grid = tune.Tuner(
        DigitsTrainable,
        param_space={"hidden_size": 16, "steps_per_iteration": 2, "seed": 1},
        run_config=tune.RunConfig(name="inplace", storage_path=str(storage), stop={"training_iteration": 4},
                                  checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1), verbose=0),
    ).fit()
    assert not grid.errors
    trial_dir = Path(grid[0].path)
    names = sorted(p.name for p in trial_dir.iterdir() if p.is_dir())
    assert names == [f"checkpoint_00000{i}" for i in range(4)], names  # no leftover .partial directories
    assert all(verify_checkpoint(str(trial_dir / n)).status == "good" for n in names)
    restored = read_state(str(trial_dir / names[-1]))
    assert restored["counters"]["iteration"] == 4


# -- manifest formats: v2 (the previous release) still verifies; a newer one is "unsupported" -------

V2_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "v2_checkpoint"


def test_checkpoint_of_the_previous_release_verifies_and_restores(place):
    from tests.fixtures.make_v2_checkpoint import fixture_state
    from tunekit import TrainingState

    assert b'"format":"tunekit-manifest/2"' in (V2_FIXTURE / MANIFEST_FILE).read_bytes()
    where = place(V2_FIXTURE)
    assert verify_checkpoint(where).status == "good"
    # The exact values are the fixture's own, as torch reads them (not tunekit's reader): the
    # seeded state rebuilt here matches them only to rounding, which depends on the CPU's kernels
    # (a CI machine with AVX-512 differed in the last bit from the one that wrote the fixture).
    saved = torch.load(V2_FIXTURE / "state.pt", weights_only=True)
    expected = fixture_state()
    # Restore into a fresh state of the same shape (other weights): it must become the saved one.
    target = fixture_state()
    torch.nn.init.zeros_(target.models["model"].weight)
    TrainingState.load_state_dict(target, read_state(where))
    for name, value in saved["models"]["model"].items():
        assert torch.equal(target.models["model"].state_dict()[name], value), name
        assert torch.allclose(expected.models["model"].state_dict()[name], value, atol=1e-6), name
    saved_moments = [v["momentum_buffer"] for v in saved["optimizers"]["sgd"]["state"].values()]
    moments = [v["momentum_buffer"] for v in target.optimizers["sgd"].state_dict()["state"].values()]
    assert len(moments) == len(saved_moments) == 2
    assert all(torch.equal(a, b) for a, b in zip(moments, saved_moments))
    assert target.counters.iteration == 3
    # A flipped byte in a v2 checkpoint is still found (by SHA-256, as that release wrote it).
    flip_byte(where.filesystem, where.path, "state.pt")
    report = verify_checkpoint(where)
    assert report.status == "corrupt" and "state.pt: SHA-256 differs" in report.describe()


def _as_newer_format(directory: Path, version: int) -> None:
    """Rewrite a checkpoint's manifest as a (hypothetical) newer tunekit would: another format version."""
    import json

    manifest = json.loads((directory / MANIFEST_FILE).read_bytes())
    manifest["format"] = f"tunekit-manifest/{version}"
    manifest["files"] = {k: {"size": v["size"], "sha3_512": "0" * 128} for k, v in manifest["files"].items()}
    (directory / MANIFEST_FILE).write_bytes(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())


def test_a_newer_manifest_format_is_unsupported_not_corrupt(pristine, tmp_path, capsys):
    from tunekit.cli import main
    from tunekit.trial._restoring import prepare_restore

    trial = tmp_path / "exp" / "trial_0"
    older, newer = trial / "checkpoint_000000", trial / "checkpoint_000001"
    shutil.copytree(pristine, older)
    shutil.copytree(pristine, newer)
    (trial / "result.json").write_text("{}\n")
    _as_newer_format(newer, 4)
    report = verify_checkpoint(str(newer))
    assert report.status == "unsupported", report
    assert "newer tunekit" in report.describe() and "tunekit-manifest/4" in report.describe()
    with pytest.raises(CheckpointError, match="newer tunekit") as info:
        read_state(str(newer))
    assert len(str(info.value).splitlines()) == 1
    # Restore does not silently fall back to the older checkpoint: the newer one is not damaged.
    with pytest.raises(CheckpointError, match="newer tunekit"):
        prepare_restore(str(newer))
    assert main(["verify", str(tmp_path / "exp")]) == 1
    out = capsys.readouterr().out
    assert "checkpoint_000001" in out and "unsupported: written by a newer tunekit" in out
    assert "1 good, 0 incomplete, 0 corrupt, 1 unsupported" in out
    assert main(["status", str(tmp_path / "exp")]) == 0
    assert "checkpoint_000001 is unsupported: written by a newer tunekit" in capsys.readouterr().out


def test_a_donors_deleted_checkpoint_never_carries_the_clone_past_the_iteration_pbt_chose(tmp_path):
    """Ray's own PBT (no pin) chose a donor checkpoint that num_to_keep deleted before the clone read it: the
    donor's newest before it stands in, else the clone's own newest (the exploit undone), and only then the
    donor's newer ones, oldest first."""
    from tunekit.trial._restoring import prepare_restore

    exp = tmp_path / "exp"

    def ckpt(trial: str, index: int) -> Path:
        directory = exp / trial / f"checkpoint_{index:06d}"
        write_checkpoint(directory, {"counters": {"iteration": 2 * index + 2}}, metadata={"iteration": 2 * index + 2})
        return directory

    def restored(requested: Path) -> str:
        result, temps = prepare_restore(str(requested), trial_dir=str(exp / "clone"))
        assert not temps
        return Path(result.checkpoint.path).relative_to(exp).as_posix()

    ckpt("donor", 5), ckpt("donor", 7)
    ckpt("clone", 2)
    assert restored(exp / "donor" / "checkpoint_000004") == "clone/checkpoint_000002"
    ckpt("donor", 3)
    assert restored(exp / "donor" / "checkpoint_000004") == "donor/checkpoint_000003"
    shutil.rmtree(exp / "donor" / "checkpoint_000003"), shutil.rmtree(exp / "clone")
    assert restored(exp / "donor" / "checkpoint_000004") == "donor/checkpoint_000005"
    # the trial's own deleted checkpoint: its newest good one, newer ones included (as before)
    ckpt("clone", 1)
    ckpt("clone", 6)
    assert restored(exp / "clone" / "checkpoint_000004") == "clone/checkpoint_000006"


@pytest.mark.skipif(not hasattr(torch.serialization, "set_crc32_options"), reason="torch < 2.5 has no CRC32 switch")
def test_a_checkpoint_skips_torch_crc32_and_leaves_the_users_setting_as_it_was(tmp_path):
    """state.pt is written without the zip CRC32 (XXH3 covers it); torch.load reads it; torch.save keeps its CRC."""
    import zipfile

    state = {"w": torch.arange(1000, dtype=torch.float32)}
    for users_setting in (True, False):
        torch.serialization.set_crc32_options(users_setting)
        try:
            directory = write_checkpoint(tmp_path / f"ckpt{users_setting}", state, durable=False)
            assert torch.serialization.get_crc32_options() is users_setting
        finally:
            torch.serialization.set_crc32_options(True)
        assert verify_checkpoint(str(directory)).status == "good"
        assert torch.equal(torch.load(directory / "state.pt", weights_only=True)["w"], state["w"])
        with zipfile.ZipFile(directory / "state.pt") as archive:
            crcs = {info.filename.rsplit("/", 1)[-1]: info.CRC for info in archive.infolist()}
        assert crcs["0"] == 0  # the tensor's record: no CRC32 computed
    torch.save(state, tmp_path / "users.pt")  # the user's own torch.save still computes it
    with zipfile.ZipFile(tmp_path / "users.pt") as archive:
        assert archive.testzip() is None


def test_verify_hashes_locally_and_sizes_alone_with_sizes(pristine, tmp_path, capsys):
    """`tunekit verify` on a local disk hashes every file (a flipped byte is corrupt); `--sizes` checks sizes
    alone (the flipped byte passes, a cut file does not); each says in its last line which it did."""
    from tunekit.cli import main

    trial = tmp_path / "exp" / "trial_0"
    shutil.copytree(pristine, trial / "checkpoint_000000")
    (trial / "result.json").write_text("{}\n")
    state = trial / "checkpoint_000000" / STATE_FILE
    data = state.read_bytes()
    state.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert main(["verify", str(tmp_path / "exp")]) == 1
    out = capsys.readouterr().out
    assert "corrupt" in out and "differs from manifest" in out and "size and hash" in out
    assert main(["verify", str(tmp_path / "exp"), "--sizes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hashed"] is False
    state.write_bytes(data[:-1])
    assert main(["verify", str(tmp_path / "exp"), "--sizes"]) == 1
    out = capsys.readouterr().out
    assert "manifest says" in out and "no file's bytes read" in out
    assert main(["verify", str(tmp_path / "exp"), "--full", "--sizes"]) == 2  # (one or the other)
