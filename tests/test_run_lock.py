"""One writer per run folder: a live holder refuses a second run at once; a dead one's lock is taken over."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from searchgym.app.cli import main
from searchgym.errors import ConfigError
from searchgym.run_lock import LOCK_NAME, lock_run_dir

HOLD = (
    "import sys\n"
    "from searchgym.run_lock import lock_run_dir\n"
    "lock = lock_run_dir(sys.argv[1])\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
    "lock.release()\n"
)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``tmp_path / 'run'`` until its stdin closes (then it releases) or it is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "run"), "--lr", "1e-4"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_a_live_holder_refuses_a_second_run_naming_itself(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    with pytest.raises(ConfigError, match=rf"is in use: process {holder.pid} on .*-c .*--lr 1e-4"):
        lock_run_dir(tmp_path / "run")


def test_a_finished_holder_leaves_the_folder_free_without_a_note(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    assert holder.stdin is not None
    holder.stdin.close()  # the holder ends its run: it releases the lock and clears its record
    assert holder.wait() == 0
    assert (tmp_path / "run" / LOCK_NAME).read_text() == ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lock_run_dir(tmp_path / "run").release()
    assert not [w for w in caught if "taking over" in str(w.message)]


def test_a_killed_holders_lock_is_taken_over_with_a_note(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    holder.kill()
    holder.wait()
    with pytest.warns(
        UserWarning, match=rf"taking over the lock of process {holder.pid} .*no longer running"
    ):
        lock = lock_run_dir(tmp_path / "run")
    record = json.loads((tmp_path / "run" / LOCK_NAME).read_text())
    assert record["pid"] != holder.pid and lock.held


def test_one_process_shares_its_lock_and_release_frees_it(tmp_path: Path) -> None:
    first = lock_run_dir(tmp_path)
    assert lock_run_dir(tmp_path) is first  # a trainer resumed in the same interpreter
    first.release()
    assert (tmp_path / LOCK_NAME).read_text() == "" and not first.held
    with lock_run_dir(tmp_path) as again:
        assert again is not first and again.held
    assert not again.held


def test_a_file_is_not_a_run_folder(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        lock_run_dir(tmp_path / "f")


TINY = ["--max-turns", "2", "--max-turn-tokens", "8", "--max-context-tokens", "768", "--threads", "1"]
TINY += ["--eval-questions", "0", "--no-progress", "--no-tensorboard"]


@pytest.mark.parametrize(
    "command",
    [
        ["train", "grpo", "--questions-per-step", "2", "--group-size", "2", "--steps", "1"],
        ["train", "sft", "--demo-episodes", "4", "--epochs", "1"],
        ["train", "trl", "--questions-per-step", "2", "--group-size", "2", "--updates", "1"],
    ],
    ids=["grpo", "sft", "trl"],
)
def test_a_second_training_command_on_a_held_folder_is_refused_and_deletes_nothing(
    tmp_path: Path, holder: subprocess.Popen[str], capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    if command[1] == "trl":
        pytest.importorskip("trl", reason="the trl extra is part of `all`: `make test` installs it")
    run = tmp_path / "run"
    (run / "checkpoint.pt").write_bytes(b"the live run's checkpoint")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    for extra in (["--overwrite"], ["--resume"]):
        if command[1] == "sft" and extra == ["--resume"]:
            continue  # SFT has no --resume
        assert main([*command, "--run-dir", str(run), *TINY, *extra]) == 2
        assert f"is in use: process {holder.pid}" in capsys.readouterr().err
        assert (run / "checkpoint.pt").read_bytes() == b"the live run's checkpoint"
        assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_a_full_disk_when_the_run_starts_is_one_line_and_leaves_no_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from searchgym import run_lock
    from searchgym.errors import DiskFullError

    def no_space(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    run_dir = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(run_lock.os, "pwrite", no_space)
        with pytest.raises(DiskFullError, match=r"no space left on the device writing .*run\.lock") as caught:
            lock_run_dir(run_dir)
    assert "\n" not in str(caught.value)
    assert not (run_dir / "run.lock").exists()  # no empty lock record left behind
    with lock_run_dir(run_dir) as lock:  # the folder is free once there is space
        assert lock.held
