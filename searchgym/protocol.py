"""The Search-R1 interaction protocol: prompt templates, tags, tool-output formatting and action parsing.

The constants reproduce Search-R1's so that results compare with that line of work: the base prompt, the
``<search>`` / ``<answer>`` / ``<information>`` tags, ``Doc i(Title: …) text`` passage lines, and the
corrective message after an invalid turn. One deliberate difference: answers are parsed from the policy's
own text only, never from the prompt (whose example answer Search-R1 ends up scoring).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "ACTION_PATTERN",
    "BASE_PROMPT",
    "INVALID_TURN_MESSAGE",
    "STOP_TAGS",
    "ParsedAction",
    "format_information",
    "format_prompt",
    "parse_action",
]

BASE_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between <information> "
    "and </information>. You can search as many times as your want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)
"""Search-R1's base-model prompt (kept verbatim, typo included, so prompts match that work)."""

INVALID_TURN_MESSAGE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
"""Tool text appended after a turn that holds neither a search nor an answer (Search-R1's wording)."""

SEARCH_CLOSE = "</search>"
ANSWER_CLOSE = "</answer>"
STOP_TAGS: tuple[bytes, ...] = (SEARCH_CLOSE.encode(), ANSWER_CLOSE.encode())
"""Closing tags that end a turn, as bytes: detection runs on the byte stream of the policy's tokens."""

ACTION_PATTERN = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
"""The first ``<search>…</search>`` or ``<answer>…</answer>`` pair in a turn decides the action."""


@dataclass(frozen=True)
class ParsedAction:
    """What a finished turn asked for.

    Attributes:
        kind: ``"search"``, ``"answer"``, or ``"invalid"`` (neither tag pair, or an empty query).
        content: The stripped query or answer; empty for invalid turns.
    """

    kind: Literal["search", "answer", "invalid"]
    content: str = ""


def parse_action(turn_text: str) -> ParsedAction:
    """Parses one turn of policy text (the text is cut at the first closing tag already).

    >>> parse_action("<think>x</think> <search> who </search>")
    ParsedAction(kind='search', content='who')
    >>> parse_action("no tags").kind
    'invalid'
    """
    match = ACTION_PATTERN.search(turn_text)
    if match is None:
        return ParsedAction("invalid")
    kind, content = match.group(1), match.group(2).strip()
    if kind == "search":
        # An empty query cannot retrieve anything meaningful; it counts as an invalid turn.
        return ParsedAction("search", content) if content else ParsedAction("invalid")
    return ParsedAction("answer", content)


def format_prompt(question: str) -> str:
    """The base prompt for ``question``."""
    return BASE_PROMPT.format(question=question.strip())


def format_information(passages: Sequence[tuple[str, str]], max_passage_words: int | None = None) -> str:
    """Formats retrieved passages as Search-R1 does.

    Args:
        passages: ``(title, text)`` pairs in rank order.
        max_passage_words: Cut each passage text to this many white-space separated words (``None``: no cut).

    Returns:
        ``"\\n\\n<information>Doc 1(Title: "t") text\\nDoc 2…</information>\\n\\n"``. Titles keep the quotes of
        FlashRAG's ``contents`` field, which Search-R1 shows verbatim.
    """
    lines = []
    for i, (title, text) in enumerate(passages, start=1):
        if max_passage_words is not None:
            words = text.split()
            if len(words) > max_passage_words:
                text = " ".join(words[:max_passage_words])
        lines.append(f'Doc {i}(Title: "{title}") {text}')
    return "\n\n<information>" + "\n".join(lines) + "</information>\n\n"
