"""SearchQA-v0: Search-R1-style search-and-answer episodes, one token per action."""

from __future__ import annotations

import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from searchgym.data import Dataset, Question, load_dataset
from searchgym.envs.episode import (
    Episode,
    EpisodeSnapshot,
    Event,
    check_token,
    freeze_state,
    thaw_state,
)
from searchgym.envs.spec import EnvSpec, make_spec
from searchgym.errors import ConfigError, EpisodeFinishedError, RetrieverError, UnknownQuestionError
from searchgym.protocol import Source
from searchgym.retrieval import Retriever
from searchgym.retrieval.faults import RetrieverFaults, apply_faults
from searchgym.retrieval.leases import acquire_retriever, release_retriever
from searchgym.tokenization import Tokenizer, load_tokenizer

__all__ = ["EnvParts", "SearchQAEnv", "fault_rng", "searchr1_options"]


def fault_rng(faults: RetrieverFaults, *keys: int) -> np.random.Generator:
    """The generator of an episode's retriever faults: seeded by the faults' seed and ``keys`` (the reset
    seed, a sub-env's index), never by the env's ``np_random`` or the agent's."""
    return np.random.default_rng([faults.seed, *keys])


@dataclass
class EnvParts:
    """What an environment builds from its spec and shares with its episodes: the dataset, the split's
    questions, the tokenizer, the retriever (leased when named: :meth:`close` gives it back), the faults, and
    the observation and action spaces of one episode."""

    spec: EnvSpec
    dataset: Dataset
    questions: list[Question]
    tokenizer: Tokenizer
    retriever: Retriever
    observation_space: spaces.Dict
    action_space: spaces.Discrete
    release: Any = None

    @classmethod
    def open(cls, owner: object, spec: EnvSpec, tokenizer: Any) -> EnvParts:
        """Builds the parts of ``spec`` for ``owner``; the retriever lease ends with ``owner`` if not before.

        Raises:
            ConfigError: the split has no questions.
        """
        dataset = load_dataset(spec.dataset, world_seed=spec.world_seed)
        questions = dataset.questions(spec.split)
        if not questions:
            raise ConfigError(f"split {spec.split!r} of {dataset.name!r} has no questions")
        tok = load_tokenizer(tokenizer)
        retriever, owned = acquire_retriever(dataset, spec.retriever, spec.retriever_patience)
        release = (
            weakref.finalize(owner, release_retriever, dataset, spec.retriever, spec.retriever_patience)
            if owned
            else None
        )
        vocab, size = tok.vocab_size, spec.max_context_tokens
        observation_space = spaces.Dict(
            {
                "tokens": spaces.Box(0, vocab - 1, shape=(size,), dtype=np.int64),
                "sources": spaces.Box(0, len(Source) - 1, shape=(size,), dtype=np.int8),
                "length": spaces.Box(0, size, shape=(1,), dtype=np.int64),
            }
        )
        return cls(
            spec, dataset, questions, tok, retriever, observation_space, spaces.Discrete(vocab), release
        )

    def close(self) -> None:
        """Gives back the leased retriever (the last holder closes it); idempotent."""
        if self.release is not None:
            self.release()


def searchr1_options(
    max_turns: int = 2,
    max_obs_length: int | None = 500,
    topk: int = 3,
    max_response_length: int = 500,
) -> dict[str, Any]:
    """SearchQA-v0 keyword arguments that reproduce a Search-R1 run's episode settings.

    ``gym.make("SearchQA-v0", **searchr1_options(max_turns=4))`` gives the episodes of Search-R1's
    ``max_turns=4``. The arguments carry Search-R1's names and defaults (its training scripts):

    * ``max_turns``: Search-R1 runs up to ``max_turns`` turns in which a search is executed, then one more
      turn in which it is not (the final answer turn). SearchQA-v0's ``max_turns`` counts every turn,
      the final one included, so it is Search-R1's plus one.
    * ``max_obs_length``: each tool observation is cut to this many tokens and the episode goes on
      (``max_obs_tokens``); ``None``: no cut.
    * ``topk``: passages per search (``retriever.topk``).
    * ``max_response_length``: tokens generated per turn (``max_turn_tokens``).

    Raises:
        ConfigError: a value is not a positive integer.
    """
    checks = (("max_turns", max_turns, 0), ("topk", topk, 1), ("max_response_length", max_response_length, 1))
    for name, value, low in checks:
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    return {
        "max_turns": max_turns + 1,
        "max_obs_tokens": max_obs_length,
        "topk": topk,
        "max_turn_tokens": max_response_length,
    }


class SearchQAEnv(gym.Env[dict[str, np.ndarray], int]):
    """Answer a question, searching a corpus when needed, writing one token per step.

    ## Description

    The Search-R1 setting as a token-level Gymnasium environment. The context starts with Search-R1's
    prompt for a question. The agent writes tokens; a turn ends at the token where ``</search>`` or
    ``</answer>`` completes (found on the byte stream, so a tag split over several tokens, or sharing a token
    with the text after it, is found exactly where it completes), at EOS, or at ``max_turn_tokens``. A turn
    holding ``<search> q </search>`` runs the retriever and appends ``<information>Doc 1(Title: …) …
    </information>`` as tool tokens; a turn holding ``<answer> a </answer>`` ends the episode; any other turn
    gets Search-R1's corrective message. The last of ``max_turns`` turns must answer: ``max_turns`` counts
    every turn, so Search-R1's ``max_turns=N`` (N search turns, then a final answer turn) is ``N + 1`` here
    (:func:`searchr1_options` maps all of Search-R1's episode settings).

    ## Action Space

    ``Discrete(vocab_size)``: a token id of the tokenizer's real vocabulary. Anything else raises
    :class:`~searchgym.errors.InvalidActionError`.

    ## Observation Space

    A ``Dict`` of fixed-size arrays (``L = max_context_tokens``):

    * ``tokens``: ``Box(0, vocab_size - 1, (L,), int64)``, the transcript's token ids, zero-padded;
    * ``sources``: ``Box(0, 3, (L,), int8)``, who wrote each token: 0 padding, 1 prompt, 2 policy, 3 tool;
    * ``length``: ``Box(0, L, (1,), int64)``, the number of valid tokens: a one-element array, not an
      integer, so ``obs["tokens"][:obs["length"]]`` raises ``TypeError``; slice with
      ``obs["tokens"][:int(obs["length"][0])]``.

    ## Rewards

    0 on every step but the last; at the end, the answer metric (``reward=``: ``"em"`` exact match,
    ``"subem"``, or ``"f1"``) of the answer parsed from the agent's own tokens against the golden answers.
    No answer scores 0.

    ## Starting State

    A question drawn uniformly from the split with the env's ``np_random`` (or pinned with
    ``reset(options={"question_id": ...})`` or ``{"question_index": i}``); the transcript is its prompt.

    ## Episode End

    Terminated when a turn answers, or when the last turn ends without an answer (``end_reason``
    ``"answered"`` / ``"turn_budget"``). Truncated when the transcript would exceed ``max_context_tokens``
    (``"context_limit"``); with ``max_obs_tokens`` set, a long tool observation is cut to that many tokens
    instead and the episode goes on (Search-R1's behaviour). Stepping a finished episode, or stepping before
    the first ``reset()``, raises :class:`~searchgym.errors.EpisodeFinishedError`.

    ## Info

    Every step: ``turn``, ``searches``, ``length``. When a turn ends and at reset, and at the end: also
    ``question_id``, ``question``, ``question_kind`` (the dataset's type of question, ``""`` when it gives
    none), ``golden_answers``, ``queries``, ``retrieved_ids``, ``invalid_turns``,
    ``answer``, ``em``, ``subem``, ``f1``, ``gold_retrieved`` (any supporting passage retrieved),
    ``gold_recall`` (the fraction retrieved) and ``gold_all_retrieved`` (every one retrieved) — the three
    are ``None`` when the dataset has no gold passages —, ``cut_observations`` (tool observations cut to
    ``max_obs_tokens``), ``policy_tokens``, ``end_reason``, and ``turn_end`` (True at those steps).

    ## Arguments

    ``SearchQAEnv(spec=None, *, tokenizer=None, render_mode=None, **fields)``: the episode is defined by an
    :class:`~searchgym.envs.EnvSpec` (``spec``, default: its defaults) with any of its fields given as keyword
    arguments changed (``gym.make("SearchQA-v0", topk=5)``); the spec declares each field's default and
    bounds. Its fields:

    * ``dataset``: ``"world"`` (default, the generated encyclopedia), a FlashRAG folder path, or a
      :class:`~searchgym.data.Dataset`.
    * ``split``: question split.
    * ``retriever``: ``"bm25"`` (default), ``"rank_bm25"``, an ``http(s)://`` URL of a ``/retrieve``
      server, or a :class:`~searchgym.retrieval.Retriever`. A name or URL is built once and shared by the
      envs on the same dataset until the last of them is closed; a Retriever object stays the caller's
      (``close()`` does not close it).
    * ``topk``: passages per search.
    * ``max_turns``: turns per episode, the final answer turn included; the last must answer.
    * ``max_turn_tokens``: policy tokens per turn.
    * ``max_context_tokens``: size of the transcript.
    * ``max_obs_tokens``: cut each tool observation to its first this many tokens and go on, as Search-R1's
      ``max_obs_length`` (500 in its scripts); ``None`` (default): no cut, an observation that does not fit
      the context ends the episode.
    * ``max_passage_words``: cut each shown passage to this many words (``None``: no cut).
    * ``reward``: ``"em"``, ``"subem"`` or ``"f1"``.
    * ``prompt_style``: ``"base"`` (Search-R1's base prompt) or ``"chat"`` (the prompt as a user message
      through the tokenizer's chat template).
    * ``append_question_mark``: add ``"?"`` to a question that lacks one, as Search-R1's data preparation
      does (default), so prompts are byte-identical to Search-R1's.
    * ``on_retrieval_error``: ``"raise"`` (default) re-raises :class:`~searchgym.errors.RetrieverError`;
      ``"observe"`` appends ``<information>Search failed: …</information>`` as tool tokens and goes on.
    * ``retriever_patience``: for a URL retriever, seconds to wait for a server that stops answering
      (refused connections, timeouts, 503) before failing, retrying every few seconds; the episode then
      goes on as if nothing happened (0: fail once the client's retries are spent). A server that
      answers wrong is never waited for.
    * ``retriever_faults``: inject seeded retriever faults (empty results, shuffled results, random
      passages, truncated passages, latency) with given probabilities: a
      :class:`~searchgym.retrieval.RetrieverFaults`, a mapping of its fields, or ``"empty=0.1,seed=3"``
      (``None``, default: none). Their generator is seeded by the faults' ``seed`` and ``reset(seed=...)``
      only, so faults are reproducible and independent of the agent; ``info["retrieval_faults"]`` counts
      them per kind.
    * ``world_seed``: seed of the generated world.

    And, apart from the spec:

    * ``tokenizer``: ``"builtin"`` (default), a local path or model name, or a tokenizer object.
    * ``render_mode``: ``"ansi"`` (``render()`` returns the transcript with ``[prompt]…[/prompt]``-style
      segment marks) or ``"human"`` (prints it).

    ## Snapshots

    ``snapshot()`` returns the episode's state at the current token as an immutable
    :class:`~searchgym.envs.EpisodeSnapshot` (question, transcript, source marks, turn state, searches so
    far, the RNG states); ``restore(snap)`` puts the env back there, so that stepping the same tokens gives
    identical observations, rewards and infos. Snapshots share the corpus, the retriever and the tokenizer.

    ## Version History

    * v0: initial version (generated world v1, built-in tokenizer v1). Revised, with the generated world's
      episodes unchanged: a ``"?"`` is added to questions that lack one, the ``<information>`` block shows a
      document's title line as the corpus stores it and drops the last document's trailing white space
      (both as Search-R1), ``max_obs_tokens`` and ``append_question_mark`` were added, and F1 applies the
      yes/no/noanswer rule. Added, with episodes unchanged: ``snapshot()``/``restore()``,
      ``retriever_faults`` (off by default) and ``retriever_patience`` (0 by default).
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 4}  # noqa: RUF012 - Gymnasium's convention
    # The read-only state of np_random while nobody has touched the generator since it was read or set, so a
    # snapshot costs no state read and a restore to the state the generator is in costs no write.
    _rng_state: Mapping[str, Any] | None = None

    def __init__(
        self,
        spec: EnvSpec | None = None,
        *,
        tokenizer: Any = None,
        render_mode: str | None = None,
        **fields: Any,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            # Tools such as SB3's make_vec_env pass "rgb_array" by default: warn and render nothing.
            gym.logger.warn(
                f"render_mode {render_mode!r} is not supported (use one of {self.metadata['render_modes']}); "
                "rendering is disabled"
            )
            render_mode = None
        self.env_spec = spec = make_spec(spec, fields)
        # Released by close(), or when the env is garbage-collected without one.
        self._parts = parts = EnvParts.open(self, spec, tokenizer)
        self.dataset, self.split, self.questions = parts.dataset, spec.split, parts.questions
        self.tokenizer: Tokenizer = parts.tokenizer
        self.retriever = parts.retriever
        self.render_mode = render_mode
        self.retriever_faults: RetrieverFaults | None = spec.retriever_faults
        self.episode = Episode(self.tokenizer, spec)
        if self.retriever_faults is not None:
            self.episode.fault_rng = fault_rng(self.retriever_faults)
        self.action_space = parts.action_space  # type: ignore[assignment]  # ids arrive as int or np.int64
        self.observation_space = parts.observation_space  # type: ignore[assignment]

    # -- Gymnasium API -----------------------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        self._rng_state = None
        if self.retriever_faults is not None and seed is not None:
            self.episode.fault_rng = fault_rng(self.retriever_faults, seed)
        self.episode.start(self._pick_question(options or {}))
        return self.episode.observation(), {**self.episode.info(), "turn_end": False}

    def step(self, action: int) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        ep = self.episode
        if ep.question is None:
            raise EpisodeFinishedError("step() called before reset(): call reset() to start an episode")
        token = check_token(action, self.tokenizer.vocab_size)
        if ep.done:
            raise EpisodeFinishedError(
                "step() called on a finished episode "
                f"(ended by {ep.end_reason!r}); call reset() to start a new one"
            )
        event = ep.feed(token)
        if event == Event.SEARCH:
            event = self.run_search()
        if event == Event.CONTINUE:
            info: dict[str, Any] = {"turn": len(ep.turns), "searches": len(ep.queries), "length": ep.length}
        else:
            info = {**ep.info(), "turn_end": True}
        if self.render_mode == "human" and event == Event.DONE:
            self.render()
        terminated = ep.done and not ep.truncated
        return ep.observation(), ep.reward if ep.done else 0.0, terminated, ep.truncated, info

    def close(self) -> None:
        """Releases the shared retriever this env holds (the last holder closes it); idempotent."""
        parts = getattr(self, "_parts", None)  # absent when __init__ failed
        if parts is not None:
            parts.close()
        super().close()

    def snapshot(self) -> EpisodeSnapshot:
        """The episode's state at the current token, with the RNG states (see ## Snapshots).

        Raises:
            SearchGymError: no episode has started (call ``reset()`` first).
        """
        state = self._rng_state
        if state is None:
            state = self._rng_state = freeze_state(gym.Env.np_random.fget(self).bit_generator.state)  # type: ignore[attr-defined]
        return self.episode.snapshot(state)

    def restore(self, snap: EpisodeSnapshot) -> None:
        """Puts the env back in the state of ``snap`` (from :meth:`snapshot` of this env or of one made with
        the same arguments, or a vector env's sub-env, whose snapshot carries no ``np_random`` state).

        Raises:
            ConfigError: ``snap`` is not a snapshot, or was taken under other episode settings.
        """
        self.episode.restore(snap)
        if snap.rng is not None and snap.rng is not self._rng_state:
            gym.Env.np_random.fget(self).bit_generator.state = thaw_state(snap.rng)  # type: ignore[attr-defined]
            self._rng_state = snap.rng

    @property
    def np_random(self) -> np.random.Generator:
        """The env's generator (Gymnasium's); whoever reads it may draw from it, so the state a snapshot
        would reuse is forgotten."""
        self._rng_state = None
        return gym.Env.np_random.fget(self)  # type: ignore[attr-defined]

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self._rng_state = None
        gym.Env.np_random.fset(self, value)  # type: ignore[attr-defined]

    def render(self) -> str | None:
        if self.episode.question is None:
            return None
        text = self.episode.render_text()
        if self.render_mode == "human":
            print(text)
            return None
        return text

    # -- helpers -----------------------------------------------------------------------------------------

    def run_search(self) -> Event:
        """Executes the pending search of the episode with the retriever and delivers the hits.

        ``step`` calls it; call it yourself only to retry a search whose retrieval raised
        :class:`~searchgym.errors.RetrieverError` (the episode keeps the search pending until then).
        """
        ep = self.episode
        if ep.pending_query is None:
            raise ConfigError("no search is pending")
        try:
            hits = self.retriever.search([ep.pending_query], self.env_spec.topk)[0]
        except RetrieverError as e:
            if self.env_spec.on_retrieval_error == "raise":
                raise
            return ep.deliver_failure(str(e))
        if self.retriever_faults is None or ep.fault_rng is None:
            return ep.deliver(hits)
        hits, fired, delay = apply_faults(hits, self.retriever_faults, ep.fault_rng, self.dataset.passages)
        if delay:
            time.sleep(delay)
        return ep.deliver(hits, fired)

    def _pick_question(self, options: dict[str, Any]) -> Question:
        unknown = set(options) - {"question_id", "question_index"}
        if unknown:
            raise ConfigError(
                f"unknown reset options {sorted(unknown)}; valid: ['question_id', 'question_index']"
            )
        if "question_id" in options:
            return self.dataset.find_question(self.split, str(options["question_id"]))
        if "question_index" in options:
            index = options["question_index"]
            # Exactly an integer: "3", 2.7 or True would otherwise be taken silently as questions 3, 2 and 1.
            if not isinstance(index, int | np.integer) or isinstance(index, bool | np.bool_):
                raise ConfigError(
                    f"question_index must be an integer in [0, {len(self.questions)}), got {index!r:.40} "
                    f"({type(index).__name__})"
                )
            index = int(index)
            if not 0 <= index < len(self.questions):
                raise UnknownQuestionError(f"question_index {index} is outside [0, {len(self.questions)})")
            return self.questions[index]
        return self.questions[int(self.np_random.integers(len(self.questions)))]
