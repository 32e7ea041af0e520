from __future__ import annotations

import subprocess
import sys

import pytest

from tunekit.cli import main


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "quickstart" in capsys.readouterr().out


def test_quickstart_help_lists_options(capsys):
    with pytest.raises(SystemExit):
        main(["quickstart", "--help"])
    out = capsys.readouterr().out
    for option in ("--num-samples", "--max-iterations", "--storage-path", "--name", "--cpus", "--gpus-per-trial"):
        assert option in out


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["quickstart", "--bogus"], "unrecognized arguments: --bogus"),
        (["quickstart", "--num-samples", "0"], "--num-samples: 0 must be >= 1"),
        (["quickstart", "--num-samples", "many"], "'many' is not an integer"),
        (["quickstart", "--gpus-per-trial", "-1"], "-1 must be >= 0"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "usage: tunekit"),
    ],
)
def test_bad_usage_exits_2_with_one_line(argv, fragment, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err
    if argv:
        assert len(err.strip().splitlines()) == 1, err


def test_storage_path_that_is_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "a-file"
    target.write_text("keep me")
    assert main(["quickstart", "--storage-path", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a file, expected a directory" in err and len(err.splitlines()) == 1
    assert target.read_text() == "keep me"


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "tunekit.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "quickstart" in out.stdout
