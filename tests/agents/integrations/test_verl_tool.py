"""The verl search tool, built by verl's own ``initialize_tools_from_config`` from docs/scale.md's YAML.

Runs in ``.venv-verl`` (``make test-verl``, with ``SEARCHGYM_REQUIRE_VERL=1``); skipped in the main
virtualenv, which has no verl.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

if os.environ.get("SEARCHGYM_REQUIRE_VERL") != "1":
    pytest.importorskip(
        "verl", reason="verl pins transformers < 5.11: `make test-verl` runs these in .venv-verl"
    )

import gymnasium as gym
import yaml
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.tool_registry import initialize_tools_from_config

import searchgym.envs  # noqa: F401 - registers SearchQA-v0
from searchgym.agents.integrations.verl_tool import APPLIED, CONFIG_KEYS, SearchTool
from searchgym.data import load_dataset
from searchgym.envs.wrappers import TurnLevelWrapper
from searchgym.errors import ConfigError, RetrieverError, install_command
from searchgym.protocol import Source

ROOT = Path(__file__).resolve().parents[3]
SHARED_DATA = Path(os.environ.get("SEARCHGYM_SHARED_DATA", ROOT.parent / "shared" / "data"))
NQ = SHARED_DATA / "nq_open_oracle_2655"


def _documented_tools() -> dict[str, Any]:
    """The YAML block of docs/scale.md's "verl tools" section, parsed."""
    text = (ROOT / "docs" / "scale.md").read_text(encoding="utf-8")
    section = text.split("\n### verl tools\n", 1)[1]
    found = re.search(r"^```yaml\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert found, "docs/scale.md's verl tools section has no yaml block"
    return yaml.safe_load(found.group(1))


def _load(tmp_path: Path, tools: dict[str, Any]) -> list[Any]:
    """verl's own loading: the tool config written to a file and read by ``initialize_tools_from_config``."""
    path = tmp_path / "search_tool.yaml"
    path.write_text(yaml.safe_dump(tools), encoding="utf-8")
    return initialize_tools_from_config(str(path))


def _with_config(**changes: Any) -> dict[str, Any]:
    """The documented YAML with these config keys changed (``None`` removes a key)."""
    tools = copy.deepcopy(_documented_tools())
    config = tools["tools"][0]["config"]
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return tools


async def _search(tool: Any, query: str) -> tuple[Any, float, dict[str, Any]]:
    instance_id, created = await tool.create(create_kwargs={"ground_truth": "ignored"})
    assert created.is_empty()
    try:
        return await tool.execute(instance_id, {"query": query})
    finally:
        await tool.release(instance_id)


async def _through_verls_loop(tool: Any, query: str) -> Any:
    """The tool call as verl's ``ToolAgentLoop`` makes it: create, execute, release, errors as text."""
    loop = SimpleNamespace(
        tools={tool.name: tool}, max_tool_response_length=100_000, tool_response_truncate_side="middle"
    )
    call = FunctionCall(name=tool.name, arguments=f'{{"query": "{query}"}}')
    response, reward, _ = await ToolAgentLoop._call_tool(loop, call, {}, SimpleNamespace())
    assert reward == 0.0
    return response


def _env_information(dataset: Any, query: str, split: str = "train", topk: int = 3) -> str:
    """The tool text ``SearchQA-v0`` appends to the transcript after ``<search> query </search>``."""
    env = TurnLevelWrapper(
        gym.make(
            "SearchQA-v0", dataset=dataset, split=split, retriever="bm25", topk=topk, max_context_tokens=8192
        )
    )
    try:
        obs, _ = env.reset(seed=0)
        tokenizer = env.unwrapped.tokenizer  # type: ignore[attr-defined]
        obs, *_ = env.step(tokenizer.encode(f"<search> {query} </search>"))
        n = int(obs["length"][0])
        tool_ids = obs["tokens"][:n][obs["sources"][:n] == int(Source.TOOL)]
        return tokenizer.decode(tool_ids)
    finally:
        env.close()


def test_documented_yaml_searches_the_nq_sample_as_the_env_shows_it(tmp_path: Path) -> None:
    if not NQ.is_dir():
        pytest.skip(f"the NQ sample {NQ} is absent (set SEARCHGYM_SHARED_DATA to the shared data folder)")
    tools = _with_config(dataset=str(NQ))  # the documented relative path, from wherever the test runs
    [tool] = _load(tmp_path, tools)
    assert isinstance(tool, SearchTool) and tool.name == "search"
    assert tool.tool_schema.model_dump(exclude_unset=True) == tools["tools"][0]["tool_schema"]
    query = "who got the first nobel prize in physics"
    response, reward, metrics = asyncio.run(_search(tool, query))
    assert response.text.startswith('<information>Doc 1(Title: "List of Nobel laureates in Physics") ')
    assert response.text.count("(Title: ") == 3 and reward == 0.0
    assert metrics["passage_ids"][0] == "0" and metrics["searches"] == 1
    assert response.text == _env_information(str(NQ), query, split="test").strip()


def test_generated_world_through_verls_tool_agent_loop(tmp_path: Path) -> None:
    [tool] = _load(tmp_path, _with_config(dataset="world", topk=2, max_passage_words=4))
    passage = load_dataset("world").passages[0]
    response, _, metrics = asyncio.run(_search(tool, passage.title))
    assert response.text.startswith(f'<information>Doc 1(Title: "{passage.title}") ')
    assert "Doc 2(Title: " in response.text and "Doc 3(" not in response.text
    assert metrics["passage_ids"][0] == passage.id
    # The first 4 words of the passage, as the env cuts them with max_passage_words=4.
    assert f'Doc 1(Title: "{passage.title}") {" ".join(passage.text.split()[:4])}\n' in response.text
    full = asyncio.run(_search(_load(tmp_path, _with_config(dataset="world"))[0], passage.title))[0]
    assert full.text == _env_information("world", passage.title).strip()
    assert asyncio.run(_through_verls_loop(tool, passage.title)).text == response.text
    assert tool._searches == {}  # every instance released


def test_instances_count_their_searches_and_are_released(tmp_path: Path) -> None:
    [tool] = _load(tmp_path, _with_config(dataset="world"))

    async def play() -> None:
        instance_id, _ = await tool.create("trajectory-1")
        assert instance_id == "trajectory-1"
        for n in (1, 2):
            _, _, metrics = await tool.execute(instance_id, {"query": "economist"})
            assert metrics["searches"] == n
        await tool.release(instance_id)
        with pytest.raises(ConfigError, match="does not exist: call create"):
            await tool.execute(instance_id, {"query": "economist"})
        other, _ = await tool.create()
        with pytest.raises(ConfigError, match="string 'query' parameter"):
            await tool.execute(other, {"q": "economist"})

    asyncio.run(play())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"top_k": 3}, r"unknown search tool config key\(s\) \['top_k'\]"),
        ({"retriever": None}, "missing the key 'retriever'"),
        ({"retriever": "bm26"}, "unknown retriever 'bm26'"),
        ({"dataset": None}, "missing the key 'dataset'"),
        ({"retriever": "http://127.0.0.1:8000/retrieve"}, "key 'dataset' is not used"),
        ({"dataset": "world", "topk": 0}, r"search tool config: topk must be >= 1 and <= 1024, got 0"),
        ({"dataset": "world", "world_seed": "x"}, r"search tool config: world_seed must be an integer"),
        ({"dataset": "world", "on_retrieval_error": "ignore"}, r"unknown on_retrieval_error 'ignore'"),
        ({"dataset": "/no/such/corpus"}, "'/no/such/corpus' is neither 'world' nor an existing"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    tools = _with_config(**changes)
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, tools)


def test_every_env_field_is_a_config_key_and_reaches_the_spec(tmp_path: Path) -> None:
    from searchgym.envs import EnvSpec
    from searchgym.retrieval.faults import FaultyRetriever

    from ...conftest import NON_DEFAULT_ENV

    assert set(CONFIG_KEYS) == {"type", *EnvSpec.field_names()} and set(APPLIED) < set(CONFIG_KEYS)
    [tool] = _load(tmp_path, _with_config(**NON_DEFAULT_ENV))
    assert tool.spec == EnvSpec(**NON_DEFAULT_ENV)
    assert isinstance(tool.retriever, FaultyRetriever) and tool.retriever.inner.name == "rank_bm25"
    passage = load_dataset("world", world_seed=1).passages[0]  # the world of seed 1
    response, _, metrics = asyncio.run(_search(tool, passage.title))
    assert metrics["passage_ids"] and set(metrics["passage_ids"]) <= {
        p.id for p in load_dataset("world", world_seed=1).passages
    }
    docs = response.text.removeprefix("<information>").removesuffix("</information>").splitlines()
    assert len(docs) == 2 and all(len(d.partition(") ")[2].split()) <= 5 for d in docs)  # topk, words


def test_a_failed_search_is_observed_when_asked(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/retrieve"
    [tool] = _load(tmp_path, _with_config(retriever=url, dataset=None, on_retrieval_error="observe"))
    response, _, metrics = asyncio.run(_search(tool, "anything"))
    assert response.text.startswith(f"<information>Search failed: retrieval server {url} failed after")
    assert metrics["passage_ids"] == [] and metrics["searches"] == 1


def test_schema_without_a_string_query_is_refused(tmp_path: Path) -> None:
    tools = _with_config(dataset="world")
    parameters = tools["tools"][0]["tool_schema"]["function"]["parameters"]
    parameters["properties"] = {"q": {"type": "string"}}
    parameters["required"] = ["q"]
    with pytest.raises(ConfigError, match="required string parameter 'query'"):
        _load(tmp_path, tools)
    del tools["tools"][0]["tool_schema"]  # no schema: the default one
    assert _load(tmp_path, tools)[0].name == "search"


def test_unreachable_server_gives_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/retrieve"
    [tool] = _load(tmp_path, _with_config(retriever=url, dataset=None))
    budget = tool.retriever.time_budget

    async def bounded(coroutine: Any) -> Any:
        return await asyncio.wait_for(coroutine, timeout=budget + 5)

    started = time.monotonic()
    with pytest.raises(RetrieverError, match=rf"retrieval server {re.escape(url)} failed after 3 attempts"):
        asyncio.run(bounded(_search(tool, "anything")))
    assert time.monotonic() - started < budget
    response = asyncio.run(bounded(_through_verls_loop(tool, "anything")))
    assert response.text.startswith(f"Error executing tool 'search': retrieval server {url} failed after")
    assert tool._searches == {}


def test_without_verl_the_tool_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['verl'] = None\n"
        "from searchgym.errors import MissingDependencyError\n"
        "try:\n"
        "    import searchgym.agents.integrations.verl_tool\n"
        "except MissingDependencyError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert "The verl search tool needs" in out.stdout and install_command("verl") in out.stdout
