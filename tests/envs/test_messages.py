"""The message-level view: SearchQA-v0's turn rules on parsed tool calls, shared by every tool-calling door."""

from __future__ import annotations

import pytest

from searchgym.data import load_dataset
from searchgym.envs.messages import NO_TOOL_MESSAGE, TOOL_INSTRUCTION, SearchQAMessages
from searchgym.errors import ConfigError, EpisodeFinishedError


def _question(split: str = "train", index: int = 3):  # type: ignore[no-untyped-def]
    return load_dataset(None).questions(split)[index]


def test_an_answer_ends_the_episode_with_the_metric() -> None:
    view = SearchQAMessages(topk=2)
    q = _question()
    assert view.reset(q.id) == TOOL_INSTRUCTION.format(question=q.question.strip())
    turn = view.play("search", q.question)
    assert not turn.done and turn.reward == 0.0 and len(turn.passage_ids) == 2
    assert turn.text.startswith("<information>Doc 1(Title: ")
    turn = view.play("answer", q.golden_answers[0].upper())
    assert (turn.done, turn.reward, turn.end_reason) == (True, 1.0, "answered")
    with pytest.raises(EpisodeFinishedError, match="no episode is running"):
        view.play("answer", "again")


def test_the_last_turn_must_answer_and_a_turn_without_a_tool_is_spent() -> None:
    view = SearchQAMessages(max_turns=3)
    view.reset(_question().id)
    turn = view.play(None, "<search> who </serch>")
    assert turn.text == NO_TOOL_MESSAGE and not turn.done and view.turns == 1
    assert view.play("search", "   ").text == NO_TOOL_MESSAGE  # an empty query is an invalid turn
    turn = view.play("search", "who")  # the third of three turns: a search is refused, the episode ends
    assert turn.error is not None and "no searches left" in turn.error
    assert (turn.done, turn.reward, turn.end_reason) == (True, 0.0, "turn_budget")
    assert view.queries == []


def test_an_unknown_tool_is_refused() -> None:
    view = SearchQAMessages()
    view.reset()
    with pytest.raises(ConfigError, match=r"unknown tool 'lookup'"):
        view.play("lookup", "x")  # type: ignore[arg-type]


def test_a_reset_seed_reseeds_the_draw_and_the_faults() -> None:
    view = SearchQAMessages(retriever_faults="shuffle=0.5,replace=0.5,seed=3")
    runs = []
    for _ in range(2):
        view.reset(seed=11)
        runs.append((view.question.id if view.question else None, view.search("the city"), view.search("a")))
    assert runs[0] == runs[1]
    view.reset(runs[0][0], seed=12)
    assert (view.search("the city"), view.search("a")) != runs[0][1:]
