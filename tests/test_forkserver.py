"""The fork server's ``searchgym`` (tests/searchgym_forkserver.py) behaves as the real command: the caller's
folder, streams and exit code; and the real command runs where the server is gone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .searchgym_forkserver import CLIENT, forkserver

pytestmark = pytest.mark.slow  # a server that imports torch and transformers

BIN = Path(sys.executable).parent


def test_a_forked_command_has_the_callers_folder_streams_and_exit_code(tmp_path: Path) -> None:
    if not (BIN / "searchgym").is_file():
        pytest.skip(f"no searchgym command in {BIN}")
    with forkserver(BIN / "searchgym") as folder:
        command = str(folder / "searchgym")
        wrong = subprocess.run([command, "train", "grpo", "--stpes", "3"], capture_output=True, text=True)
        assert wrong.returncode == 2 and "did you mean --steps?" in wrong.stderr, wrong.stderr
        made = subprocess.run(
            [command, "demos", "--episodes", "2", "--out", "d.jsonl"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert made.returncode == 0, made.stderr
        assert len((tmp_path / "d.jsonl").read_text().splitlines()) == 2
        assert "d.jsonl" in made.stdout


def test_without_a_server_the_command_runs_the_real_one(tmp_path: Path) -> None:
    if not (BIN / "searchgym").is_file():
        pytest.skip(f"no searchgym command in {BIN}")
    command = tmp_path / "searchgym"
    tests = str(Path(__file__).parent)
    command.write_text(
        CLIENT.format(
            python=sys.executable, tests=tests, socket=str(tmp_path / "none"), real=str(BIN / "searchgym")
        )
    )
    command.chmod(0o755)
    alone = subprocess.run([str(command), "train", "grpo", "--stpes", "3"], capture_output=True, text=True)
    assert alone.returncode == 2 and "did you mean --steps?" in alone.stderr, alone.stderr
