from __future__ import annotations

import os
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


# What a new user types wrong, and the one line each gets (exit 2; nothing written).
# {exp} is the quickstart's experiment, {file} a file of the user's, {tmp} a fresh directory.
BAD_INPUT = [
    (["quickstart", "--address", "127.0.0.1:1"], "quickstart(address='127.0.0.1:1'): no Ray cluster answers there"),
    (["quickstart", "--address", "127.0.0.1:1", "--cpus", "2"], "--cpus is for a local Ray"),
    (["status", "s3://tunekit-no-such-bucket-x/exp"], "s3://tunekit-no-such-bucket-x/exp"),
    (["verify", "s3://tunekit-no-such-bucket-x/exp"], "s3://tunekit-no-such-bucket-x/exp"),
    (["report", "s3://tunekit-no-such-bucket-x/exp"], "s3://tunekit-no-such-bucket-x/exp"),
    (["quickstart", "--storage-path", "s3://tunekit-no-such-bucket-x/runs"], "s3://tunekit-no-such-bucket-x/runs"),
    (["report", "{exp}", "--output", "/proc/x"], "--output /proc/x: cannot write there"),
    (["report", "{exp}", "--output", "{file}"], "is a file; expected a directory to write the report into"),
    (["status", "{exp}", "--metric", "acuracy", "--mode", "max"],
     "--metric: no trial reported metric 'acuracy'; the trials reported: accuracy, loss, train_loss"),
    (["report", "{exp}", "--metric", "acuracy", "--mode", "max", "--output", "{tmp}"],
     "--metric: no trial reported metric 'acuracy'; the trials reported: accuracy, loss, train_loss"),
    (["resume", "{exp}", "--trainable", "tunekit.trainables:load_digits_data"],
     "load_digits_data is not a Tune trainable: expected a Trainable class or a training function"),
    (["resume", "{exp}", "--trainable", "no_such_module:Thing"], "cannot import no_such_module"),
    (["resume", "{exp}", "--trainable", "DigitsTrainable"], "expected module:attr"),
]


@pytest.mark.parametrize("argv, expected", BAD_INPUT, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_input_gets_one_line_and_changes_nothing(argv, expected, quickstart_experiment, tmp_path, capsys):
    users_file = tmp_path / "notes.txt"
    users_file.write_text("mine")
    listing = sorted(str(p) for p in quickstart_experiment.rglob("*"))
    argv = [a.format(exp=quickstart_experiment, file=users_file, tmp=tmp_path / "out") for a in argv]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("reading ")]
    assert len(err) == 1 and expected in err[0], err
    assert users_file.read_text() == "mine"
    assert sorted(str(p) for p in quickstart_experiment.rglob("*")) == listing


def test_function_trainable_of_a_trainable_class_says_what_to_do():
    import tunekit
    from tunekit.trainables import DigitsTrainable

    with pytest.raises(TypeError, match="DigitsTrainable is a Trainable class already; give it to tune.Tuner"):
        tunekit.function_trainable(DigitsTrainable)


def test_no_colour_reset_after_the_last_line_on_a_terminal():
    """Ray's vendored colorama writes ESC[0m at exit to a terminal; a tunekit command's last line is its own."""
    import os
    import pty

    code = ("from tunekit.commands._connect import ray_for\n"
            "with ray_for('check', cpus=1):\n    pass\n"
            "print('last line', flush=True)\n")
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=follower, stderr=follower,
                            env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    os.close(follower)
    data = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    assert proc.wait() == 0, data[-2000:]
    os.close(leader)
    assert data.rstrip().endswith(b"last line"), data[-200:]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_report_into_a_read_only_directory_is_one_line(quickstart_experiment, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    assert main(["report", str(quickstart_experiment), "--output", str(locked / "r")]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("reading ")]
    assert len(err) == 1 and "cannot write there" in err[0]


def test_status_into_a_closed_pipe_ends_quietly(quickstart_experiment):
    """`tunekit status EXP | head -1`: the reader of the output goes first; no traceback follows."""
    done = subprocess.Popen([sys.executable, "-m", "tunekit.cli", "status", str(quickstart_experiment)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    done.stdout.close()  # (before the command prints its first line)
    err = done.stderr.read().decode()
    assert done.wait() == 1 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_reader_run_in_process_gives_back_the_collector(quickstart_experiment, capsys):
    import gc

    assert gc.isenabled()
    assert main(["status", str(quickstart_experiment)]) == 0
    assert gc.isenabled()
