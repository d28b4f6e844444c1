"""The batched retriever interface, its typed results, and the text analysis shared by the backends."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from searchgym.data.types import Passage
from searchgym.errors import ConfigError

__all__ = ["STOP_WORDS", "Analyzer", "Hit", "Retriever", "analyze", "s_stem"]

_WORD = re.compile(r"\w+")
_MEMO_LIMIT = 1_000_000

#: A small English stop-word list: articles, auxiliaries, pronouns, prepositions and question words, which
#: carry no topic in a query and only add long posting lists. Deliberately short: negations, numbers and
#: content words (``born``, ``first``) are kept, because QA questions hinge on them.
STOP_WORDS: frozenset[str] = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "been",
        "being",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "for",
        "from",
        "had",
        "has",
        "have",
        "he",
        "her",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "our",
        "she",
        "so",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "to",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "whose",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)


def analyze(text: str) -> list[str]:
    """The default text analysis shared by indexing and querying: lower case, ``\\w+`` word tokens."""
    return _WORD.findall(text.lower())


def s_stem(token: str) -> str:
    """Harman's "S" stemmer: folds English plurals (``cities`` → ``city``, ``works`` → ``work``).

    Three ordered rules, the first that applies wins: ``-ies`` → ``-y`` (not after ``e``/``a``); ``-es`` →
    ``-e`` (not after ``a``/``e``/``o``); ``-s`` → removed (not after ``u``/``s``). Conservative on purpose:
    it never merges words that differ by more than plural inflection, so precision stays high.
    """
    if len(token) > 3 and token.endswith("ies") and token[-4] not in "ea":
        return token[:-3] + "y"
    if len(token) > 3 and token.endswith("es") and token[-3] not in "aeo":
        return token[:-1]
    if len(token) > 2 and token.endswith("s") and token[-2] not in "us":
        return token[:-1]
    return token


@dataclass(frozen=True)
class Analyzer:
    """A text analysis: ``\\w+`` word tokens, then optional lower-casing, stop-word removal and stemming.

    One analyzer object is used for both the corpus and the queries of an index, and it is saved with the
    index, so the two can never drift apart. ``Analyzer()`` is exactly :func:`analyze`.

    Attributes:
        lowercase: Lower-case the text before tokenising.
        stopwords: Tokens (after lower-casing) dropped from the stream; see :data:`STOP_WORDS`.
        stem: Apply :func:`s_stem` to every kept token.
    """

    lowercase: bool = True
    stopwords: frozenset[str] = frozenset()
    stem: bool = False
    # token -> analysed token ("" when dropped). Stemming costs a Python call per token; a corpus repeats
    # few distinct tokens many times, so memoising makes indexing several times faster.
    _memo: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __call__(self, text: str) -> list[str]:
        """The tokens of ``text``."""
        tokens = _WORD.findall(text.lower() if self.lowercase else text)
        if not (self.stopwords or self.stem):
            return tokens
        memo = self._memo
        if len(memo) > _MEMO_LIMIT:  # bound the memory a long-running server spends on odd queries
            memo.clear()
        out = []
        for token in tokens:
            kept = memo.get(token)
            if kept is None:
                kept = memo[token] = self._normalise(token)
            if kept:
                out.append(kept)
        return out

    def _normalise(self, token: str) -> str:
        if token in self.stopwords:
            return ""
        return s_stem(token) if self.stem else token

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable description (stop words sorted, so equal analyzers serialise equally)."""
        return {"lowercase": self.lowercase, "stopwords": sorted(self.stopwords), "stem": self.stem}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Analyzer:
        """The inverse of :meth:`to_dict`.

        Raises:
            ConfigError: a key is missing or has the wrong type.
        """
        try:
            lowercase, stopwords, stem = data["lowercase"], data["stopwords"], data["stem"]
        except (KeyError, TypeError) as e:
            raise ConfigError(f"invalid analyzer description {data!r}: missing {e}") from None
        if not isinstance(lowercase, bool) or not isinstance(stem, bool) or not isinstance(stopwords, list):
            raise ConfigError(f"invalid analyzer description {data!r}")
        return cls(lowercase=lowercase, stopwords=frozenset(str(w) for w in stopwords), stem=stem)


@dataclass(frozen=True)
class Hit:
    """One retrieved passage.

    Attributes:
        passage_id: Corpus id of the passage.
        title: Passage title (no quotes).
        text: Passage text.
        score: Retrieval score (higher is better; scale depends on the backend).
        raw_contents: The document's FlashRAG ``contents`` exactly as stored (e.g. as a server returned it),
            or ``None`` when only the title and text are known.
    """

    passage_id: str
    title: str
    text: str
    score: float
    raw_contents: str | None = None

    @property
    def contents(self) -> str:
        """The FlashRAG ``contents``: :attr:`raw_contents` when known, else ``'"title"\\ntext'``."""
        return self.raw_contents if self.raw_contents is not None else f'"{self.title}"\n{self.text}'

    @classmethod
    def of(cls, passage: Passage, score: float) -> Hit:
        """The hit for a corpus passage (its ``contents`` as the passage gives them)."""
        return cls(passage.id, passage.title, passage.text, float(score), passage.contents)


class Retriever(ABC):
    """Answers a batch of queries with the top-k passages of each.

    Subclasses implement :meth:`search`; a batch is the unit of work so that vectorised environments can
    send all searches of one step in one call. Results are ordered by decreasing score; ties are broken by
    corpus position (earlier first), so rankings are deterministic.
    """

    name: str = "retriever"

    @abstractmethod
    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Returns, for each query, its top ``k`` hits (fewer when the corpus is smaller).

        Raises:
            RetrieverError: retrieval failed; the message says why.
        """

    def close(self) -> None:  # noqa: B027 - an optional hook with a no-op default, not abstract
        """Releases resources (connections, files). The default has none."""
