"""Shared fixtures. Tests that read ../shared/data skip with a reason when it is absent."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

SHARED_DATA = Path(
    os.environ.get("SEARCHGYM_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)
HOTPOT = SHARED_DATA / "hotpotqa_dev_distractor_1100"
NQ = SHARED_DATA / "nq_open_oracle_2655"
QUICKSTART = SHARED_DATA / "flashrag_quickstart_nq"


NON_DEFAULT_ENV: dict[str, Any] = {
    "dataset": "world",
    "world_seed": 1,
    "split": "test",
    "retriever": "rank_bm25",
    "retriever_patience": 1.5,
    "retriever_faults": "shuffle=0.5,seed=3",
    "on_retrieval_error": "observe",
    "topk": 2,
    "max_turns": 3,
    "max_turn_tokens": 64,
    "max_context_tokens": 512,
    "max_obs_tokens": 100,
    "max_passage_words": 5,
    "reward": "f1",
    "prompt_style": "chat",
    "append_question_mark": False,
}
"""A value other than the default for every ``EnvSpec`` field (tests/envs/test_spec.py checks that it covers
them all): what the "every front end takes every field" tests build each front end with."""

SERVER_WAIT = float(os.environ.get("SEARCHGYM_TEST_SERVER_WAIT", "120"))
"""Seconds a test waits for a server it started: to come up, and for each answer. Sized for a loaded machine
(CI shares its two cores with experiment runs, where a first answer took more than httpx's default 5 s): only
a server that does not answer at all fails. A test that measures a deadline of its own names that one."""


def server_client(url: str) -> Any:
    """An ``httpx.Client`` for a server the test started, with :data:`SERVER_WAIT` as its timeout."""
    import httpx

    return httpx.Client(base_url=url, timeout=SERVER_WAIT)


def wait_for_health(url: str, alive: Any = None) -> None:
    """Waits until ``URL/health`` answers 200, polling for at most :data:`SERVER_WAIT` seconds.

    Args:
        url: The server's base URL.
        alive: Called between polls; False (the server's process ended) stops the wait at once.
    """
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + SERVER_WAIT
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise AssertionError(f"the server for {url} ended before it answered /health")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=SERVER_WAIT) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            time.sleep(0.2)
    raise AssertionError(f"{url}/health did not answer within {SERVER_WAIT:g} s")


def require(path: Path) -> Path:
    """Skips the calling test when a shared data folder is missing (users outside this workspace)."""
    if not (path / "corpus.jsonl").is_file():
        pytest.skip(f"shared data folder {path} is absent (set SEARCHGYM_SHARED_DATA to its parent)")
    return path


@pytest.fixture
def hotpot_dir() -> Path:
    return require(HOTPOT)


@pytest.fixture
def quickstart_dir() -> Path:
    return require(QUICKSTART)


@pytest.fixture(scope="session")
def world() -> Any:
    """The default generated world (seed 0), built once per test session."""
    from searchgym.data import generate_world

    return generate_world(seed=0)


@pytest.fixture(scope="session")
def retriever(world: Any) -> Any:
    """The default BM25 index over :func:`world`'s passages."""
    from searchgym.retrieval import BM25Retriever

    return BM25Retriever(world.passages)


@pytest.fixture
def scripted_tool_grpo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A factory of one-step TRL ``GRPOTrainer`` runs over a tool environment, whose model's turns are
    scripted (a random tiny model makes no tool calls): each rollout searches its question, then answers
    (even rows the golden answer, odd rows a wrong one), then stops. The rest — tool calls, rewards, the
    loss and the update — is TRL's. ``make(environment_factory)`` returns the trainer (not yet trained)
    and its model."""
    trl = pytest.importorskip("trl", reason="the trl extra is part of `all`: `make test` installs it")
    from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template

    from searchgym.agents.integrations.trl_env import tool_env_dataset
    from searchgym.agents.llm import tiny_causal_lm
    from searchgym.data import load_dataset
    from searchgym.tokenization import load_tokenizer

    if "TRL_EXPERIMENTAL_SILENCE" not in os.environ:
        monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    hf = load_tokenizer(None).to_transformers()
    hf.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    hf.eos_token = "<|im_end|>"  # as in Qwen: TRL cuts the tool-result suffix at the end-of-turn token
    hf.chat_template = qwen2_5_chat_template
    add_response_schema(hf)
    questions = {q.question.strip().rstrip("?"): q for q in load_dataset(None).questions("train")}

    class Scripted(trl.GRPOTrainer):  # type: ignore[misc]
        def _generate_single_turn(self, prompt_ids: Any, *args: Any, **kwargs: Any) -> tuple:
            out = []
            for i, ids in enumerate(prompt_ids):
                text = hf.decode(ids)
                question = questions[text.split("Question: ")[1].split("<|im_end|>")[0].rstrip("?")]
                calls = text.count("<tool_response>")
                if calls == 0:
                    call = {"name": "search", "arguments": {"query": question.question}}
                elif calls == 1:  # even rows answer right, odd rows wrong
                    answer = question.golden_answers[0] if i % 2 == 0 else "no idea"
                    call = {"name": "answer", "arguments": {"answer": answer}}
                else:
                    out.append(hf.encode("Done.<|im_end|>", add_special_tokens=False))
                    continue
                text = "<tool_call>\n" + json.dumps(call) + "\n</tool_call><|im_end|>"
                out.append(hf.encode(text, add_special_tokens=False))
            return out, None

    def make(environment_factory: Any) -> tuple[Any, Any]:
        model = tiny_causal_lm(len(hf), layers=1, hidden=32, seed=0, eos_token_id=hf.eos_token_id)
        args = trl.GRPOConfig(
            output_dir=str(tmp_path / "tools"),
            max_steps=1,
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=2048,
            learning_rate=1e-2,
            beta=0.0,
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
        )
        trainer = Scripted(
            model=model,
            args=args,
            train_dataset=tool_env_dataset(limit=4),
            processing_class=hf,
            environment_factory=environment_factory,
        )
        return trainer, model

    return make


def searchr1_client(url: str, queries: list[str], topk: int = 3) -> list[list[dict[str, Any]]]:
    """What Search-R1's generation loop does: POST all queries, read ``result`` (no error handling)."""
    import httpx

    payload = {"queries": queries, "topk": topk, "return_scores": True}
    response = httpx.post(url + "/retrieve", json=payload, timeout=SERVER_WAIT)
    return response.json()["result"]  # type: ignore[no-any-return]


@pytest.fixture
def python_sigint() -> Any:
    """SIGINT raises KeyboardInterrupt in this test, as in a terminal (a background CI start ignores it)."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
