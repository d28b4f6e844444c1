"""Typed records shared by every dataset: passages, questions, and a dataset with its splits."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from searchgym.errors import ConfigError, UnknownQuestionError

__all__ = ["Dataset", "LazySplits", "Passage", "Question"]


@dataclass(frozen=True)
class Passage:
    """One retrievable passage.

    Attributes:
        id: Corpus-unique id (a string, as in FlashRAG).
        title: The title, without the surrounding quotes that FlashRAG's ``contents`` field carries.
        text: The passage body.
        raw: The corpus line's ``contents`` exactly as stored, when the passage was read from a file (an
            unquoted title stays unquoted, as Search-R1 shows it); ``None`` for generated passages.
    """

    id: str
    title: str
    text: str
    raw: str | None = field(default=None, repr=False, compare=False)

    @property
    def contents(self) -> str:
        """The FlashRAG ``contents`` string: the stored line when known, else the quoted title, a newline, the text."""
        return self.raw if self.raw is not None else f'"{self.title}"\n{self.text}'


@dataclass(frozen=True)
class Question:
    """One question with its golden answers.

    Attributes:
        id: Split-unique id.
        question: The question text.
        golden_answers: Accepted answers (aliases included); any of them scores.
        supporting_ids: Ids of the passages that hold the evidence (empty when the dataset has none).
        kind: Question type, e.g. ``"attribute"``, ``"bridge"``, ``"comparison"`` (free-form for real data).
        hops: Number of passages needed to answer (0 when unknown).
        metadata: Anything else the source record carried.
    """

    id: str
    question: str
    golden_answers: tuple[str, ...]
    supporting_ids: tuple[str, ...] = ()
    kind: str = ""
    hops: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


class LazySplits(Mapping[str, list["Question"]]):
    """Named splits whose questions are read on first access (then kept).

    A dataset folder may hold files that are not splits, or splits the user never asks for; reading only
    the requested one keeps a malformed neighbour from breaking it.

    Args:
        readers: For each split name, a function that reads its questions.
    """

    def __init__(self, readers: Mapping[str, Callable[[], list[Question]]]) -> None:
        self._readers = dict(readers)
        self._loaded: dict[str, list[Question]] = {}

    def __getitem__(self, split: str) -> list[Question]:
        if split not in self._loaded:
            read = self._readers[split]  # KeyError for an unknown split, as a dict
            self._loaded[split] = read()
        return self._loaded[split]

    def read_all(self) -> None:
        """Reads every split now (so that their errors show at once)."""
        for split in self._readers:
            self[split]

    def __iter__(self) -> Iterator[str]:
        return iter(self._readers)

    def __len__(self) -> int:
        return len(self._readers)

    def __repr__(self) -> str:
        return f"LazySplits({sorted(self._readers)}, loaded={sorted(self._loaded)})"


@dataclass
class Dataset:
    """A corpus of passages and named splits of questions over it."""

    name: str
    passages: list[Passage]
    splits: Mapping[str, list[Question]]
    _question_indexes: dict[str, dict[str, int]] = field(default_factory=dict, repr=False, compare=False)
    retrievers: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """Named retrievers built over this corpus, shared by every env on the dataset (see ``shared_retriever``)."""

    @cached_property
    def passage_index(self) -> dict[str, Passage]:
        """Passages by id."""
        return {p.id: p for p in self.passages}

    def questions(self, split: str) -> list[Question]:
        """The questions of ``split``; an unknown split lists the available ones."""
        try:
            return self.splits[split]
        except KeyError:
            raise ConfigError(
                f"dataset {self.name!r} has no split {split!r}; available: {sorted(self.splits)}"
            ) from None

    def question_index(self, split: str) -> dict[str, int]:
        """Maps question id to its position in ``split`` (built once per split)."""
        if split not in self._question_indexes:
            self._question_indexes[split] = {q.id: i for i, q in enumerate(self.questions(split))}
        return self._question_indexes[split]

    def find_question(self, split: str, question_id: str) -> Question:
        """The question with ``question_id`` in ``split``.

        Raises:
            UnknownQuestionError: no question of that id exists in the split.
        """
        index = self.question_index(split)
        if question_id not in index:
            raise UnknownQuestionError(
                f"no question with id {question_id!r} in split {split!r} of {self.name!r} "
                f"({len(index)} questions; env.unwrapped.questions lists them)"
            )
        return self.splits[split][index[question_id]]
