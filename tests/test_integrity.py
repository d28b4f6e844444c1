"""``searchgym/integrity.py``: a verified file's hash is remembered until it changes, Ctrl-C is held over a write,
and the temporary files of dead writers are removed (a live writer's are kept)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from searchgym.app.cli import main
from searchgym.integrity import file_sha256, remove_stale_temp_files, sigint_held


def test_a_verified_file_is_not_hashed_again_until_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 1000)
    reads: list[int] = []
    first = file_sha256(path, lambda offset, block: reads.append(len(block)), record=True)
    assert file_sha256(path, lambda offset, block: reads.append(len(block))) == first and reads == [1000]
    path.write_bytes(b"y" * 1000)  # same size, new content and modification time
    assert file_sha256(path, lambda offset, block: reads.append(len(block))) != first and reads == [
        1000,
        1000,
    ]


def test_sigint_held_delivers_drops_or_passes_through_as_the_handler_says(python_sigint: Any) -> None:
    finished = []
    with pytest.raises(KeyboardInterrupt), sigint_held():
        signal.raise_signal(signal.SIGINT)
        finished.append("block")  # the block runs to its end first
    assert finished == ["block"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with sigint_held():  # nothing received: nothing raised
        pass
    with pytest.raises(ValueError, match="own error"), sigint_held():
        raise ValueError("the block's own error")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an ignored Ctrl-C stays ignored
    with sigint_held():
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


@pytest.mark.slow
def test_stale_checkpoint_temp_files_are_removed_on_the_next_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    run = tmp_path / "run"
    run.mkdir()
    dead = run / ".checkpoint.pt.999999999.0a1b2c3d.tmp"  # no such process: a save killed mid-write
    live = run / f".checkpoint.pt.{os.getppid()}.0a1b2c3d.tmp"  # a process that is running: kept
    dead.write_bytes(b"half a checkpoint")
    live.write_bytes(b"being written")
    assert remove_stale_temp_files(run) == [dead]
    assert live.exists()
    dead.write_bytes(b"half a checkpoint")
    assert (
        main(["train", "grpo", "--run-dir", str(run), "--resume", "--no-progress"]) == 2
    )  # no checkpoint yet
    assert not dead.exists() and live.exists()
