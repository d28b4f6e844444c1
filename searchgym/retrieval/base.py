"""The batched retriever interface and its typed results."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from searchgym.data.types import Passage

__all__ = ["Hit", "Retriever", "analyze"]

_WORD = re.compile(r"\w+")


def analyze(text: str) -> list[str]:
    """The default text analysis shared by indexing and querying: lower case, ``\\w+`` word tokens."""
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Hit:
    """One retrieved passage.

    Attributes:
        passage_id: Corpus id of the passage.
        title: Passage title (no quotes).
        text: Passage text.
        score: Retrieval score (higher is better; scale depends on the backend).
    """

    passage_id: str
    title: str
    text: str
    score: float

    @classmethod
    def of(cls, passage: Passage, score: float) -> Hit:
        return cls(passage.id, passage.title, passage.text, float(score))


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

    def close(self) -> None:
        """Releases resources (connections, files). The default has none."""
