"""The Search-R1 interaction protocol: prompt templates, tags, tool-output formatting and action parsing.

The constants reproduce Search-R1's so that results compare with that line of work: the base prompt, the
``<search>`` / ``<answer>`` / ``<information>`` tags, ``Doc i(Title: …) text`` passage lines, and the
corrective message after an invalid turn. The prompt and the ``<information>`` block are byte-identical to
the ones Search-R1's data preparation and generation loop build for the same question and documents. One
deliberate difference: answers are parsed from the policy's own text only, never from the prompt (whose
example answer Search-R1 ends up scoring).
"""

from __future__ import annotations

import enum
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
    "Source",
    "StopScanner",
    "format_documents",
    "format_information",
    "format_prompt",
    "format_search_failure",
    "parse_action",
    "split_contents",
]


class Source(enum.IntEnum):
    """Who wrote a token of the transcript (the env's ``sources`` observation; a trainer's loss mask is
    ``sources == Source.POLICY``)."""

    PAD = 0
    PROMPT = 1
    POLICY = 2
    TOOL = 3


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

_MAX_TAG = max(len(t) for t in STOP_TAGS)

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


def format_prompt(question: str, append_question_mark: bool = True) -> str:
    """The base prompt for ``question``, as Search-R1's data preparation writes it.

    Args:
        question: The question; surrounding white space is removed.
        append_question_mark: Add ``"?"`` to a question that does not end with one, as Search-R1 does (its
            NQ questions have none). ``False`` keeps the question as given.

    >>> format_prompt("who wrote hamlet").endswith("Question: who wrote hamlet?\n")
    True
    """
    question = question.strip()
    if append_question_mark and question and not question.endswith("?"):
        question += "?"
    return BASE_PROMPT.format(question=question)


def split_contents(contents: str) -> tuple[str, str]:
    """Splits a FlashRAG ``contents`` string the way Search-R1 shows it: the first line verbatim, the rest.

    Unlike :func:`searchgym.data.flashrag.parse_contents`, the title line keeps its quotes (Search-R1 prints
    it as stored), so ``'"Paris"\\ntext'`` gives ``('"Paris"', 'text')`` and ``'Paris\\ntext'`` gives
    ``('Paris', 'text')``.
    """
    title, _, text = contents.partition("\n")
    return title, text


def format_documents(contents: Sequence[str], max_passage_words: int | None = None) -> str:
    """The ``<information>`` block for retrieved documents, byte-identical to Search-R1's.

    Each document is ``Doc i(Title: <first line of contents>) <rest of contents>`` followed by a newline;
    the joined documents lose their surrounding white space (so a trailing newline or space of the last
    document is dropped) and are wrapped as ``"\\n\\n<information>…</information>\\n\\n"``.

    Args:
        contents: FlashRAG ``contents`` strings (``"Title"\\ntext``) in rank order.
        max_passage_words: Cut each document's text to this many white-space separated words (``None``, the
            default and Search-R1's behaviour: no cut).
    """
    docs = []
    for i, document in enumerate(contents, start=1):
        title, text = split_contents(document)
        if max_passage_words is not None:
            words = text.split()
            if len(words) > max_passage_words:
                text = " ".join(words[:max_passage_words])
        docs.append(f"Doc {i}(Title: {title}) {text}\n")
    return "\n\n<information>" + "".join(docs).strip() + "</information>\n\n"


def format_search_failure(message: str) -> str:
    """The ``<information>`` block that takes a failed search's place (``on_retrieval_error="observe"``):
    ``Search failed: <message>``, wrapped as :func:`format_documents` wraps documents."""
    return f"\n\n<information>Search failed: {message}</information>\n\n"


def format_information(passages: Sequence[tuple[str, str]], max_passage_words: int | None = None) -> str:
    """The ``<information>`` block for ``(title, text)`` pairs.

    :func:`format_documents` over the FlashRAG contents ``'"title"\\ntext'`` of each pair, so titles show
    quoted, as Search-R1 shows a FlashRAG corpus.
    """
    return format_documents([f'"{title}"\n{text}' for title, text in passages], max_passage_words)


class StopScanner:
    """Finds, token by token, where a turn ends: the token at which a closing tag completes, or EOS.

    Works on the byte stream of the tokens (``token_bytes``), so a tag split over several tokens, or sharing
    its last token with following text, is found exactly at the token that completes it. Generators use it
    to stop sampling where the environment will stop; the environment uses it to end turns.

    Args:
        token_bytes: For every token id, the bytes it contributes (``Tokenizer.token_bytes``).
        eos_token_id: The end-of-sequence id, or ``None``.
    """

    __slots__ = ("_buf", "_eos", "_table", "cut", "stop")

    def __init__(self, token_bytes: Sequence[bytes], eos_token_id: int | None) -> None:
        self._table = token_bytes
        self._eos = eos_token_id
        self._buf = bytearray()
        self.stop = ""
        self.cut = -1

    def reset(self) -> None:
        """Starts a new turn."""
        self._buf = bytearray()
        self.stop = ""
        self.cut = -1

    def feed(self, token: int) -> bool:
        """Adds one token; returns True when the turn ends at this token.

        After a True return, :attr:`stop` is ``"</search>"``, ``"</answer>"`` or ``"eos"``, and :attr:`cut` is
        the byte offset where the turn's parsed text ends (bytes after a tag in the same token are kept in
        the transcript but not parsed).
        """
        buf = self._buf
        piece = self._table[token]
        scan_from = len(buf) - _MAX_TAG + 1
        buf += piece
        if b">" not in piece:  # every stop tag ends with ">": no tag can complete at this token
            if token == self._eos:
                self.stop, self.cut = "eos", len(buf)
                return True
            return False
        for tag in STOP_TAGS:
            at = buf.find(tag, max(0, scan_from))
            if at >= 0 and (self.cut < 0 or at + len(tag) < self.cut):
                self.stop, self.cut = tag.decode(), at + len(tag)
        if not self.stop and token == self._eos:
            self.stop, self.cut = "eos", len(buf)
        return bool(self.stop)

    def state(self) -> tuple[bytes, str, int]:
        """The scanner's state within the current turn (for episode snapshots): bytes so far, stop, cut."""
        return bytes(self._buf), self.stop, self.cut

    def set_state(self, state: tuple[bytes, str, int]) -> None:
        """Puts back a state returned by :meth:`state`."""
        buf, self.stop, self.cut = state
        self._buf = bytearray(buf)

    def text(self, cut: int | None = None) -> str:
        """The turn's text up to ``cut`` bytes (default: all), invalid UTF-8 replaced."""
        return bytes(self._buf[: len(self._buf) if cut is None else cut]).decode("utf-8", errors="replace")

    @property
    def nbytes(self) -> int:
        """Bytes in the turn so far."""
        return len(self._buf)
