"""Typed records shared by every dataset: passages, questions, and a dataset with its splits."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from searchgym.errors import ConfigError, UnknownQuestionError

__all__ = ["Dataset", "LazySplits", "Passage", "Question", "SplitSelection", "parse_split"]

T = TypeVar("T")
_SPLIT = re.compile(r"(?P<name>[^\[\]]*)(?:\[(?P<slice>[^\[\]]*)\])?")
_BOUND = re.compile(r"(?P<value>[+-]?\d+)(?P<percent>%?)")
_SLICE_EXAMPLES = "e.g. test[:2000], test[2000:], train[10%:], train[:-500]"


@dataclass(frozen=True)
class SplitSelection:
    """A split name with an optional slice of its questions, as Hugging Face ``datasets`` spells it.

    ``"test"`` is the whole split; ``"test[:2000]"`` its first 2,000 questions, ``"test[2000:]"`` the rest,
    ``"train[10%:]"`` all but the first tenth (a percentage bound is rounded to the nearest question),
    ``"train[:-500]"`` all but the last 500. Bounds follow Python's slices: negative ones count from the end.

    Attributes:
        spec: The text as given.
        name: The split's name (``"test"``).
        start: The slice's start as ``(value, is_percent)``, or ``None`` when open.
        stop: The slice's stop, likewise.
    """

    spec: str
    name: str
    start: tuple[int, bool] | None = None
    stop: tuple[int, bool] | None = None

    @property
    def sliced(self) -> bool:
        """Whether the selection is a slice rather than the whole split."""
        return self.start is not None or self.stop is not None

    @property
    def file_stem(self) -> str:
        """A file-name-safe form of the selection: ``test`` or ``test_0-2000``, ``train_10pct-end``."""
        if not self.sliced:
            return self.name

        def word(bound: tuple[int, bool] | None, open_as: str) -> str:
            if bound is None:
                return open_as
            value, percent = bound
            return ("m" if value < 0 else "") + str(abs(value)) + ("pct" if percent else "")

        return f"{self.name}_{word(self.start, '0')}-{word(self.stop, 'end')}"

    def indices(self, size: int) -> range:
        """The positions the selection keeps in a split of ``size`` questions."""

        def absolute(bound: tuple[int, bool] | None) -> int | None:
            if bound is None:
                return None
            value, percent = bound
            return round(value * size / 100) if percent else value

        return range(size)[slice(absolute(self.start), absolute(self.stop))]

    def select(self, items: Sequence[T]) -> list[T]:
        """The selected items of a whole split.

        Raises:
            ConfigError: a slice selects nothing (the message gives the split's size).
        """
        if not self.sliced:
            return list(items)
        kept = self.indices(len(items))
        if not kept:
            raise ConfigError(
                f"split {self.spec!r} selects no questions: split {self.name!r} has {len(items)}"
            )
        return [items[i] for i in kept]


def parse_split(spec: str) -> SplitSelection:
    """Reads a split argument: a name, optionally followed by a slice (see :class:`SplitSelection`).

    Raises:
        ConfigError: the text is not ``NAME`` or ``NAME[START:STOP]`` with integer or percentage bounds (one
            line, with examples).
    """
    whole = _SPLIT.fullmatch(spec.strip()) if isinstance(spec, str) else None
    if whole is None or not whole["name"].strip():
        raise ConfigError(f"split {spec!r} is not NAME or NAME[START:STOP] ({_SLICE_EXAMPLES})")
    name = whole["name"].strip()
    if whole["slice"] is None:
        return SplitSelection(spec, name)
    parts = whole["slice"].split(":")
    if len(parts) != 2:
        raise ConfigError(
            f"split {spec!r}: the slice takes a start and a stop, START:STOP, without a step ({_SLICE_EXAMPLES})"
        )
    bounds: list[tuple[int, bool] | None] = []
    for part in parts:
        if not part.strip():
            bounds.append(None)
            continue
        bound = _BOUND.fullmatch(part.strip())
        if bound is None:
            raise ConfigError(
                f"split {spec!r}: slice bound {part.strip()!r} is not an integer or a percentage ({_SLICE_EXAMPLES})"
            )
        value, percent = int(bound["value"]), bool(bound["percent"])
        if percent and abs(value) > 100:
            raise ConfigError(f"split {spec!r}: a percentage bound lies in -100%..100%, got {part.strip()!r}")
        bounds.append((value, percent))
    if bounds == [None, None]:
        raise ConfigError(f"split {spec!r}: the slice selects the whole split; write {name!r}")
    return SplitSelection(spec, name, bounds[0], bounds[1])


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
    _selections: dict[str, list[Question]] = field(default_factory=dict, repr=False, compare=False)
    retrievers: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """Named retrievers built over this corpus, shared by every env on the dataset (see ``shared_retriever``)."""

    @cached_property
    def passage_index(self) -> dict[str, Passage]:
        """Passages by id."""
        return {p.id: p for p in self.passages}

    def questions(self, split: str) -> list[Question]:
        """The questions of ``split``: a split's name, or a name with a slice (``"test[:2000]"``,
        ``"train[10%:]"``; see :class:`SplitSelection`).

        Raises:
            ConfigError: an unknown split (the message lists the available ones), a malformed slice, or a
                slice that selects nothing.
        """
        selection = parse_split(split)
        try:
            questions = self.splits[selection.name]
        except KeyError:
            raise ConfigError(
                f"dataset {self.name!r} has no split {selection.name!r}; available: {sorted(self.splits)}"
                + (
                    f" (a slice of one is written NAME[START:STOP], {_SLICE_EXAMPLES})"
                    if "[" not in split
                    else ""
                )
            ) from None
        if not selection.sliced:
            return questions
        if split not in self._selections:  # kept: find_question asks for the same slice at every reset
            self._selections[split] = selection.select(questions)
        return self._selections[split]

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
        return self.questions(split)[index[question_id]]
