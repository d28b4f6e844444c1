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

from searchgym.app.hub.verifiers_env import TASKSET_ID, SearchQAEnv, load_environment, spec_of
from searchgym.data import load_dataset
from searchgym.envs import EnvSpec
from searchgym.errors import ConfigError

from ...conftest import NON_DEFAULT_ENV

ROOT = Path(__file__).resolve().parents[3]


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


E2E = "SEARCHGYM_VF_EVAL_E2E"
SIZES = ["--max-turns", "2", "--max-turn-tokens", "16", "--max-context-tokens", "768"]
ANSWER = "sculptor"  # the golden answer of one of the first five test questions of the generated world


def _constant_answer_demos(path: Path, questions: int) -> None:
    """Demonstrations that answer :data:`ANSWER` at once, after ``SearchQA-v0``'s prompt and after the
    message-level view's (what a chat endpoint sees), on the first training questions: the policy trained on
    them makes the same move whichever door asks it, and scores neither 0 nor 1 on the test questions."""
    import gymnasium as gym

    from searchgym.envs.messages import SearchQAMessages

    env = gym.make("SearchQA-v0", split="train", max_turns=2, max_turn_tokens=16, max_context_tokens=768)
    base, view = env.unwrapped, SearchQAMessages(split="train")
    reply = base.tokenizer.encode(f"<answer> {ANSWER} </answer>")
    with path.open("w") as out:
        for i in range(questions):
            env.reset(options={"question_index": i})
            prompts = [base.episode.tokens[: base.episode.length].tolist()]
            prompts.append(base.tokenizer.encode(view.prompt(base.questions[i])))
            for prompt in prompts:
                record = {
                    "question_id": base.questions[i].id,
                    "tokens": prompt + reply,
                    "sources": [1] * len(prompt) + [2] * len(reply),
                    "reward": 1.0,
                }
                out.write(json.dumps(record) + "\n")
    env.close()


def _documented_vf_eval(n: str, model: str, port: str) -> list[str]:
    """The arguments of docs/verifiers.md's `vf-eval` command, with its question count, model name and port
    replaced."""
    import shlex

    text = (ROOT / "docs" / "verifiers.md").read_text()
    (block,) = [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if b.startswith("vf-eval ")]
    argv = shlex.split(block.replace("\\\n", " "))[1:]
    swaps = {"-n": n, "-m": model, "--client.base-url": f"http://127.0.0.1:{port}/v1"}
    for flag, value in swaps.items():
        argv[argv.index(flag) + 1] = value
    return argv


@contextlib.contextmanager
def _process(argv: list[str], log: Path, url: str) -> Any:
    """A server subprocess, until ``url`` answers (any HTTP status)."""
    import time
    import urllib.error
    import urllib.request

    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                urllib.request.urlopen(url, timeout=5)
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.5)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get(E2E) != "1",
    reason=f"vf-eval's chat harness installs its program with uv from PyPI (the network): set {E2E}=1",
)
def test_vf_eval_of_a_served_checkpoint_scores_as_searchgym_eval(tmp_path: Path) -> None:
    """verifiers' own entry point, `vf-eval`, on N questions against `searchgym serve-policy` of a trained
    checkpoint on 127.0.0.1 (its streamed chat completions, as verifiers' harness asks them): its mean
    reward equals `searchgym eval --agent checkpoint:` on the same questions, and lies strictly between 0
    and 1, so that agreeing on nothing cannot pass."""
    from searchgym.app.cli import main

    n = 5
    demos, run = tmp_path / "demos.jsonl", tmp_path / "sft"
    _constant_answer_demos(demos, 16)
    args = ["train", "sft", "--run-dir", str(run), *SIZES, "--demos", str(demos), "--epochs", "20"]
    assert main([*args, "--eval-questions", "0", "--threads", "1", "--no-progress", "--no-tensorboard"]) == 0
    checkpoint = run / "checkpoint.pt"
    bin_dir = Path(sys.executable).parent
    out = tmp_path / "eval.jsonl"
    local = subprocess.run(
        [
            str(bin_dir / "searchgym"),
            "eval",
            "--agent",
            f"checkpoint:{checkpoint}",
            "--split",
            "test",
            "--episodes",
            str(n),
            *SIZES,
            "--out",
            str(out),
            "--json",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert local.returncode == 0, local.stderr
    local_em = json.loads(local.stdout.strip().splitlines()[-1])["em"]
    assert 0.0 < local_em < 1.0, local_em
    serve = [
        str(bin_dir / "searchgym"),
        "serve-policy",
        str(checkpoint),
        "--port",
        "8711",
        "--model-name",
        "tiny",
    ]
    environ = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path)}
    with _process(serve, tmp_path / "serve.log", "http://127.0.0.1:8711/v1/models"):
        done = subprocess.run(
            [
                str(bin_dir / "vf-eval"),
                *_documented_vf_eval(n=str(n), model="tiny", port="8711"),
                "--env.taskset.max-turns",
                "2",
                "--sampling.max-tokens",
                "16",
                "--no-rich",
                "--output-dir",
                str(tmp_path / "vf"),
            ],
            capture_output=True,
            text=True,
            timeout=900,
            env=environ,
            cwd=tmp_path,
        )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (traces,) = (tmp_path / "vf").glob("*/traces.jsonl")
    rows = [json.loads(line) for line in traces.read_text().splitlines()]  # one per episode
    assert len(rows) == n and all(r["ok"] and not r["errors"] for r in rows), rows[0]["errors"]
    local_rewards = {
        record["question_id"]: record["reward"] for record in map(json.loads, out.read_text().splitlines())
    }
    rewards = {
        r["task"]["data"]["question_id"]: t["rewards"]["searchqa"]["score"] for r in rows for t in r["traces"]
    }
    assert len(rewards) == n and all(t["metrics"]["turns"] >= 1 for r in rows for t in r["traces"])
    print(f"mean reward on {n} questions: vf-eval {sum(rewards.values()) / n}, searchgym eval {local_em}")
    assert rewards == local_rewards  # the same questions, each scored the same
    assert sum(rewards.values()) / n == local_em
