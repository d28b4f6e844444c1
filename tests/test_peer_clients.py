"""Peers' own clients against a real ``searchgym serve``: SkyRL-Gym's Search-R1 environment, unmodified."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import NQ, require

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 180  # building the BM25 index of the corpus, on a busy machine


@pytest.fixture(scope="module")
def nq_server() -> Iterator[str]:
    """``searchgym serve --corpus NQ --port 0`` in its own process; yields its /retrieve URL."""
    corpus = require(NQ)
    process = subprocess.Popen(
        [str(BIN / "searchgym"), "serve", "--corpus", str(corpus), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(t) for t in process.stdout or []], daemon=True).start()
    output: list[str] = []
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            try:
                output.append(lines.get(timeout=1))
            except queue.Empty:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"searchgym serve did not start:\n{''.join(output)[-3000:]}")
                continue
            if ready := re.search(r"serving .* on (http://\S+/retrieve)", output[-1]):
                yield ready[1]
                break
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def test_skyrl_gym_search_env_plays_against_searchgym_serve(nq_server: str) -> None:
    """SkyRL-Gym's ``SearchEnv`` posts ``{"query": ..., "topk": 3, "return_scores": true}``: the passages
    come back in its ``Doc i: ...`` form, the golden answer scores 1 and a wrong one 0."""
    env_module = pytest.importorskip("skyrl_gym.envs.search.env")
    question = json.loads((NQ / "test.jsonl").read_text().splitlines()[0])
    gold = question["golden_answers"][0]
    config = env_module.SearchEnvConfig(search_url=nq_server, topk=3, timeout=30)

    def play(answer: str) -> tuple[str, float]:
        extras = {"reward_spec": {"ground_truth": {"target": question["golden_answers"]}}, "max_turns": 3}
        env = env_module.SearchEnv(config, extras)
        searched = env.step(f"<search>{question['question']}</search>")
        assert not searched["done"] and searched["observations"]
        observation = searched["observations"][0]["content"]
        finished = env.step(f"<answer>{answer}</answer>")
        assert finished["done"]
        return observation, finished["reward"]

    observation, reward = play(gold)
    passages = json.loads(observation.split("<information>")[1].split("</information>")[0])["result"]
    assert passages.startswith("Doc 1: ") and "Doc 3: " in passages and "error" not in passages.lower()
    assert question["metadata"]["gold_title"] in passages  # the oracle corpus holds the gold passage
    assert reward == 1.0
    assert play("certainly not the answer")[1] == 0.0
