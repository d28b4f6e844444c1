"""SearchQA as a verifiers 0.4 environment: loaded by verifiers' own loader from its id, every EnvSpec field
reaching the episodes, and episodes played through ``SearchQAEnv.run`` with verifiers' own message types.

verifiers cannot share the suite's virtualenv (its mcp pin against OpenEnv's): these tests run in
``.venv-verifiers`` (``make test-verifiers``, which sets ``SEARCHGYM_REQUIRE_VERIFIERS=1`` so that a missing
verifiers fails there) and skip elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("SEARCHGYM_REQUIRE_VERIFIERS") != "1":
    pytest.importorskip("verifiers.v1", reason="verifiers has its own virtualenv: make test-verifiers")
    pytest.importorskip("searchgym_searchqa", reason="pip install -e environments/searchgym_searchqa")

import verifiers.v1 as vf

from searchgym.data import load_dataset
from searchgym.envs import EnvSpec
from searchgym.errors import ConfigError
from searchgym.hub.verifiers_env import TASKSET_ID, SearchQAEnv, load_environment, spec_of

from ..conftest import NON_DEFAULT_ENV

ROOT = Path(__file__).resolve().parents[2]


def test_every_field_reaches_the_environment_and_its_tasks() -> None:
    env = load_environment(**NON_DEFAULT_ENV, seed=4)
    assert isinstance(env, SearchQAEnv) and env.config.taskset.id == TASKSET_ID
    assert spec_of(env.config.taskset) == EnvSpec(**NON_DEFAULT_ENV)
    tasks = list(env.taskset.take(3))
    want = [q.id for q in load_dataset(None, world_seed=1).questions("test")[:3]]
    assert [t.data.question_id for t in tasks] == want and {t.data.seed for t in tasks} == {4}
    assert all(t.data.prompt is None for t in tasks)  # the env opens the conversation


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"topk": 0}, r"topk must be >= 1"),
        ({"max_searches": 2}, r"unknown environment options \['max_searches'\]; valid: \['dataset'"),
    ],
)
def test_a_bad_field_is_refused_with_the_specs_message(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_environment(**fields)


def test_verifiers_own_loader_finds_the_id() -> None:
    config = vf.resolve_env_config({"taskset": {"id": TASKSET_ID, "split": "test", "topk": 2}})
    env = vf.load_environment(config)
    assert isinstance(env, SearchQAEnv) and spec_of(env.config.taskset).topk == 2
    assert env.config.agent_harnesses()["agent"].id == TASKSET_ID  # the plain chat harness


class _Trace:
    def __init__(self) -> None:
        self.rewards: dict[str, float] = {}
        self.metrics: dict[str, float] = {}
        self.stopped: str | None = None

    def record_reward(self, name: str, value: float, weight: float = 1.0) -> None:
        self.rewards[name] = value

    def record_metrics(self, values: dict[str, float]) -> None:
        self.metrics.update(values)

    def stop(self, condition: str) -> None:
        self.stopped = condition


class _Interaction:
    """verifiers' ``Interaction`` as the env uses it: each turn returns a ``Segment`` of the model's reply."""

    def __init__(self, replies: list[Any]) -> None:
        self.replies = replies
        self.sent: list[str] = []
        self.trace = _Trace()

    async def turn(self, message: str) -> Any:
        self.sent.append(message)
        if not self.replies:
            return vf.Segment(messages=[], terminated=True)
        return vf.Segment(messages=[self.replies.pop(0)])


def _play(env: Any, question_id: str, replies: list[Any]) -> _Interaction:
    interaction = _Interaction(replies)

    class Agent:
        @contextlib.asynccontextmanager
        async def interaction(self, task: Any) -> AsyncIterator[_Interaction]:
            yield interaction

    class Agents:
        agent = Agent()

    task = next(t for t in env.taskset if t.data.question_id == question_id)
    asyncio.run(env.run(task, Agents()))
    return interaction


def test_an_episode_through_run_with_tool_calls_and_tags() -> None:
    env = load_environment(split="train", topk=2, max_turns=3)
    question = load_dataset(None).questions("train")[3]
    search = vf.ToolCall(id="c1", name="search", arguments=json.dumps({"query": question.question}))
    replies = [
        vf.AssistantMessage(content="", tool_calls=[search]),
        vf.AssistantMessage(content=f"So: <answer> {question.golden_answers[0]} </answer>"),
    ]
    played = _play(env, question.id, replies)
    assert played.sent[0].endswith(f"Question: {question.question}?") or played.sent[0].endswith(
        f"Question: {question.question}"
    )
    assert played.sent[1].startswith("<information>Doc 1(Title: ")
    assert played.trace.rewards == {"searchqa": 1.0}
    assert played.trace.metrics == {"em": 1.0, "f1": 1.0, "searches": 1, "turns": 2}
    # No tool call and no tag: the corrective message, the turn spent; the model stops: reward 0.
    played = _play(env, question.id, [vf.AssistantMessage(content="I do not know")])
    assert "My previous action is invalid" in played.sent[1]
    assert played.trace.rewards == {"searchqa": 0.0} and played.trace.stopped == "no_reply"


def test_the_documented_load_block_runs() -> None:
    """docs/verifiers.md's python block, run as written in this virtualenv."""
    text = (ROOT / "docs" / "verifiers.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1
    done = subprocess.run([sys.executable, "-c", blocks[0]], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SearchQAEnv searchgym-searchqa" in done.stdout
