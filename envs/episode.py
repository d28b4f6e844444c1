"""The token-level episode state machine shared by the single and the vector environments.

An :class:`Episode` holds one question's transcript as fixed-size token and source arrays. Policy tokens
are fed one at a time; the episode watches the byte stream of the current turn for a closing tag and
resolves the turn at the exact token where a tag completes (or at EOS, or at the per-turn token cap). A
search is not executed here: :meth:`Episode.feed` reports :attr:`Event.SEARCH` with the pending query, and
the owner delivers the hits with :meth:`Episode.deliver` — which is what lets a vector environment send the
searches of many episodes to the retriever in one batched call.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from searchgym.data.types import Question
from searchgym.envs.spec import EnvSpec
from searchgym.errors import ConfigError, InvalidActionError, SearchGymError
from searchgym.protocol import (
    BASE_PROMPT,
    INVALID_TURN_MESSAGE,
    Source,
    StopScanner,
    format_documents,
    format_prompt,
    format_search_failure,
    parse_action,
)
from searchgym.retrieval.base import Hit
from searchgym.retrieval.faults import FAULT_KINDS
from searchgym.rewards import exact_match, f1_score, get_metric, sub_exact_match
from searchgym.tokenization import Tokenizer

__all__ = [
    "END_REASONS",
    "Episode",
    "EpisodeSnapshot",
    "Event",
    "Source",
    "Turn",
    "check_segment",
    "check_token",
    "freeze_state",
    "thaw_state",
]

END_REASONS = ("answered", "turn_budget", "context_limit")

# Where the ``<information>`` block is cut into parts for the tokenizer's cache: after the ``Doc`` of each
# ``Doc i(Title: …`` header, so a part is `` i(Title: …) <passage>\nDoc`` — one passage at one rank.
_DOCUMENT_CUT = re.compile(r"(?<=Doc)(?= \d+\(Title: )")
# The base prompt is cut after the last word of its fixed text (``… <answer> Beijing``), so that text is
# tokenised once and only the rest (`` </answer>. Question: …``) per question.
_PROMPT_HEAD = re.match(r"(?s).*[A-Za-z0-9](?= )", BASE_PROMPT.split("{question}")[0]).group()  # type: ignore[union-attr]


def check_token(action: Any, vocab_size: int) -> int:
    """Returns ``action`` as a token id, or raises :class:`InvalidActionError`.

    Python and NumPy integers (not bools, not floats) in ``[0, vocab_size)`` are token ids.
    """
    if isinstance(action, int | np.integer) and not isinstance(action, bool | np.bool_):
        token = int(action)
        if 0 <= token < vocab_size:
            return token
    raise InvalidActionError(f"action {action!r} is not a token id in [0, {vocab_size})")


def check_segment(segment: Any, vocab_size: int) -> list[int]:
    """Returns a token segment (any 1-D sequence of integer ids) as a list, checking every id first.

    Raises:
        InvalidActionError: the segment is empty, not 1-D, not integer, or holds an id outside the vocabulary.
    """
    array = np.asarray(segment)
    if array.ndim != 1 or array.shape[0] == 0:
        raise InvalidActionError(f"a segment must be a non-empty 1-D sequence of token ids, got {segment!r}")
    if not np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_:
        raise InvalidActionError(f"segment token ids must be integers, got dtype {array.dtype}")
    if array.min() < 0 or array.max() >= vocab_size:
        raise InvalidActionError(f"segment holds ids outside [0, {vocab_size}): {array.tolist()}")
    return [int(t) for t in array]


def freeze_state(state: Any) -> Any:
    """A generator state (``bit_generator.state``) made read-only: dicts as mapping proxies, arrays as
    read-only copies, so a snapshot holding it cannot be changed."""
    if isinstance(state, dict):
        return MappingProxyType({k: freeze_state(v) for k, v in state.items()})
    if isinstance(state, np.ndarray):
        frozen = state.copy()
        frozen.flags.writeable = False
        return frozen
    return state


def thaw_state(state: Any) -> Any:
    """The inverse of :func:`freeze_state`: what ``bit_generator.state`` accepts."""
    if isinstance(state, Mapping):
        return {k: thaw_state(v) for k, v in state.items()}
    if isinstance(state, np.ndarray):
        return state.copy()
    return state


class Event(enum.IntEnum):
    """What feeding one policy token caused."""

    CONTINUE = 0  # the turn goes on
    TURN_END = 1  # a turn ended and the episode continues (tool text may have been appended)
    SEARCH = 2  # a turn asked for a search: call deliver() with the hits
    DONE = 3  # the episode ended (terminated or truncated)


def is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


@dataclass(frozen=True)
class Turn:
    """One finished turn: where its policy tokens lie, how it was parsed, and what the tool answered.

    Frozen, so that a snapshot can hold the turns of an episode without copying them.
    """

    start: int
    end: int
    kind: str
    content: str
    stop: str  # "</search>", "</answer>", "eos", "max_turn_tokens" or "context_limit"
    hit_ids: tuple[str, ...] = ()


class EpisodeSnapshot(NamedTuple):
    """The state of an episode at one token, immutable (``SearchQAEnv.snapshot()``).

    Restoring it (``SearchQAEnv.restore``, ``SearchQAVectorEnv.restore``) puts an environment back exactly
    there: stepping the same tokens afterwards gives identical observations, rewards and infos. A snapshot
    holds only the episode (its arrays are read-only copies of the transcript so far; the question, turns
    and configuration are shared, immutable objects); the corpus, the retriever and the tokenizer stay
    with the environment and are never copied.

    Attributes:
        spec: The environment spec it was taken under (a restore checks its episode settings match).
        question: The question.
        token_bytes: The transcript's int64 token ids as bytes (read them as :attr:`tokens`).
        source_bytes: The int8 source marks as bytes (read them as :attr:`sources`).
        prompt_length: Tokens of the prompt.
        turns: The finished turns.
        queries: The executed searches' queries.
        search_hits: The passage ids each executed search returned.
        search_faults: The retriever faults drawn for each executed search (empty without faults).
        answer: The parsed answer, or ``None``.
        pending_query: A search waiting for its results (after a failed retrieval), or ``None``.
        end_reason: Why the episode ended, or ``None`` while it runs.
        cut_observations: Tool observations cut to ``max_obs_tokens``.
        truncated: The episode ended at the context limit.
        reward: The final reward (0 until the end).
        done: The episode has ended.
        turn_start: Where the current turn's policy tokens start.
        scanner: The stop scanner's state within the current turn (see ``StopScanner.state``).
        fault_rng: The bit-generator state of the retriever-fault generator (read-only, see
            :func:`freeze_state`), or ``None`` without faults.
        rng: The environment's ``np_random`` state (single env; read-only), or ``None`` (a vector env's
            sub-env, whose generator is shared by all sub-envs and not part of one episode).
    """

    spec: EnvSpec
    question: Question
    token_bytes: bytes
    source_bytes: bytes
    prompt_length: int
    turns: tuple[Turn, ...]
    queries: tuple[str, ...]
    search_hits: tuple[tuple[str, ...], ...]
    search_faults: tuple[tuple[str, ...], ...]
    answer: str | None
    pending_query: str | None
    end_reason: str | None
    cut_observations: int
    truncated: bool
    reward: float
    done: bool
    turn_start: int
    scanner: tuple[bytes, str, int]
    fault_rng: Mapping[str, Any] | None
    rng: Mapping[str, Any] | None

    @property
    def length(self) -> int:
        """Tokens in the transcript."""
        return len(self.source_bytes)

    @property
    def tokens(self) -> np.ndarray:
        """``(length,)`` int64, the transcript's token ids (a read-only view)."""
        return np.frombuffer(self.token_bytes, dtype=np.int64)

    @property
    def sources(self) -> np.ndarray:
        """``(length,)`` int8, the source marks (a read-only view)."""
        return np.frombuffer(self.source_bytes, dtype=np.int8)


class Episode:
    """One search-and-answer episode over a token transcript.

    Args:
        tokenizer: Encodes the prompt and tool text and maps ids to bytes for tag detection.
        spec: The environment spec (the episode reads its episode settings).
        tokens: Optional ``(max_context_tokens,)`` int64 buffer to write the transcript into (a vector env
            passes rows of its batch array, so observations need no gathering).
        sources: Optional ``(max_context_tokens,)`` int8 buffer for the source markers.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        spec: EnvSpec,
        tokens: np.ndarray | None = None,
        sources: np.ndarray | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.spec = spec
        self._metric = get_metric(spec.reward)
        self._scanner = StopScanner(tokenizer.token_bytes, tokenizer.eos_token_id)
        self._invalid_ids = np.asarray(tokenizer.encode(INVALID_TURN_MESSAGE), dtype=np.int64)
        size = spec.max_context_tokens
        self.tokens = np.zeros(size, dtype=np.int64) if tokens is None else tokens
        self.sources = np.zeros(size, dtype=np.int8) if sources is None else sources
        if self.tokens.shape != (size,) or self.sources.shape != (size,):
            raise ValueError(f"transcript buffers must have shape ({size},)")
        if self.tokens.dtype != np.int64 or self.sources.dtype != np.int8:
            raise ValueError("transcript buffers must be int64 (tokens) and int8 (sources)")
        # Byte views of the buffers: snapshots copy the transcript in and out as bytes, with no array overhead.
        self._token_bytes = self.tokens.data.cast("B")
        self._source_bytes = self.sources.data.cast("B")
        self.length = 0
        self.question: Question | None = None
        self.done = True
        # Draws the retriever faults of this episode's searches (set by the env when it injects faults).
        self.fault_rng: np.random.Generator | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self, question: Question) -> None:
        """Begins a new episode on ``question``: the transcript becomes the prompt."""
        text = format_prompt(question.question, self.spec.append_question_mark)
        prompt: Sequence[int] | np.ndarray
        if self.spec.prompt_style == "chat":
            prompt = self.tokenizer.chat_prompt_ids(text)
        elif text.startswith(_PROMPT_HEAD):
            prompt = self.tokenizer.encode_parts([_PROMPT_HEAD, text[len(_PROMPT_HEAD) :]])
        else:
            prompt = self.tokenizer.encode(text)
        if len(prompt) >= self.spec.max_context_tokens:
            raise ConfigError(
                f"the prompt of question {question.id!r} has {len(prompt)} tokens, which does not fit "
                f"max_context_tokens={self.spec.max_context_tokens}"
            )
        self.question = question
        self.tokens[:] = 0
        self.sources[:] = Source.PAD
        self.length = 0
        self._append(prompt, Source.PROMPT)
        self.prompt_length = self.length
        self.turns: list[Turn] = []
        self.queries: list[str] = []
        self.search_hits: list[tuple[str, ...]] = []  # one entry per executed search, aligned with queries
        self.search_faults: list[tuple[str, ...]] = []  # retriever faults of each executed search
        self.answer: str | None = None
        self.pending_query: str | None = None
        self.end_reason: str | None = None
        self.cut_observations = 0
        self.truncated = False
        self.reward = 0.0
        self.done = False
        self._turn_start = self.length
        self._scanner.reset()

    def _append(self, ids: Sequence[int] | np.ndarray, source: Source) -> None:
        n = len(ids)
        self.tokens[self.length : self.length + n] = ids
        self.sources[self.length : self.length + n] = source
        self.length += n

    def _finish(self, reason: str) -> Event:
        self.done = True
        self.end_reason = reason
        self.truncated = reason == "context_limit"
        if self.answer is not None and self.question is not None:
            self.reward = float(self._metric(self.answer, self.question.golden_answers))
        return Event.DONE

    def _append_tool(self, ids: Sequence[int] | np.ndarray) -> Event:
        limit = self.spec.max_obs_tokens
        if limit is not None and len(ids) > limit:  # Search-R1 keeps the first tokens and goes on
            ids = ids[:limit]
            self.cut_observations += 1
        # At least one policy token must fit after tool output, or the episode could not go on.
        if self.length + len(ids) >= self.spec.max_context_tokens:
            return self._finish("context_limit")
        self._append(ids, Source.TOOL)
        self._turn_start = self.length
        self._scanner.reset()
        return Event.TURN_END

    # -- stepping ----------------------------------------------------------------------------------------

    def feed(self, token: int) -> Event:
        """Appends one policy token and advances the episode.

        The caller validates ``token`` (:func:`check_token`) and must not feed a finished episode.

        Raises:
            SearchGymError: a search is pending (its retrieval failed or was not run): deliver its hits first.
        """
        if self.pending_query is not None:
            raise SearchGymError(
                f"a search for {self.pending_query!r} is pending (its retrieval failed or was not run); "
                "retry it (env.unwrapped.run_search()) or reset the episode"
            )
        self.tokens[self.length] = token
        self.sources[self.length] = Source.POLICY
        self.length += 1
        scanner = self._scanner
        if scanner.feed(token):
            return self._resolve_turn(scanner.stop, scanner.cut)
        if self.length - self._turn_start >= self.spec.max_turn_tokens:
            return self._resolve_turn("max_turn_tokens", scanner.nbytes)
        if self.length >= self.spec.max_context_tokens:
            self._record_turn("context_limit", scanner.nbytes)
            return self._finish("context_limit")
        return Event.CONTINUE

    def _record_turn(self, stop: str, cut: int) -> Turn:
        # Bytes after the closing tag inside the same token stay in the transcript but are not parsed.
        parsed = parse_action(self._scanner.text(cut))
        turn = Turn(self._turn_start, self.length, parsed.kind, parsed.content, stop)
        self.turns.append(turn)
        return turn

    def _resolve_turn(self, stop: str, cut: int) -> Event:
        turn = self._record_turn(stop, cut)
        last_turn = len(self.turns) >= self.spec.max_turns
        if turn.kind == "answer":
            self.answer = turn.content
            return self._finish("answered")
        if last_turn:  # the last turn must answer: a search there is not executed
            return self._finish("turn_budget")
        if turn.kind == "search":
            self.pending_query = turn.content
            return Event.SEARCH
        if self.length >= self.spec.max_context_tokens:
            return self._finish("context_limit")
        return self._append_tool(self._invalid_ids)

    def deliver(self, hits: Sequence[Hit], faults: tuple[str, ...] = ()) -> Event:
        """Appends the ``<information>`` block for the pending search and starts the next turn.

        The block is encoded one passage at a time through the tokenizer's bounded cache
        (:meth:`~searchgym.tokenization.Tokenizer.encode_parts`), so a passage met again at the same rank is
        not tokenised again; the ids are exactly those of encoding the whole block.

        Args:
            hits: The passages to show, in rank order.
            faults: The retriever faults injected into this search (counted in ``info``).
        """
        self._take_pending([h.passage_id for h in hits], faults)
        text = format_documents([h.contents for h in hits], self.spec.max_passage_words)
        return self._append_tool(self.tokenizer.encode_parts(_DOCUMENT_CUT.split(text)))

    def deliver_failure(self, message: str) -> Event:
        """Appends a tool message saying the pending search failed (``on_retrieval_error="observe"``)."""
        self._take_pending([])
        return self._append_tool(self.tokenizer.encode(format_search_failure(message)))

    def _take_pending(self, hit_ids: list[str], faults: tuple[str, ...] = ()) -> None:
        if self.pending_query is None:
            raise SearchGymError(
                "no search is pending: deliver results only after feed() returned Event.SEARCH"
            )
        ids = tuple(hit_ids)
        self.queries.append(self.pending_query)
        self.search_hits.append(ids)
        self.search_faults.append(faults)
        self.turns[-1] = replace(self.turns[-1], hit_ids=ids)
        self.pending_query = None

    # -- snapshots ---------------------------------------------------------------------------------------

    def snapshot(self, rng: Mapping[str, Any] | None = None) -> EpisodeSnapshot:
        """The episode's state now, as an immutable :class:`EpisodeSnapshot`.

        Args:
            rng: The owner's generator state to carry along (a single env's ``np_random``).

        Raises:
            SearchGymError: the episode has not started.
        """
        if self.question is None:
            raise SearchGymError("the episode has not started: call reset() before snapshot()")
        n = self.length
        fault_rng = self.fault_rng
        return EpisodeSnapshot(
            self.spec,
            self.question,
            self._token_bytes[: 8 * n].tobytes(),
            self._source_bytes[:n].tobytes(),
            self.prompt_length,
            tuple(self.turns),
            tuple(self.queries),
            tuple(self.search_hits),
            tuple(self.search_faults),
            self.answer,
            self.pending_query,
            self.end_reason,
            self.cut_observations,
            self.truncated,
            self.reward,
            self.done,
            self._turn_start,
            self._scanner.state(),
            None if fault_rng is None else freeze_state(fault_rng.bit_generator.state),
            rng,
        )

    def restore(self, snap: EpisodeSnapshot) -> None:
        """Puts the episode back in the state of ``snap`` (taken from this or a compatible episode).

        The transcript is written into this episode's own buffers (a vector env's rows stay in place).
        The fault generator takes the snapshot's state; the owner restores its own generator (``snap.rng``).

        Raises:
            ConfigError: ``snap`` is not an :class:`EpisodeSnapshot`, or was taken under other episode
                settings (:meth:`EnvSpec.episode_settings`).
        """
        if not isinstance(snap, EpisodeSnapshot):
            raise ConfigError(
                f"restore() needs an EpisodeSnapshot (from snapshot()), got {type(snap).__name__}"
            )
        if snap.spec is not self.spec and snap.spec.episode_settings() != self.spec.episode_settings():
            raise ConfigError(
                f"the snapshot was taken under other episode settings ({snap.spec.episode_settings()}) than "
                f"this env's ({self.spec.episode_settings()}); restore it into an env made with the same arguments"
            )
        if (snap.fault_rng is None) != (self.fault_rng is None):
            raise ConfigError(
                "the snapshot and this env disagree on retriever faults (one injects them, the other does "
                "not); restore it into an env made with the same retriever_faults"
            )
        n = len(snap.source_bytes)
        old = self.length
        self._token_bytes[: 8 * n] = snap.token_bytes
        self._source_bytes[:n] = snap.source_bytes
        if old > n:  # the buffers are zero past the transcript
            self.tokens[n:old] = 0
            self.sources[n:old] = Source.PAD
        self.length = n
        self.question = snap.question
        self.prompt_length = snap.prompt_length
        self.turns = list(snap.turns)
        self.queries = list(snap.queries)
        self.search_hits = list(snap.search_hits)
        self.search_faults = list(snap.search_faults)
        self.answer = snap.answer
        self.pending_query = snap.pending_query
        self.end_reason = snap.end_reason
        self.cut_observations = snap.cut_observations
        self.truncated = snap.truncated
        self.reward = snap.reward
        self.done = snap.done
        self._turn_start = snap.turn_start
        self._scanner.set_state(snap.scanner)
        if self.fault_rng is not None and snap.fault_rng is not None:
            self.fault_rng.bit_generator.state = thaw_state(snap.fault_rng)

    # -- reporting ---------------------------------------------------------------------------------------

    def observation(self) -> dict[str, np.ndarray]:
        """A copy of the transcript arrays: ``tokens``, ``sources`` and ``length``."""
        return {
            "tokens": self.tokens.copy(),
            "sources": self.sources.copy(),
            "length": np.array([self.length], dtype=np.int64),
        }

    def fault_counts(self) -> dict[str, int]:
        """How many times each retriever fault was injected into this episode's searches."""
        counts = dict.fromkeys(FAULT_KINDS, 0)
        for faults in self.search_faults:
            for kind in faults:
                counts[kind] += 1
        return counts

    @property
    def retrieved_ids(self) -> list[list[str]]:
        """Passage ids returned by each executed search, aligned with ``queries`` (``[]`` for a failed one)."""
        return [list(ids) for ids in self.search_hits]

    def info(self) -> dict[str, Any]:
        """Everything needed to debug the episode (see the env docstring for the keys)."""
        q = self.question
        if q is None:
            raise SearchGymError("the episode has not started: call start() (env.reset()) first")
        answer = self.answer
        gold = q.golden_answers
        support = set(q.supporting_ids)
        retrieved = {pid for ids in self.retrieved_ids for pid in ids}
        info = {
            "question_id": q.id,
            "question": q.question,
            "question_kind": q.kind,
            "golden_answers": list(gold),
            "turn": len(self.turns),
            "searches": len(self.queries),
            "invalid_turns": sum(t.kind == "invalid" for t in self.turns),
            "queries": list(self.queries),
            "retrieved_ids": self.retrieved_ids,
            "answer": answer,
            "em": exact_match(answer, gold) if answer is not None else 0.0,
            "subem": sub_exact_match(answer, gold) if answer is not None else 0.0,
            "f1": f1_score(answer, gold) if answer is not None else 0.0,
            "gold_retrieved": bool(support & retrieved) if support else None,
            "gold_recall": len(support & retrieved) / len(support) if support else None,
            "gold_all_retrieved": support <= retrieved if support else None,
            "cut_observations": self.cut_observations,
            "policy_tokens": int(np.count_nonzero(self.sources[: self.length] == Source.POLICY)),
            "length": self.length,
            "end_reason": self.end_reason,
        }
        if self.fault_rng is not None:  # only an env that injects retriever faults reports them
            info["retrieval_faults"] = self.fault_counts()
        return info

    def render_text(self) -> str:
        """The transcript as text with each segment marked by its source."""
        src = self.sources[: self.length]
        ends = [*(np.flatnonzero(src[1:] != src[:-1]) + 1).tolist(), self.length]
        parts = []
        start = 0
        for end in ends:
            if end > start:
                label = Source(int(src[start])).name.lower()
                parts.append(f"[{label}]{self.tokenizer.decode(self.tokens[start:end])}[/{label}]")
            start = end
        return "".join(parts)
