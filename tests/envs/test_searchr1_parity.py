"""Search-R1 parity of the episode text.

The expected transcripts are written by hand from Search-R1's published conventions, not produced by its
code: the base prompt (the question stripped, a "?" added when it has none), each search turn followed by
``"\\n\\n<information>" + docs.strip() + "</information>\\n\\n"`` where ``docs`` is
``"Doc i(Title: <first contents line>) <rest of contents>\\n"`` per document, the observation cut to its first
``max_obs_length`` tokens, and ``max_turns`` search turns followed by one final turn.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from searchgym.envs import SearchQAEnv, searchr1_options
from searchgym.errors import ConfigError
from searchgym.protocol import format_documents
from searchgym.retrieval import BM25Retriever, Hit, Retriever

SHARED = Path(
    os.environ.get("SEARCHGYM_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data")
)
NQ = SHARED / "nq_open_oracle_2655"
HOTPOT = SHARED / "hotpotqa_dev_distractor_1100"

TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between <information> "
    "and </information>. You can search as many times as your want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: "
)


def folder(path: Path) -> Path:
    if not (path / "corpus.jsonl").is_file():
        pytest.skip(f"shared data folder {path} is absent")
    return path


def raw_corpus(path: Path) -> dict[str, str]:
    with (path / "corpus.jsonl").open(encoding="utf-8") as f:
        return {r["id"]: r["contents"] for r in map(json.loads, f)}


class Fixed(Retriever):
    """Answers every query with the same documents, given as raw FlashRAG contents."""

    def __init__(self, contents: Sequence[str]) -> None:
        self.contents = list(contents)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        hits = [Hit(f"d{i}", "", "", 1.0, c) for i, c in enumerate(self.contents[:k])]
        return [hits for _ in queries]


def play(env: gym.Env[Any, Any], turns: list[str]) -> tuple[str, dict[str, Any]]:
    """Feeds each turn's tokens; returns the decoded transcript and the last info."""
    base: Any = env.unwrapped
    info: dict[str, Any] = {}
    for turn in turns:
        for token in base.tokenizer.encode(turn):
            _, _, terminated, truncated, info = env.step(token)
            if terminated or truncated:
                break
    episode = base.episode
    return base.tokenizer.decode(episode.tokens[: episode.length]), info


def hand_block(contents: list[str]) -> str:
    docs = ""
    for i, c in enumerate(contents, start=1):
        first, _, rest = c.partition("\n")
        docs += "Doc " + str(i) + "(Title: " + first + ") " + rest + "\n"
    return "\n\n<information>" + docs.strip() + "</information>\n\n"


@pytest.mark.parametrize("data", [NQ, HOTPOT], ids=["nq", "hotpotqa"])
def test_transcript_equals_search_r1_text(data: Path) -> None:
    path = folder(data)
    raw = raw_corpus(path)
    env = gym.make("SearchQA-v0", dataset=path, split="test")
    base: Any = env.unwrapped
    # NQ questions have no "?"; pick, for HotpotQA, one without a "?" too, and one with.
    picks = [i for i, q in enumerate(base.questions) if not q.question.strip().endswith("?")][:3]
    picks += [i for i, q in enumerate(base.questions) if q.question.strip().endswith("?")][:2]
    assert picks
    for index in picks:
        _, info = env.reset(options={"question_index": index})
        question = base.questions[index]
        query = question.question
        turns = [
            f"<think>look it up</think>\n<search> {query} </search>",
            f"<answer> {question.golden_answers[0]} </answer>",
        ]
        text, info = play(env, turns)
        hits = info["retrieved_ids"][0]
        q = question.question.strip()
        expected = TEMPLATE + (q if q.endswith("?") else q + "?") + "\n"
        expected += turns[0] + hand_block([raw[h] for h in hits]) + turns[1]
        assert text == expected
        assert info["em"] == 1.0
    env.close()


def test_prompt_question_mark_can_be_turned_off() -> None:
    path = folder(NQ)
    env = gym.make("SearchQA-v0", dataset=path, split="test", append_question_mark=False)
    base: Any = env.unwrapped
    env.reset(options={"question_index": 0})
    text = base.tokenizer.decode(base.episode.tokens[: base.episode.length])
    assert text == TEMPLATE + base.questions[0].question.strip() + "\n"
    env.close()


def test_information_blocks_match_search_r1_on_every_nq_and_hotpotqa_question() -> None:
    """Item 11 over the real data: each question's gold passages as one block, and BM25's top 3."""
    counts = {}
    for data in (NQ, HOTPOT):
        path = folder(data)
        raw = raw_corpus(path)
        env = SearchQAEnv(dataset=path, split="test")
        blocks = [list(q.supporting_ids) for q in env.questions]
        hits = env.retriever.search([q.question for q in env.questions], 3)
        blocks += [[h.passage_id for h in row] for row in hits]
        rendered = [
            format_documents([Hit.of(env.dataset.passage_index[p], 0.0).contents for p in b]) for b in blocks
        ]
        counts[data.name] = sum(
            r == hand_block([raw[p] for p in b]) for r, b in zip(rendered, blocks, strict=True)
        )
        assert counts[data.name] == len(blocks), (data.name, counts[data.name], len(blocks))
        env.close()
    print(f"information blocks equal to Search-R1's: {counts}")


def test_unquoted_titles_and_trailing_white_space_render_as_search_r1() -> None:
    path = folder(NQ)
    contents = [
        '"Quoted Title"\nfirst text',
        "Bare Title\nsecond text\nwith two lines",
        "Third\nends in space  \n",
    ]
    env = gym.make("SearchQA-v0", dataset=path, split="test", retriever=Fixed(contents))
    env.reset(options={"question_index": 0})
    text, info = play(env, ["<search> q </search>"])
    block = (
        '\n\n<information>Doc 1(Title: "Quoted Title") first text\nDoc 2(Title: Bare Title) second text\n'
        "with two lines\nDoc 3(Title: Third) ends in space</information>\n\n"
    )
    assert text.endswith("<search> q </search>" + block)
    env.close()


def test_max_obs_tokens_cuts_the_observation_and_the_episode_goes_on() -> None:
    path = folder(HOTPOT)
    raw = raw_corpus(path)
    long_docs = sorted(raw.values(), key=len)[-3:]
    block = hand_block(long_docs)
    # Without the option the long block does not fit a small context: the episode ends there.
    small = {"dataset": path, "split": "test", "retriever": Fixed(long_docs), "max_context_tokens": 400}
    env = gym.make("SearchQA-v0", **small)
    env.reset(options={"question_index": 0})
    _, info = play(env, ["<search> q </search>"])
    assert info["end_reason"] == "context_limit"
    env.close()
    # With it, the block is cut to its first 50 tokens, as Search-R1 cuts max_obs_length, and play goes on.
    env = gym.make("SearchQA-v0", **small, max_obs_tokens=50)
    base: Any = env.unwrapped
    env.reset(options={"question_index": 0})
    prompt_length = base.episode.length
    text, info = play(env, ["<search> q </search>", "<answer> x </answer>"])
    cut = base.tokenizer.decode(base.tokenizer.encode(block)[:50])
    search_len = len(base.tokenizer.encode("<search> q </search>"))
    tool = base.episode.tokens[prompt_length + search_len : prompt_length + search_len + 50]
    assert base.tokenizer.decode(tool) == cut
    assert text.endswith("<search> q </search>" + cut + "<answer> x </answer>")
    assert info["end_reason"] == "answered" and info["cut_observations"] == 1
    env.close()


def test_search_r1_max_turns_means_search_turns_then_a_final_turn(world: Any) -> None:
    options = searchr1_options(max_turns=2, max_obs_length=None)
    assert options["max_turns"] == 3
    retriever = BM25Retriever(world.passages)
    env = gym.make("SearchQA-v0", dataset=world, split="test", retriever=retriever, **options)
    env.reset(options={"question_index": 0})
    # Search-R1 with max_turns=2: two searches are executed, the third turn's search is not.
    _, info = play(env, ["<search> a </search>", "<search> b </search>", "<search> c </search>"])
    assert info["queries"] == ["a", "b"] and info["end_reason"] == "turn_budget"
    env.reset(options={"question_index": 0})
    _, info = play(env, ["<search> a </search>", "<search> b </search>", "<answer> x </answer>"])
    assert info["searches"] == 2 and info["end_reason"] == "answered"
    env.close()
    assert searchr1_options(max_turns=0)["max_turns"] == 1  # only the final turn
    with pytest.raises(ConfigError, match="max_turns"):
        searchr1_options(max_turns=-1)


def test_defaults_leave_the_generated_world_prompt_unchanged(world: Any) -> None:
    env = gym.make("SearchQA-v0", dataset=world, split="test")
    base: Any = env.unwrapped
    for i in range(20):
        env.reset(options={"question_index": i})
        text = base.tokenizer.decode(base.episode.tokens[: base.episode.length])
        assert text == TEMPLATE + base.questions[i].question.strip() + "\n"
    env.close()


def test_local_bm25_on_an_unquoted_title_corpus_shows_titles_as_stored(tmp_path: Path) -> None:
    # FlashRAG's own quick-start corpus has 121 lines whose title is not quoted: Search-R1 shows them bare.
    lines = ['"Quoted Zorbland"\nZorbland is a quoted place.', "Bare Zorbland\nZorbland is a bare place.  "]
    (tmp_path / "corpus.jsonl").write_text(
        "".join(json.dumps({"id": str(i), "contents": c}) + "\n" for i, c in enumerate(lines))
    )
    question = {"id": "q0", "question": "where is Zorbland", "golden_answers": ["here"]}
    (tmp_path / "test.jsonl").write_text(json.dumps(question) + "\n")
    env = gym.make("SearchQA-v0", dataset=str(tmp_path), split="test", topk=2)
    env.reset(options={"question_index": 0})
    text, _ = play(env, ["<search> Zorbland </search>"])
    assert "(Title: Bare Zorbland) Zorbland is a bare place." in text
    assert '(Title: "Quoted Zorbland") Zorbland is a quoted place.' in text
    env.close()
