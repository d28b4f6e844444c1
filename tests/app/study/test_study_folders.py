"""``study run`` writes only into run folders it started, and one ``study run`` at a time per runs folder.

A protocol whose runs path leads (by ``..`` or an absolute path) into another project's run folder is
refused before anything is written, naming the folder; a folder the study marked, or one an earlier
``study run`` started before marks existed (its ``command.txt`` is this run's command), is accepted and
marked. A second ``study run`` while one holds the runs folder is refused at once, naming the holder. The
runs' processes are replaced by one that exits at once (``RUN_CLI``), so nothing trains here.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from searchgym.app.study import runner
from searchgym.app.study.protocol import load_protocol
from searchgym.app.study.runner import MARK, STUDY_LOCK, run_study
from searchgym.errors import ConfigError

from .conftest import TINY_PROTOCOL

FOREIGN_METRICS = '{"step": 1, "loss": 0.25}\n'


def _protocol(tmp_path: Path, runs: str, where: str = "p.toml", name: str = "tiny") -> Path:
    """A tiny protocol at ``tmp_path/where`` whose runs are at ``runs``, with a warm-start file of its own."""
    path = tmp_path / where
    path.parent.mkdir(parents=True, exist_ok=True)
    warm = path.parent / "warm" / "checkpoint.pt"
    warm.parent.mkdir(parents=True, exist_ok=True)
    warm.write_bytes(b"a warm-start stand-in: only its digest is checked before the runs")
    text = TINY_PROTOCOL.format(sha256=hashlib.sha256(warm.read_bytes()).hexdigest(), extra_arms="")
    text = text.replace('runs = "runs"', f"runs = {json.dumps(runs)}").replace(
        'name = "tiny"', f'name = "{name}"'
    )
    path.write_text(text)
    return path


def _foreign_run(folder: Path) -> dict[str, bytes]:
    """Another project's run folder; what it holds, to compare with afterwards."""
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text(FOREIGN_METRICS)
    (folder / "notes.txt").write_text("not a study's\n")
    return _files(folder)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run's process exits at once with status 3 (a failed run), so nothing trains."""
    monkeypatch.setattr(runner, "RUN_CLI", "import sys; sys.exit(3)")


@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_a_protocol_pointing_into_another_projects_run_folder_is_refused_and_nothing_changes(
    tmp_path: Path, how: str, no_training: None
) -> None:
    other = tmp_path / "other-project" / "runs"
    before = _foreign_run(other / "control" / "s0")
    runs = "../other-project/runs" if how == "dotdot" else str(other)
    protocol = load_protocol(_protocol(tmp_path / "study", runs))
    lines: list[str] = []
    with pytest.raises(ConfigError) as caught:
        run_study(protocol, say=lines.append)
    message = str(caught.value)
    assert "\n" not in message and str(other / "control" / "s0") in message
    assert "not a run folder of study 'tiny'" in message and f"no {MARK} of study 'tiny'" in message
    assert _files(other) == {f"control/s0/{k}": v for k, v in before.items()}  # nothing written, no lock
    assert not lines and not (tmp_path / "study" / "summaries").exists()


def test_a_folder_another_study_marked_is_refused(tmp_path: Path, no_training: None) -> None:
    protocol = load_protocol(_protocol(tmp_path, "runs"))
    folder = tmp_path / "runs" / "grpo" / "s1"
    folder.mkdir(parents=True)
    mark = {
        "study": "elsewhere",
        "protocol": "/x/p.toml",
        "protocol_sha256": "0" * 64,
        "arm": "grpo",
        "seed": 1,
    }
    (folder / MARK).write_text(json.dumps(mark))
    (folder / "metrics.jsonl").write_text(FOREIGN_METRICS)
    with pytest.raises(ConfigError, match=r"marks it as run 'grpo'/s1 of study 'elsewhere'"):
        run_study(protocol, say=lambda line: None)
    assert (folder / "metrics.jsonl").read_text() == FOREIGN_METRICS
    assert not (tmp_path / "runs" / STUDY_LOCK).exists()


def test_its_own_folders_are_marked_and_played_and_a_folder_started_before_marks_is_accepted(
    tmp_path: Path, no_training: None
) -> None:
    """A run folder started by a ``study run`` from before the marks (its command.txt, log.txt and
    metrics.jsonl, paths written with ``..`` as a protocol in a subfolder gives them) is this study's."""
    path = _protocol(tmp_path, "../../runs/tiny", where="docs/experiments/p.toml")
    protocol = load_protocol(path)
    legacy = protocol.runs_dir / "control" / "s0"
    legacy.mkdir(parents=True)
    args = runner.command(protocol, "control", 0, legacy, resume=False)
    assert "/../../runs/tiny/control/s0" in shlex.join(args)  # as such a run's command.txt records it
    (legacy / "command.txt").write_text(shlex.join(["searchgym", *args]) + "\n")
    (legacy / "log.txt").write_text("== started\n")
    (legacy / "metrics.jsonl").write_text(FOREIGN_METRICS)
    lines: list[str] = []
    failed = run_study(protocol, say=lines.append)
    assert failed == 4  # every run was started (and exited 3): the legacy folder was not refused
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    for arm in ("control", "grpo"):
        for seed in (0, 1):
            mark = json.loads((protocol.runs_dir / arm / f"s{seed}" / MARK).read_text())
            assert mark == {
                "study": "tiny",
                "protocol": str(path.resolve()),
                "protocol_sha256": digest,
                "arm": arm,
                "seed": seed,
            }
    assert run_study(protocol, say=lines.append) == 4  # marked folders are its own: played again
    assert (protocol.runs_dir / STUDY_LOCK).is_file()  # the lock's file stays; its record is cleared
    assert (protocol.runs_dir / STUDY_LOCK).read_text() == ""


def test_a_command_txt_of_another_run_does_not_make_a_folder_the_studys(
    tmp_path: Path, no_training: None
) -> None:
    protocol = load_protocol(_protocol(tmp_path, "runs"))
    folder = protocol.runs_dir / "control" / "s0"
    folder.mkdir(parents=True)
    args = runner.command(protocol, "control", 1, folder, resume=False)  # seed 1's command in seed 0's folder
    (folder / "command.txt").write_text(shlex.join(["searchgym", *args]) + "\n")
    (folder / "metrics.jsonl").write_text(FOREIGN_METRICS)
    with pytest.raises(ConfigError, match="not a run folder of study 'tiny'"):
        run_study(protocol, say=lambda line: None)
    assert not (folder / MARK).exists()


HOLD = """
import sys, time
from searchgym.run_lock import lock_run_dir
lock = lock_run_dir(sys.argv[1], name=sys.argv[2])
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_study_run_is_refused_naming_the_holder(tmp_path: Path, no_training: None) -> None:
    protocol = load_protocol(_protocol(tmp_path, "runs"))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(protocol.runs_dir), STUDY_LOCK], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        lines: list[str] = []
        with pytest.raises(ConfigError) as caught:
            run_study(protocol, say=lines.append)
        message = str(caught.value)
        assert message.startswith(f"another study run holds {protocol.runs_dir.resolve() / STUDY_LOCK}: ")
        assert f"process {holder.pid}" in message and "\n" not in message
        assert not lines  # nothing started, nothing reported as failed
        assert sorted(p.name for p in protocol.runs_dir.iterdir()) == [STUDY_LOCK]
    finally:
        holder.kill()
        holder.wait(timeout=10)
