"""SearchQAMacro-v0: the SearchQA episodes as a small discrete choice, for classic RL agents.

Each macro action picks one whole turn — search one of a few candidate queries, or answer one of a few
candidate answers — and the environment writes that turn's tokens into a token-level
:class:`~searchgym.envs.search_qa.SearchQAEnv`, one token at a time. The transcript, the reward and the
episode ``info`` are therefore exactly those of the token-level env for the same policy tokens.

Candidates are read from the question and the retrieved passages with a few lexical patterns (passage
titles, capitalised spans, numbers, the noun after "is a/an"), and each is described by a fixed vector of
lexical features, so any ``MlpPolicy`` can learn which one to pick.
"""

from __future__ import annotations

import bisect
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from searchgym.data import Dataset, Question, load_dataset
from searchgym.envs.episode import Episode, is_int
from searchgym.envs.spec import EnvSpec, make_spec
from searchgym.errors import ConfigError, EpisodeFinishedError, InvalidActionError
from searchgym.retrieval import Hit, Retriever
from searchgym.retrieval.leases import acquire_retriever, release_retriever
from searchgym.rewards import normalize_answer
from searchgym.tokenization import Tokenizer

from .search_qa import SearchQAEnv

__all__ = [
    "CANDIDATE_FEATURES",
    "CUE_WORDS",
    "GLOBAL_FEATURES",
    "Candidate",
    "SearchQAMacroEnv",
    "answer_candidates",
    "passage_candidates",
    "query_candidates",
    "question_candidates",
]

CandidateKind = Literal["question", "span", "title", "name", "number", "noun"]

CUE_WORDS: tuple[str, ...] = (
    "who", "what", "which", "year", "city", "country", "organisation", "occupation",
    "founded", "founder", "born", "created", "creator", "headquartered", "headquarters", "first", "earlier",
)  # fmt: skip
"""Answer-type cue words; the observation says which of them the question holds."""

GLOBAL_FEATURES: tuple[str, ...] = (
    "turn",  # turns used / max_turns
    "searches",  # searches made / max_turns
    "last_turn",  # 1 when the next turn is the last one (it must answer)
    "query_slots",  # filled query slots / n_queries
    "answer_slots",  # filled answer slots / n_answers
    *(f"cue_{w}" for w in CUE_WORDS),  # 1 when the question holds the word
)
"""Names of the leading entries of the observation, in order."""

CANDIDATE_FEATURES: tuple[str, ...] = (
    "valid",  # 1 when the slot holds a candidate (all other features are 0 otherwise)
    "from_question",  # read from the question text (not from a passage)
    "is_title",  # equals the title of a retrieved passage
    "is_name",  # a capitalised span
    "is_number",  # digits only
    "is_noun",  # the lower-case noun after "is a/an"
    "question_overlap",  # share of its words that occur in the question
    "cue_overlap",  # share of the content words just before it (in its passage) that occur in the question
    "title_overlap",  # share of its passage title's words that occur in the question
    "rank",  # 1 / (1 + rank of its passage in its search); 0 for question candidates
    "recency",  # 1 / (1 + searches made since its search); 0 for question candidates
    "score",  # its passage's retrieval score / the best score of that search
    "position",  # word offset in its passage / passage length
    "searched",  # it was already used as a query
    "mentions",  # retrieved passages that mention it, / topk (clipped at 1)
    "words",  # its number of words / 4 (clipped at 1)
)
"""Names of the per-candidate features: each slot of the observation is one such vector."""

MAX_CANDIDATES = 1024
"""The most query or answer candidates an observation describes (``n_queries``, ``n_answers``)."""

_SPAN = re.compile(r"\b[A-Z][\w'-]*(?:\s+(?:of\s+)?[A-Z][\w'-]*)*")
_NUMBER = re.compile(r"\b\d+\b")
_NOUN = re.compile(r"\b(?:is|was) an? ([a-z][a-z-]+)\b")
_WORDS = re.compile(r"\w+")
# Capitalised only because they open a sentence or a question: never part of an entity name.
_LEADING = frozenset({
    "a", "an", "in", "on", "at", "of", "for", "by", "to", "from", "which", "who", "whom", "whose", "what", "when",
    "where", "why", "how", "it", "its", "he", "she", "they", "his", "her", "their", "this", "that", "these",
    "those", "there", "doc", "title",
})  # fmt: skip
_STOPWORDS = _LEADING | {"the", "is", "was", "are", "were", "be", "and", "or", "as", "with", "did", "does"}


@dataclass(frozen=True)
class Candidate:
    """One candidate query or answer, with where it was read.

    Attributes:
        text: The text that the turn would carry.
        kind: ``"question"`` (the whole question, a query), ``"span"`` (a capitalised span of the question),
            ``"title"``, ``"name"`` (capitalised span), ``"number"`` or ``"noun"`` (read from a passage).
        search: Index of the search whose passages held it; -1 for question candidates.
        rank: Rank of its passage in that search (0 = top); -1 for question candidates.
        position: Word offset in its passage divided by the passage length (0 for titles and the question).
        cue: Share of the content words just before it (up to 4 words) that occur in the question.
    """

    text: str
    kind: CandidateKind
    search: int = -1
    rank: int = -1
    position: float = 0.0
    cue: float = 0.0

    @property
    def key(self) -> str:
        """The normalised text: two candidates with the same key are the same choice."""
        return normalize_answer(self.text)


def _words_before(text: str, words: list[re.Match[str]], starts: list[int], cut: int) -> list[str]:
    """``_WORDS.findall(text[:cut])`` from words found once: a word the cut splits keeps its first part."""
    i = bisect.bisect_left(starts, cut)
    preceding = [w.group(0) for w in words[:i]]
    if i and words[i - 1].end() > cut:
        preceding[-1] = text[words[i - 1].start() : cut]
    return preceding


def _content_words(text: str) -> set[str]:
    return {w for w in _WORDS.findall(text.lower()) if w not in _STOPWORDS}


def _entity_spans(text: str) -> list[tuple[str, int]]:
    """Capitalised spans of ``text`` with their character offsets; sentence openers are dropped."""
    out = []
    for m in _SPAN.finditer(text):
        words = [(w.group(0), m.start() + w.start()) for w in re.finditer(r"\S+", m.group(0))]
        while words and words[0][0].lower() in _LEADING:
            words.pop(0)
        if not words or (len(words) == 1 and words[0][0].lower() in _STOPWORDS):
            continue
        out.append((text[words[0][1] : m.end()], words[0][1]))
    return out


def question_candidates(question: str) -> list[Candidate]:
    """The capitalised spans of the question (entity-like names), in order."""
    return [Candidate(span, "span") for span, _ in _entity_spans(question)]


def passage_candidates(hit: Hit, search: int, rank: int, question_words: set[str]) -> list[Candidate]:
    """Candidates read from one retrieved passage: its title, then names, numbers and nouns in text order.

    Args:
        hit: The passage.
        search: Index of the search that returned it.
        rank: Its rank in that search (0 = top).
        question_words: Content words of the question, for the ``cue`` feature.
    """
    text = hit.text
    words = list(_WORDS.finditer(text))  # tokenised once: candidates look up the words before them
    starts = [w.start() for w in words]
    n_words = max(1, len(words))
    found: list[tuple[int, str, CandidateKind]] = [
        (m.start(1), m.group(1), "noun") for m in _NOUN.finditer(text)
    ]
    found += [(start, span, "name") for span, start in _entity_spans(text)]
    found += [(m.start(), m.group(0), "number") for m in _NUMBER.finditer(text)]
    found.sort(key=lambda f: f[0])
    out = [Candidate(hit.title, "title", search, rank)]
    for start, span, kind in found:
        preceding = _words_before(text, words, starts, start)
        before = _content_words(" ".join(preceding[-4:]))
        cue = len(before & question_words) / len(before) if before else 0.0
        position = len(preceding) / n_words
        out.append(Candidate(span, kind, search, rank, position, cue))
    return out


def _dedup(candidates: Sequence[Candidate], limit: int) -> list[Candidate]:
    seen: set[str] = set()
    out = []
    for c in candidates:
        if c.key and c.key not in seen:
            seen.add(c.key)
            out.append(c)
            if len(out) == limit:
                break
    return out


def query_candidates(question: str, searches: Sequence[Sequence[Candidate]], limit: int) -> list[Candidate]:
    """Candidate queries: the question, its spans, then titles and names of the passages (latest search first).

    Args:
        question: The question text.
        searches: The candidates of each search's passages, in search order.
        limit: Number of slots; later candidates are dropped.
    """
    from_passages = [c for found in reversed(searches) for c in found if c.kind in ("title", "name")]
    return _dedup([Candidate(question, "question"), *question_candidates(question), *from_passages], limit)


def answer_candidates(question: str, searches: Sequence[Sequence[Candidate]], limit: int) -> list[Candidate]:
    """Candidate answers: every passage candidate (latest search first), then the question's spans.

    Question spans come last so that the slots of a passage keep their places; they are there for questions
    whose answer is named in the question (comparisons).
    """
    from_passages = [c for found in reversed(searches) for c in found]
    return _dedup([*from_passages, *question_candidates(question)], limit)


class _RecordingRetriever(Retriever):
    """Passes searches through and keeps the last results (with scores) for the candidate features."""

    def __init__(self, inner: Retriever) -> None:
        self.inner = inner
        self.name = inner.name
        self.last: list[Hit] | None = None

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.last = None
        results = self.inner.search(queries, k)
        self.last = results[0] if results else []
        return results

    def close(self) -> None:
        """Nothing to release: the wrapped retriever belongs to the macro env, which releases it."""


class SearchQAMacroEnv(gym.Env[np.ndarray, int]):
    """Answer a question by choosing whole turns: which candidate to search, or which candidate to answer.

    ## Description

    The SearchQA task (see :class:`~searchgym.envs.search_qa.SearchQAEnv`) with a small discrete action
    space, so that classic RL algorithms (PPO, A2C, DQN) can learn it. Every step is one turn. The env holds
    a token-level ``SearchQAEnv`` and writes the chosen turn, ``<search> q </search>`` or
    ``<answer> a </answer>``, into it token by token (the tokenizer's encoding of that text); search,
    tool output, turn budget and reward are the token-level env's, so a macro episode and the token-level
    replay of its policy tokens have the same reward and ``info``.

    Candidates are rebuilt after every search. Queries: the whole question, its capitalised spans, then the
    titles and capitalised spans of the retrieved passages (latest search first). Answers: the titles,
    capitalised spans (``of`` may join them: *Republic of Zenthar*), numbers, and nouns after *is a/an* of
    the retrieved passages (latest search first, by rank, in text order), then the question's spans.
    Duplicates (same normalised text) keep their first slot; extra candidates are dropped.

    ## Action Space

    ``Discrete(n_queries + n_answers)``: action ``i < n_queries`` searches query slot ``i``; action
    ``n_queries + j`` answers answer slot ``j``. An empty slot writes ``<search> </search>``, an invalid turn
    (Search-R1's corrective message follows, and the turn counts). ``info["action_mask"]`` marks the filled
    slots as a list of bools, and ``action_masks()`` returns it as an array (the method sb3-contrib's
    MaskablePPO looks for).

    ## Observation Space

    ``Box(0, 1, (G + (n_queries + n_answers) * F,), float32)``: ``G = len(GLOBAL_FEATURES)`` global
    features, then one vector of ``F = len(CANDIDATE_FEATURES)`` features per slot, query slots first, in
    action order. Global features: ``turn``, ``searches``, ``last_turn``, ``query_slots``, ``answer_slots``,
    then one ``cue_<word>`` indicator per word of :data:`CUE_WORDS`. Candidate features (all 0 in an empty
    slot): ``valid``, ``from_question``, ``is_title``, ``is_name``, ``is_number``, ``is_noun``,
    ``question_overlap``, ``cue_overlap``, ``title_overlap``, ``rank``, ``recency``, ``score``, ``position``,
    ``searched``, ``mentions``, ``words`` (definitions in :data:`CANDIDATE_FEATURES`).

    ## Rewards

    The token-level env's: 0 until the episode ends, then the answer metric (``reward=``) of the answer.

    ## Starting State

    A question drawn uniformly from the split with the env's ``np_random`` (or pinned with
    ``reset(options={"question_id": ...})`` or ``{"question_index": i}``). Query candidates are the question
    and its spans; answer candidates are the question's spans.

    ## Episode End

    As in the token-level env: terminated when a turn answers or the last turn does not
    (``end_reason`` ``"answered"`` / ``"turn_budget"``), truncated at the context limit.

    ## Info

    The token-level env's ``info`` at the end of the turn (``question_id``, ``queries``, ``answer``, ``em``,
    ``end_reason``, ...), plus ``turn_text`` (the text written this step; absent at reset),
    ``action_mask`` and ``candidates`` (``{"queries": [...], "answers": [...]}``, the texts of the slots).

    ## Arguments

    * ``n_queries``: query slots (8).
    * ``n_answers``: answer slots (12).
    * Every other argument is the token-level env's: ``spec`` (an :class:`~searchgym.envs.EnvSpec`) and any
      of its fields as keyword arguments, ``tokenizer``, ``render_mode``.

    ## Version History

    * v0: initial version (SearchQA-v0 dynamics).
    """

    metadata = SearchQAEnv.metadata

    def __init__(
        self,
        spec: EnvSpec | None = None,
        *,
        tokenizer: Any = None,
        render_mode: str | None = None,
        n_queries: int = 8,
        n_answers: int = 12,
        **fields: Any,
    ) -> None:
        if not all(is_int(n) and 1 <= n <= MAX_CANDIDATES for n in (n_queries, n_answers)):
            raise ConfigError(
                f"n_queries and n_answers must be integers >= 1 and <= {MAX_CANDIDATES}, got {n_queries!r:.40} "
                f"and {n_answers!r:.40}"
            )
        self.env_spec = spec = make_spec(spec, fields)
        data = load_dataset(spec.dataset, world_seed=spec.world_seed)
        # The recorder keeps the scored hits of each search; the token env executes the search itself.
        inner, owned = acquire_retriever(data, spec.retriever, spec.retriever_patience)
        self._recorder = _RecordingRetriever(inner)
        self._release = (
            weakref.finalize(self, release_retriever, data, spec.retriever, spec.retriever_patience)
            if owned
            else None
        )
        self.core = SearchQAEnv(
            spec.replace(dataset=data, retriever=self._recorder), tokenizer=tokenizer, render_mode=render_mode
        )
        self.render_mode = render_mode
        self.n_queries = n_queries
        self.n_answers = n_answers
        n_obs = len(GLOBAL_FEATURES) + (n_queries + n_answers) * len(CANDIDATE_FEATURES)
        self.action_space = spaces.Discrete(n_queries + n_answers)  # type: ignore[assignment]  # int or np.int64
        self.observation_space = spaces.Box(0.0, 1.0, shape=(n_obs,), dtype=np.float32)
        self._searches: list[list[Hit]] = []
        self._found: list[list[Candidate]] = []
        self.query_slots: list[Candidate] = []
        self.answer_slots: list[Candidate] = []

    # -- what the evaluation harness and the CLI read from env.unwrapped ----------------------------------

    @property
    def dataset(self) -> Dataset:
        return self.core.dataset

    @property
    def split(self) -> str:
        return self.core.split

    @property
    def questions(self) -> list[Question]:
        return self.core.questions

    @property
    def tokenizer(self) -> Tokenizer:
        return self.core.tokenizer

    @property
    def episode(self) -> Episode:
        return self.core.episode

    # -- Gymnasium API -----------------------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        if not options:
            options["question_index"] = int(self.np_random.integers(len(self.questions)))
        _, info = self.core.reset(options=options)  # the core validates pinned questions
        self._searches, self._found = [], []
        self._rebuild()
        return self._observation(), self._with_slots(info)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.episode.question is None:
            raise EpisodeFinishedError("step() called before reset(): call reset() to start an episode")
        text = self.turn_text(action)
        n_searches = len(self.episode.queries)
        reward, terminated, truncated = 0.0, False, False
        info: dict[str, Any] = {}
        for token in self.tokenizer.encode(text):
            _, r, terminated, truncated, info = self.core.step(token)
            reward += float(r)
            # The turn may end before its text does (max_turn_tokens, context limit): stop exactly there.
            if info.get("turn_end") or terminated or truncated:
                break
        else:
            raise RuntimeError(f"turn text {text!r} did not end a turn")  # its closing tag always ends it
        if len(self.episode.queries) > n_searches and self._recorder.last is not None:
            self._searches.append(self._recorder.last)
            self._found.append(
                [c for rank, hit in enumerate(self._recorder.last)
                 for c in passage_candidates(hit, len(self._searches) - 1, rank, self._question_words)]
            )  # fmt: skip
        self._rebuild()
        return (
            self._observation(),
            reward,
            terminated,
            truncated,
            {**self._with_slots(info), "turn_text": text},
        )

    def render(self) -> str | None:
        return self.core.render()

    def close(self) -> None:
        """Closes the token-level env and releases the shared retriever this env holds; idempotent."""
        self.core.close()
        if self._release is not None:
            self._release()

    # -- actions and candidates --------------------------------------------------------------------------

    def turn_text(self, action: int) -> str:
        """The turn that ``action`` writes in the current state."""
        try:
            index = int(action)
            ok = index == action and 0 <= index < self.n_queries + self.n_answers
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise InvalidActionError(f"action {action!r} is not in [0, {self.n_queries + self.n_answers})")
        if index < self.n_queries:
            slot = self.query_slots[index] if index < len(self.query_slots) else None
            return f"<search> {slot.text} </search>" if slot else "<search> </search>"
        slot = (
            self.answer_slots[index - self.n_queries]
            if index - self.n_queries < len(self.answer_slots)
            else None
        )
        return f"<answer> {slot.text} </answer>" if slot else "<search> </search>"

    def action_masks(self) -> np.ndarray:
        """``(n_queries + n_answers,)`` bool: True where the slot holds a candidate (sb3-contrib's name)."""
        mask = np.zeros(self.n_queries + self.n_answers, dtype=bool)
        mask[: len(self.query_slots)] = True
        mask[self.n_queries : self.n_queries + len(self.answer_slots)] = True
        return mask

    def action_for(self, text: str, kind: Literal["search", "answer"]) -> int | None:
        """The action that searches / answers ``text`` (compared normalised), or ``None`` if no slot holds it."""
        key = normalize_answer(text)
        slots, offset = (self.query_slots, 0) if kind == "search" else (self.answer_slots, self.n_queries)
        for i, c in enumerate(slots):
            if c.key == key:
                return offset + i
        return None

    @property
    def _question_words(self) -> set[str]:
        question = self.episode.question
        assert question is not None
        return _content_words(question.question)

    def _rebuild(self) -> None:
        question = self.episode.question
        assert question is not None
        self.query_slots = query_candidates(question.question, self._found, self.n_queries)
        self.answer_slots = answer_candidates(question.question, self._found, self.n_answers)

    def _with_slots(self, info: dict[str, Any]) -> dict[str, Any]:
        return {
            **info,
            "action_mask": self.action_masks().tolist(),  # a list: info stays JSON-serialisable
            "candidates": {"queries": [c.text for c in self.query_slots],
                           "answers": [c.text for c in self.answer_slots]},
        }  # fmt: skip

    # -- observation -------------------------------------------------------------------------------------

    def _observation(self) -> np.ndarray:
        ep, max_turns = self.episode, self.env_spec.max_turns
        question = ep.question
        assert question is not None
        q_words = set(_WORDS.findall(question.question.lower()))
        turns = len(ep.turns)
        head = [
            turns / max_turns,
            len(ep.queries) / max_turns,
            float(turns == max_turns - 1),
            len(self.query_slots) / self.n_queries,
            len(self.answer_slots) / self.n_answers,
            *(float(w in q_words) for w in CUE_WORDS),
        ]
        searched = {normalize_answer(q) for q in ep.queries}
        passages = [normalize_answer(f"{h.title} {h.text}") for hits in self._searches for h in hits]
        rows = [self._features(c, q_words, searched, passages) for c in self.query_slots]
        rows += [[0.0] * len(CANDIDATE_FEATURES)] * (self.n_queries - len(self.query_slots))
        rows += [self._features(c, q_words, searched, passages) for c in self.answer_slots]
        rows += [[0.0] * len(CANDIDATE_FEATURES)] * (self.n_answers - len(self.answer_slots))
        obs = np.asarray(head + [v for row in rows for v in row], dtype=np.float32)
        return np.clip(obs, 0.0, 1.0)

    def _features(
        self, c: Candidate, q_words: set[str], searched: set[str], passages: list[str]
    ) -> list[float]:
        words = _WORDS.findall(c.text.lower())
        hit = self._searches[c.search][c.rank] if c.search >= 0 else None
        if hit is not None:
            title_words = _WORDS.findall(hit.title.lower())
            title_overlap = sum(w in q_words for w in title_words) / max(1, len(title_words))
            best = max(h.score for h in self._searches[c.search])
            score = hit.score / best if best > 0 else 0.0
        else:
            title_overlap, score = 0.0, 0.0
        key = c.key
        return [
            1.0,
            float(c.search < 0),
            float(c.kind == "title"),
            float(c.kind in ("name", "span")),
            float(c.kind == "number"),
            float(c.kind == "noun"),
            sum(w in q_words for w in words) / max(1, len(words)),
            c.cue,
            title_overlap,
            1.0 / (1 + c.rank) if c.search >= 0 else 0.0,
            1.0 / (len(self._searches) - c.search) if c.search >= 0 else 0.0,
            score,
            c.position,
            float(key in searched),
            min(1.0, sum(f" {key} " in f" {p} " for p in passages) / self.env_spec.topk),
            min(1.0, len(words) / 4),
        ]
