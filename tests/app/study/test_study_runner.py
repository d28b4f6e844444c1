"""``searchgym study run|status|report`` at a tiny size: a protocol of two arms (the frozen control and GRPO),
two seeds and two steps on a tiny random model, played as real ``train grpo`` subprocesses.

One run is killed mid-way — its process group SIGKILLed while the run sleeps right after its step-1
checkpoint, a pause put in by a ``sitecustomize`` on that one process's ``PYTHONPATH`` (nothing in the
package knows of it) — and the next ``study run`` resumes it from that checkpoint: its step-1 metrics stay
those logged before the kill, and the runs that had finished are not played again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TIMEOUT_S = 600  # a hang guard: the machine may be busy

PAUSE = """
import os, sys, time
from pathlib import Path

if "train" in sys.argv and any(a.endswith(os.environ["STUDY_TEST_PAUSE_RUN"]) for a in sys.argv):
    from searchgym.agents.grpo import trainer

    saved = trainer.GRPOTrainer.save

    def save(self):
        path = saved(self)
        if self.step == 1:
            Path(os.environ["STUDY_TEST_PAUSED"]).write_text(str(os.getpid()))
            time.sleep(600)
        return path

    trainer.GRPOTrainer.save = save
"""


def study(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "searchgym.app.cli", "study", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
    )


def gone(pid: int) -> bool:
    """Whether a process has ended (a zombie, killed but not yet reaped, has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def metric_lines(run: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def warmstart(tmp_path: Path) -> str:
    """A tiny random model's checkpoint to start from (one frozen step of train grpo); its sha256."""
    import hashlib

    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.agents.grpo.trainer import train_grpo

    folder = tmp_path / "warm"
    train_grpo(
        GRPOConfig(
            run_dir=str(folder),
            tiny_layers=1,
            tiny_hidden=32,
            max_turn_tokens=8,
            questions_per_step=2,
            group_size=2,
            steps=1,
            lr=0.0,
            probe_size=0,
            onpolicy_probe_size=0,
            ledger_size=0,
            eval_questions=0,
            threads=1,
            progress=False,
            tensorboard=False,
        )
    )
    return hashlib.sha256((folder / "checkpoint.pt").read_bytes()).hexdigest()


def test_run_kill_resume_status_and_report(
    tmp_path: Path, warmstart: str, write_protocol: Callable[..., Path]
) -> None:
    protocol = str(write_protocol(sha256=warmstart[:12]))
    runs, summaries = tmp_path / "runs", tmp_path / "summaries"
    status = study("status", protocol)
    assert status.returncode == 0 and status.stdout.count("not started") == 4

    # First pass: two runs at a time; grpo s1 is killed after its step-1 checkpoint.
    paused = tmp_path / "paused"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(PAUSE)
    env = {
        **os.environ,
        "PYTHONPATH": str(hook),
        "STUDY_TEST_PAUSE_RUN": str(Path("grpo") / "s1"),
        "STUDY_TEST_PAUSED": str(paused),
    }
    first = subprocess.Popen(
        [sys.executable, "-m", "searchgym.app.cli", "study", "run", protocol, "--jobs", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        others = [summaries / f"{name}.json" for name in ("control_s0", "grpo_s0", "control_s1")]
        while not (paused.is_file() and all(p.is_file() for p in others)):
            assert first.poll() is None, f"study run ended before the pause:\n{first.stdout.read()}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no pause"
            time.sleep(0.1)
        killed = runs / "grpo" / "s1"
        before_kill = metric_lines(killed)
        assert [r["step"] for r in before_kill] == [0, 1]
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    trainer = int(paused.read_text())
    while not gone(trainer):
        time.sleep(0.05)  # the SIGKILL is delivered
    assert not (summaries / "grpo_s1.json").exists()
    finished = {
        p: p.stat().st_mtime_ns
        for p in [*others, *(runs / n / "checkpoint.pt" for n in ("control/s0", "grpo/s0", "control/s1"))]
    }

    status = study("status", protocol)
    assert status.returncode == 0, status.stderr
    assert "grpo s1: partial: logged up to step 1 of 2" in status.stdout
    assert "done 3, running 0, partial 1, left 1 of 4" in status.stdout

    # Second pass: only the killed run plays, resumed from its checkpoint.
    second = study("run", protocol, "--jobs", "2")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "4 runs, 3 summarised, 1 to play (1 resumed)" in second.stdout
    assert "start grpo s1 (resumes from step 1 of 2)" in second.stdout
    assert "start control" not in second.stdout and "start grpo s0" not in second.stdout
    assert "[4/4] grpo s1: done in" in second.stdout
    assert {p: p.stat().st_mtime_ns for p in finished} == finished, "finished runs were not touched"
    after = metric_lines(killed)
    assert [r["step"] for r in after] == [0, 1, 2]
    assert after[:2] == before_kill, "steps 0 and 1 kept as logged before the kill: resumed, not replayed"
    log = (killed / "log.txt").read_text()
    assert log.count("\n== ") == 2 and "--resume" in log.split("\n== ")[-1]
    assert "--overwrite" in (runs / "grpo" / "s0" / "command.txt").read_text()

    # The summaries: two steps, the options, the evaluation points; the control's weights never moved.
    for arm in ("control", "grpo"):
        for seed in (0, 1):
            s = json.loads((summaries / f"{arm}_s{seed}.json").read_text())
            assert (s["arm"], s["seed"], s["steps"]) == (arm, seed, 2)
            assert s["config"]["lr"] == (0.0 if arm == "control" else 1e-3) and s["config"]["threads"] == 1
            assert s["curves"]["step"] == [1, 2] and len(s["curves"]["lld/ledger_delta"]) == 2
            assert sorted(s["eval"], key=int) == ["0", "1", "2"]
            assert s["wall_s"] > 0
    control = json.loads((summaries / "control_s0.json").read_text())
    assert len({e["em_by_question"] for e in control["eval"].values()}) == 1

    third = study("run", protocol)
    assert third.returncode == 0 and "4 summarised, 0 to play" in third.stdout and "start" not in third.stdout
    status = study("status", protocol)
    assert "done 4, running 0, partial 0, left 0 of 4" in status.stdout

    figure = tmp_path / "tiny.png"
    report = study("report", protocol, "--figure", str(figure))
    assert report.returncode == 0, report.stderr
    assert "study tiny: 4 of 4 runs summarised" in report.stdout
    assert "C1 learn, then collapse — grpo:" in report.stdout.split("verdict:")[1]
    assert "warning signals" in report.stdout and figure.stat().st_size > 10_000


def test_a_run_uses_the_installed_searchgym_not_a_folder_of_that_name_where_it_was_started(
    tmp_path: Path,
) -> None:
    """A study started from another checkout (a frozen worktree's interpreter, the main tree as working
    directory) must run the interpreter's code: ``python -m`` would import the working directory's copy."""
    from searchgym.app.study.runner import RUN_CLI

    (tmp_path / "searchgym").mkdir()
    (tmp_path / "searchgym" / "__init__.py").write_text(
        "raise ImportError('the decoy in the working directory')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    decoyed = subprocess.run(
        [sys.executable, "-m", "searchgym.app.cli", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert decoyed.returncode != 0 and "the decoy in the working directory" in decoyed.stderr
    ran = subprocess.run(
        [sys.executable, "-c", RUN_CLI, "--help"], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    assert ran.returncode == 0, ran.stderr
    assert "study" in ran.stdout
