"""Long runs outlive their retriever's restarts: a real ``searchgym serve`` is killed mid-run and started
again on the same port, and ``eval`` and ``train grpo`` go on as if nothing had happened.

With ``--retriever-patience 0`` the run fails as it always did, and a training run says what it saved and
how to continue.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from searchgym.agents.training.checkpoint import load_checkpoint

from .conftest import SHARED_DATA, wait_for_health

pytestmark = pytest.mark.slow  # real server processes, killed and restarted

CLI = [sys.executable, "-m", "searchgym.app.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``searchgym serve`` over the generated world's corpus, on a fixed port, that a test can kill and start
    again."""

    def __init__(self, port: int, cwd: Path, corpus: Path) -> None:
        self.port, self.cwd, self.corpus = port, cwd, corpus
        self.url = f"http://127.0.0.1:{port}/retrieve"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [*CLI, "serve", "--corpus", str(self.corpus), "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, cwd=self.cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc = self.proc
        wait_for_health(f"http://127.0.0.1:{self.port}", alive=lambda: proc.poll() is None)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def server(tmp_path: Path, world: Any) -> Iterator[Server]:
    corpus = tmp_path / "corpus.jsonl"
    records = [{"id": p.id, "contents": f'"{p.title}"\n{p.text}'} for p in world.passages]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    running = Server(free_port(), tmp_path, corpus)
    running.start()
    yield running
    running.kill()


def wait_for(
    condition: Callable[[], bool], proc: subprocess.Popen[Any], what: str, seconds: float = 300
) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def lines(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.exists() else 0


def restart_while_running(server: Server, proc: subprocess.Popen[Any], down_s: float = 3.0) -> None:
    server.kill()
    time.sleep(down_s)  # the run meets a refused connection, then waits
    assert proc.poll() is None, "the run should be waiting for the server"
    server.start()


def test_eval_waits_for_a_restarted_server_and_plays_the_same_episodes(
    tmp_path: Path, server: Server
) -> None:
    base = [
        *CLI,
        "eval",
        "--agent",
        "heuristic",
        "--retriever",
        server.url,
        "--episodes",
        "400",
        "--no-progress",
    ]
    assert subprocess.run([*base, "--out", str(tmp_path / "calm.jsonl")], cwd=tmp_path).returncode == 0
    out = tmp_path / "restarted.jsonl"
    proc = subprocess.Popen(
        [*base, "--out", str(out), "--retriever-patience", "120"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: lines(out.with_name(out.name + ".partial")) >= 5, proc, "five finished episodes")
    restart_while_running(server, proc)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "is not answering" in err and "waiting up to 120s" in err and "is back after" in err
    assert out.read_bytes() == (tmp_path / "calm.jsonl").read_bytes()  # the same episodes, byte for byte


def test_eval_with_patience_zero_fails_as_before(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/retrieve"
    cmd = [
        *CLI,
        "eval",
        "--agent",
        "heuristic",
        "--retriever",
        url,
        "--retriever-patience",
        "0",
        "--episodes",
        "2",
    ]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 2
    assert "failed after 3 attempts (deadline 10s each); last error: ConnectError" in done.stderr
    assert "waiting" not in done.stderr


# A warm-start that searches (an untrained tiny model never does, so it would never meet the outage): the
# cached SFT checkpoint of scripts/lld2_experiment.sh.
WARM = SHARED_DATA.parent / "cache" / "lld2_warmstart" / "sft_ext2" / "checkpoint.pt"
SMALL = ["--questions-per-step", "4", "--group-size", "2", "--minibatch-size", "4", "--eval-questions", "4"]
SMALL += ["--threads", "1", "--no-progress", "--no-tensorboard", "--steps", "4", "--save-every", "1"]  # fmt: skip


@pytest.fixture
def warm() -> list[str]:
    if not WARM.is_file():
        pytest.skip(f"the cached warm-start {WARM} is absent (build it with scripts/lld2_experiment.sh)")
    return ["--init", str(WARM)]


def metrics(run: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


def test_train_grpo_waits_for_a_restarted_server_and_ends_as_an_uninterrupted_run(
    tmp_path: Path, server: Server, warm: list[str]
) -> None:
    base = [*CLI, "train", "grpo", "--retriever", server.url, *warm, *SMALL]
    calm, restarted = tmp_path / "calm", tmp_path / "restarted"
    assert subprocess.run([*base, "--run-dir", str(calm)], cwd=tmp_path).returncode == 0
    proc = subprocess.Popen(
        [*base, "--run-dir", str(restarted)], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    wait_for(lambda: lines(restarted / "metrics.jsonl") >= 3, proc, "two training steps")
    restart_while_running(server, proc)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "is not answering" in err and "is back after" in err
    assert metrics(restarted) == metrics(calm)
    assert all(r["rollout/searches"] > 0 for r in metrics(calm)[1:])  # every step used the retriever
    weights = [load_checkpoint(run / "checkpoint.pt")["model"] for run in (calm, restarted)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_train_grpo_past_its_patience_names_the_saved_step_and_the_resume_command(
    tmp_path: Path, server: Server, warm: list[str]
) -> None:
    run = tmp_path / "run"
    cmd = [*CLI, "train", "grpo", "--retriever", server.url, *warm, *SMALL, "--run-dir", str(run)]
    proc = subprocess.Popen(
        [*cmd, "--retriever-patience", "2"], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    wait_for(lambda: lines(run / "metrics.jsonl") >= 3, proc, "two training steps")
    server.kill()  # and never started again
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2, err
    assert "then waited 2s for it" in err
    saved = load_checkpoint(run / "checkpoint.pt")["step"]
    resume = f"searchgym train grpo --run-dir {run} --resume"
    assert f"searchgym: {run / 'checkpoint.pt'} holds step {saved}; continue with: {resume}" in err
