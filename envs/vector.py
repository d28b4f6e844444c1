"""A native batched vector env for SearchQA: GRPO groups and one retrieval call per step."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from searchgym.envs.episode import Episode, EpisodeSnapshot, Event, check_segment, is_int
from searchgym.envs.spec import EnvSpec, make_spec
from searchgym.errors import ConfigError, EpisodeFinishedError, InvalidActionError, RetrieverError
from searchgym.retrieval.faults import apply_faults

from .search_qa import EnvParts, fault_rng

__all__ = ["MAX_NUM_ENVS", "MAX_VECTOR_TOKENS", "SearchQAVectorEnv", "SegmentStep"]

MAX_NUM_ENVS = 1 << 16
"""The most sub-environments a vector env holds."""

MAX_VECTOR_TOKENS = 1 << 28
"""The most transcript tokens a vector env allocates (``num_envs * max_context_tokens``; 2.3 GiB of arrays)."""


@dataclass
class SegmentStep:
    """The result of :meth:`SearchQAVectorEnv.step_segments`.

    Attributes:
        observations: Batched observation dict, arrays of shape ``(num_envs, ...)``.
        rewards: ``(num_envs,)`` float rewards of this call.
        terminated: ``(num_envs,)`` bool.
        truncated: ``(num_envs,)`` bool.
        consumed: ``(num_envs,)`` int, how many tokens of each segment the env accepted; the rest of a
            segment (after the token where the turn or episode ended) was discarded.
        events: ``(num_envs,)`` int, the last :class:`~searchgym.envs.Event` of each sub-env (``-1`` where no
            segment was given).
        infos: Per sub-env info dicts (as the single env's, at turn ends and episode ends).
    """

    observations: dict[str, np.ndarray]
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    consumed: np.ndarray
    events: np.ndarray
    infos: list[dict[str, Any]]


class SearchQAVectorEnv(VectorEnv[dict[str, np.ndarray], np.ndarray, np.ndarray]):
    """``num_envs`` SearchQA episodes stepped together, sharing one dataset, tokenizer and retriever.

    ``gym.make_vec("SearchQA-v0", num_envs=N, **kwargs)`` builds it (it is SearchQA-v0's vector entry
    point); ``kwargs`` are :class:`~searchgym.envs.EnvSpec`'s fields. In code: ``SearchQAVectorEnv(N, spec,
    tokenizer=..., autoreset_mode=...)``, a spec's fields given as keyword arguments changing it.

    **Groups.** ``reset(options={"group_size": G})`` gives each block of ``G`` consecutive sub-envs the same
    question (what GRPO needs); ``options={"question_ids": [...]}`` pins one question per block. ``num_envs``
    must be a multiple of ``G``.

    **Batched retrieval.** All searches issued in one ``step`` (or :meth:`step_segments`) go to the
    retriever as one ``search(queries, k)`` call.

    **Autoreset** (gymnasium 1.x semantics, chosen with ``autoreset_mode``):

    * ``"NextStep"`` (default, as gymnasium's vector envs): the step on which a sub-env ends returns its final
      observation and info; on its next step, the action is ignored and the sub-env resets to a fresh,
      independently drawn question (groups are not re-formed; call ``reset`` for new groups).
    * ``"Disabled"``: a finished sub-env stays finished until ``reset(options={"reset_mask": mask})`` (or a
      full reset); stepping it raises :class:`~searchgym.errors.EpisodeFinishedError`. Use this, with
      :meth:`step_segments`, for GRPO rollouts.

    **Segments.** :meth:`step_segments` feeds one token segment per sub-env (``None`` to skip one), each until
    its turn or episode ends, and reports how many tokens each accepted.

    **Branching.** :meth:`snapshot` and :meth:`restore` save and put back one sub-env's episode;
    :meth:`fork` continues one sub-env's state in others (tree rollouts, step-level groups): branches fed
    the same tokens stay identical, branches fed different tokens diverge from the shared prefix.

    **Retriever faults** (``retriever_faults=``, as the single env's): each sub-env draws its own faults from
    a generator seeded by the faults' seed, ``reset(seed=...)`` and its index, so a sub-env's faults do not
    depend on what the others search; a batch whose searches draw latency faults waits once, for the
    longest.
    """

    def __init__(
        self,
        num_envs: int,
        spec: EnvSpec | None = None,
        *,
        tokenizer: Any = None,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        copy: bool = True,
        **fields: Any,
    ) -> None:
        if not is_int(num_envs) or not 1 <= num_envs <= MAX_NUM_ENVS:
            raise ConfigError(f"num_envs must be an integer >= 1 and <= {MAX_NUM_ENVS}, got {num_envs!r:.40}")
        fields.pop("max_episode_steps", None)  # episodes are bounded by the turn and context budgets
        fields.pop("render_mode", None)  # gym.make_vec passes one; the vector env renders nothing
        self.env_spec = spec = make_spec(spec, fields)
        if num_envs * spec.max_context_tokens > MAX_VECTOR_TOKENS:
            raise ConfigError(
                f"num_envs x max_context_tokens must be <= {MAX_VECTOR_TOKENS:,} (the transcripts the vector env "
                f"allocates), got {num_envs} x {spec.max_context_tokens}"
            )
        mode = autoreset_mode if isinstance(autoreset_mode, AutoresetMode) else AutoresetMode(autoreset_mode)
        if mode == AutoresetMode.SAME_STEP:
            raise ConfigError("autoreset_mode 'SameStep' is not supported; use 'NextStep' or 'Disabled'")
        self.autoreset_mode = mode
        self.metadata = {"autoreset_mode": mode, "render_modes": []}
        self.num_envs = num_envs
        self.copy = copy
        self._parts = parts = EnvParts.open(self, spec, tokenizer)
        self.single_observation_space = parts.observation_space
        self.single_action_space = parts.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.tokenizer = parts.tokenizer
        self.dataset = parts.dataset
        self.split = spec.split
        self.questions = parts.questions
        self.retriever = parts.retriever
        size = spec.max_context_tokens
        self._tokens = np.zeros((num_envs, size), dtype=np.int64)
        self._sources = np.zeros((num_envs, size), dtype=np.int8)
        self.episodes = [
            Episode(self.tokenizer, spec, self._tokens[i], self._sources[i]) for i in range(num_envs)
        ]
        self._autoreset = np.zeros(num_envs, dtype=bool)
        self.group_size = 1
        self.retriever_faults = spec.retriever_faults
        if self.retriever_faults is not None:
            for i, ep in enumerate(self.episodes):
                ep.fault_rng = fault_rng(self.retriever_faults, i)

    # -- reset -------------------------------------------------------------------------------------------

    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Resets all sub-envs (or those in ``options["reset_mask"]``).

        One generator (the vector env's ``np_random``) draws every group's question, so ``seed`` is one
        integer; a list (gymnasium's per-sub-env form) is accepted and its first entry seeds that generator.
        """
        if isinstance(seed, list):
            seed = seed[0]
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = set(options) - {"group_size", "question_ids", "reset_mask"}
        if unknown:
            raise ConfigError(
                f"unknown reset options {sorted(unknown)}; valid: group_size, question_ids, reset_mask"
            )
        mask = np.asarray(options.get("reset_mask", np.ones(self.num_envs, dtype=bool)), dtype=bool)
        if mask.shape != (self.num_envs,):
            raise ConfigError(f"reset_mask must have shape ({self.num_envs},)")
        group = int(options.get("group_size", 1 if "reset_mask" in options else self.group_size))
        if group < 1 or self.num_envs % group:
            raise ConfigError(f"group_size must divide num_envs={self.num_envs}, got {group}")
        self.group_size = group
        n_groups = self.num_envs // group
        if "question_ids" in options:
            ids = list(options["question_ids"])
            if len(ids) != n_groups:
                raise ConfigError(f"question_ids needs one id per group ({n_groups}), got {len(ids)}")
            index = self.dataset.question_index(self.split)
            for qid in ids:
                self.dataset.find_question(self.split, str(qid))  # unknown ids fail here, clearly
            picks = [index[str(qid)] for qid in ids]
        else:
            picks = [int(self.np_random.integers(len(self.questions))) for _ in range(n_groups)]
        for i in np.flatnonzero(mask):
            if self.retriever_faults is not None and seed is not None:
                self.episodes[i].fault_rng = fault_rng(self.retriever_faults, seed, int(i))
            self.episodes[i].start(self.questions[picks[i // group]])
            self._autoreset[i] = False
        infos: dict[str, Any] = {}
        for i in np.flatnonzero(mask):
            infos = self._add_info(infos, self.episodes[i].info(), int(i))
        return self._observations(), infos

    # -- stepping ----------------------------------------------------------------------------------------

    def step(
        self, actions: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,):
            raise InvalidActionError(f"expected actions of shape ({self.num_envs},), got {actions.shape}")
        vocab = self.tokenizer.vocab_size
        if not np.issubdtype(actions.dtype, np.integer) or actions.min() < 0 or actions.max() >= vocab:
            raise InvalidActionError(f"actions must be token ids in [0, {vocab}); got {actions!r}")
        self._check_steppable(~self._autoreset)
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        infos: dict[str, Any] = {}
        searching: list[int] = []
        events = np.zeros(self.num_envs, dtype=np.int64)
        for i, ep in enumerate(self.episodes):
            if self._autoreset[i]:
                ep.start(self.questions[int(self.np_random.integers(len(self.questions)))])
                self._autoreset[i] = False
                infos = self._add_info(infos, ep.info(), i)
                events[i] = -1
                continue
            events[i] = event = ep.feed(int(actions[i]))
            if event == Event.SEARCH:
                searching.append(i)
        self._run_searches(searching, events)
        terminated, truncated = self._flags()
        for i in map(int, np.flatnonzero(events > Event.CONTINUE)):
            ep = self.episodes[i]
            rewards[i] = ep.reward if ep.done else 0.0
            infos = self._add_info(infos, {**ep.info(), "turn_end": True}, i)
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            self._autoreset = terminated | truncated
        return self._observations(), rewards, terminated, truncated, infos

    def step_segments(self, segments: Sequence[Sequence[int] | np.ndarray | None]) -> SegmentStep:
        """Feeds one token segment per sub-env, each until its turn (or episode) ends.

        Args:
            segments: ``num_envs`` entries; ``None`` (or empty) leaves that sub-env untouched.

        Raises:
            EpisodeFinishedError: a segment was given to a finished sub-env.
            InvalidActionError: a token is outside the vocabulary.
        """
        if len(segments) != self.num_envs:
            raise InvalidActionError(f"expected {self.num_envs} segments, got {len(segments)}")
        # Every segment is checked before any is fed: a bad batch changes nothing.
        given = np.array([s is not None and len(s) > 0 for s in segments])
        self._check_steppable(given)
        checked = [
            check_segment(s, self.tokenizer.vocab_size) if g else []
            for s, g in zip(segments, given, strict=True)
        ]
        consumed = np.zeros(self.num_envs, dtype=np.int64)
        events = np.full(self.num_envs, -1, dtype=np.int64)
        searching: list[int] = []
        for i, seg in enumerate(checked):
            if not seg:
                continue
            ep = self.episodes[i]
            event = Event.CONTINUE
            for token in seg:
                event = ep.feed(token)
                consumed[i] += 1
                if event != Event.CONTINUE:
                    break
            events[i] = event
            if event == Event.SEARCH:
                searching.append(i)
        self._run_searches(searching, events)
        terminated, truncated = self._flags()
        rewards = np.array(
            [ep.reward if ep.done and events[i] >= 0 else 0.0 for i, ep in enumerate(self.episodes)]
        )
        infos = [ep.info() if events[i] > Event.CONTINUE else {} for i, ep in enumerate(self.episodes)]
        return SegmentStep(self._observations(), rewards, terminated, truncated, consumed, events, infos)

    def _check_steppable(self, mask: np.ndarray) -> None:
        """Raises before anything is fed if a sub-env in ``mask`` has finished or waits on a failed search."""
        for i in map(int, np.flatnonzero(mask)):
            ep = self.episodes[i]
            if ep.done:
                raise EpisodeFinishedError(
                    f"sub-env {i} has finished; reset it with reset(options={{'reset_mask': mask}})"
                )
            if ep.pending_query is not None:
                raise RetrieverError(f"sub-env {i} has a search pending after a failed retrieval; reset it")

    def _run_searches(self, indices: list[int], events: np.ndarray) -> None:
        """One batched retrieval call for every sub-env that searched."""
        if not indices:
            return
        queries = [self.episodes[i].pending_query or "" for i in indices]
        try:
            results = self.retriever.search(queries, self.env_spec.topk)
        except RetrieverError as e:
            if self.env_spec.on_retrieval_error == "raise":
                raise
            for i in indices:
                events[i] = self.episodes[i].deliver_failure(str(e))
            return
        faults = self.retriever_faults
        delay = 0.0
        for i, hits in zip(indices, results, strict=True):
            ep = self.episodes[i]
            if faults is None or ep.fault_rng is None:
                events[i] = ep.deliver(hits)
                continue
            faulted, fired, latency = apply_faults(hits, faults, ep.fault_rng, self.dataset.passages)
            delay = max(delay, latency)
            events[i] = ep.deliver(faulted, fired)
        if delay:  # the batch's searches run together: one wait, the longest
            time.sleep(delay)

    # -- branching ---------------------------------------------------------------------------------------

    def _check_index(self, i: Any, what: str = "sub-env") -> int:
        if (
            isinstance(i, bool | np.bool_)
            or not isinstance(i, int | np.integer)
            or not 0 <= i < self.num_envs
        ):
            raise ConfigError(f"{what} index must be an integer in [0, {self.num_envs}), got {i!r}")
        return int(i)

    def snapshot(self, i: int) -> EpisodeSnapshot:
        """Sub-env ``i``'s episode at its current token (without the vector env's shared ``np_random``).

        Raises:
            ConfigError: ``i`` is not a sub-env index.
            SearchGymError: the sub-env has not been reset.
        """
        return self.episodes[self._check_index(i)].snapshot()

    def restore(self, i: int, snap: EpisodeSnapshot) -> None:
        """Puts sub-env ``i`` in the state of ``snap`` (from any sub-env, or a single env made with the same
        arguments). A finished episode restored under ``"NextStep"`` autoreset resets on the next step, as
        one that just ended.

        Raises:
            ConfigError: a bad index, or a snapshot taken under other episode settings.
        """
        i = self._check_index(i)
        self.episodes[i].restore(snap)
        self._autoreset[i] = snap.done and self.autoreset_mode == AutoresetMode.NEXT_STEP

    def fork(self, i: int, targets: int | Sequence[int]) -> list[int]:
        """Continues sub-env ``i``'s episode in other sub-envs: the building block of tree rollouts.

        Args:
            i: The sub-env to branch from (its own state is kept).
            targets: An int ``n``: the block of ``n`` sub-envs ``i, i + 1, …, i + n - 1`` (so after
                ``fork(0, G)`` sub-envs ``0…G-1`` hold sub-env 0's state); or the indices of the sub-envs that
                take the state (their episodes are replaced).

        Returns:
            The indices that now hold sub-env ``i``'s state (``i`` included when it is one of them).

        Raises:
            ConfigError: an index out of range, or a block that runs past the last sub-env.
            SearchGymError: sub-env ``i`` has not been reset.
        """
        i = self._check_index(i, "source sub-env")
        if isinstance(targets, bool | np.bool_):
            raise ConfigError(f"fork targets must be a count or sub-env indices, got {targets!r}")
        if isinstance(targets, int | np.integer):
            if not 1 <= targets <= self.num_envs - i:
                raise ConfigError(
                    f"fork({i}, n) needs 1 <= n <= {self.num_envs - i} (the block i..i+n-1 of "
                    f"{self.num_envs} sub-envs), got n={targets}"
                )
            chosen = list(range(i, i + int(targets)))
        else:
            chosen = [self._check_index(t, "target sub-env") for t in targets]
        snap = self.episodes[i].snapshot()
        for t in chosen:
            if t != i:
                self.restore(t, snap)
        return chosen

    # -- views -------------------------------------------------------------------------------------------

    def _flags(self) -> tuple[np.ndarray, np.ndarray]:
        done = np.array([ep.done for ep in self.episodes])
        truncated = np.array([ep.done and ep.truncated for ep in self.episodes])
        return done & ~truncated, truncated

    def _observations(self) -> dict[str, np.ndarray]:
        lengths = np.array([[ep.length] for ep in self.episodes], dtype=np.int64)
        if self.copy:
            return {"tokens": self._tokens.copy(), "sources": self._sources.copy(), "length": lengths}
        return {"tokens": self._tokens, "sources": self._sources, "length": lengths}

    def episode_infos(self) -> list[dict[str, Any]]:
        """The full info dict of every sub-env's current episode."""
        return [ep.info() for ep in self.episodes]

    def close_extras(self, **kwargs: Any) -> None:
        parts = getattr(self, "_parts", None)  # absent when __init__ failed
        if parts is not None:
            parts.close()
