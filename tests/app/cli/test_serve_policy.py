"""``searchgym serve-policy`` + ``--agent openai:`` against ``--agent checkpoint:``: a trained tiny checkpoint
served over HTTP plays the same episodes, and scores the same EM, as the checkpoint played in process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.app.cli import main

from ...conftest import SERVER_WAIT

SIZES = ["--max-turns", "2", "--max-turn-tokens", "8", "--max-context-tokens", "768"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("sft") / "run"
    args = ["train", "sft", "--run-dir", str(run), *SIZES, "--demo-episodes", "8", "--epochs", "1"]
    assert main([*args, "--eval-questions", "0", "--threads", "1", "--no-progress", "--no-tensorboard"]) == 0
    return run / "checkpoint.pt"


def _eval(capsys: pytest.CaptureFixture[str], agent: str, out: Path, *extra: str) -> tuple[float, list[Any]]:
    """EM and the episode records of ``eval`` on the first 100 questions of the default world's test split."""
    argv = [
        "eval",
        "--agent",
        agent,
        *SIZES,
        "--episodes",
        "100",
        "--out",
        str(out),
        "--no-progress",
        "--json",
    ]
    assert main([*argv, *extra]) == 0
    em = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["em"]
    return em, [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.slow
def test_a_served_checkpoint_plays_as_the_checkpoint_on_100_questions(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from searchgym.agents.llm.completer import PolicyCompleter, context_size
    from searchgym.agents.training.export import load_policy
    from searchgym.server import ServerThread
    from searchgym.server.completions import create_completions_app

    policy = load_policy(trained)
    app = create_completions_app(PolicyCompleter(policy, context_size(policy.model)), "tiny")
    local_em, local = _eval(capsys, f"checkpoint:{trained}", tmp_path / "local.jsonl")
    with ServerThread(app) as server:
        url = ["--base-url", server.url + "/v1"]
        exact_em, exact = _eval(capsys, "openai:tiny", tmp_path / "ids.jsonl", *url, "--token-ids")
        text_em, text = _eval(capsys, "openai:tiny", tmp_path / "text.jsonl", *url)
    print(
        f"EM on 100 questions: checkpoint {local_em}, served (token ids) {exact_em}, served (text) {text_em}"
    )
    assert exact_em == local_em
    # Stronger than equal EM: with --token-ids every episode is the same, token for token (the transcript),
    # with the same answer, searches and end; the served episodes also keep each request.
    same = ("question_id", "transcript", "answer", "queries", "em", "end_reason", "policy_tokens")
    assert [{k: r.get(k) for k in same} for r in exact] == [{k: r.get(k) for k in same} for r in local]
    assert all(r["requests"] and r["requests"][0]["usage"]["completion_tokens"] >= 1 for r in exact)
    assert (
        sum(r["policy_tokens"] for r in local) > 100
    )  # the model wrote: the comparison is not of empty turns
    # As text, the server's words are encoded again by the env's tokenizer, which may split them otherwise
    # than the model wrote them (runs of newlines merge): the episodes are played, but need not be the same.
    assert len(text) == 100 and all(r["requests"] for r in text) and 0.0 <= text_em <= 1.0


@pytest.mark.slow
def test_the_command_serves_on_loopback_and_a_down_server_is_one_line(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "searchgym.app.cli", "serve-policy", str(trained), "--port", "0", "--model-name", "tiny",
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("serving tiny (") and "http://127.0.0.1:" in line, line + server.stderr.read()
        base = line.split(" on ")[1].split()[0]
        assert httpx.get(base + "/models", timeout=SERVER_WAIT).json()["data"][0]["id"] == "tiny"
        answer = httpx.post(
            base + "/completions",
            timeout=SERVER_WAIT,
            json={"prompt": "Q", "max_tokens": 3, "temperature": 0},
        ).json()
        assert len(answer["choices"][0]["token_ids"]) >= 1 and answer["usage"]["prompt_tokens"] >= 1
    finally:
        server.terminate()
        server.wait(timeout=30)
    down = ["eval", "--agent", "openai:tiny", "--base-url", base, "--retries", "0", "--episodes", "1"]
    assert main([*down, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("searchgym: error: ") and "cannot connect" in err[0]
    assert main(["eval", "--agent", "openai:tiny", "--episodes", "1", "--no-progress"]) == 2
    assert "needs --base-url URL" in capsys.readouterr().err
