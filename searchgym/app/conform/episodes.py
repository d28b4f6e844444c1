"""The scripted episodes of ``searchgym conform``: played through the environment, which records them.

Three groups of :data:`GROUP_SIZE` episodes on the train split's first three questions: one with mixed
rewards (searches, several turns, a turn the sampler continued after ``</search>``), one whose rewards are
all 0 (its advantages are all 0; a turn continued after ``</answer>``), and one with an id beyond the
vocabulary, which the environment refuses. The sampler's log-probabilities are the policy model's (temperature
1, over the real vocabulary). :class:`ScriptedTurns` replays the turns as a rollout policy, for adapters
whose stack plays the env through :func:`~searchgym.agents.training.rollout.collect_rollouts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from searchgym.agents.llm import Segment, token_logprobs
from searchgym.envs.spec import EnvSpec
from searchgym.envs.vector import SearchQAVectorEnv
from searchgym.errors import InvalidActionError, SearchGymError
from searchgym.protocol import Source
from searchgym.tokenization import Tokenizer

__all__ = ["ENV", "GROUP_SIZE", "ConformError", "Episode", "ScriptedTurns", "Turn", "scripted_episodes"]

ENV = EnvSpec(max_turn_tokens=64, max_context_tokens=1024, topk=1, max_turns=4)
"""The SearchQA settings of the scripted episodes (one passage per search keeps transcripts short)."""

GROUP_SIZE = 4
#: What the sampler writes after a closing tag (other ids when these occur in a transcript).
JUNK = " ~~~ zq"


class ConformError(SearchGymError, RuntimeError):
    """The scripted episodes could not be played as scripted (an adapter asked for a turn out of order)."""


# -- the episodes ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One turn as the sampler produced it.

    Attributes:
        tokens: The sampled ids; they may run past the turn's closing tag, as a sampler that was not
            stopped there writes.
        logprobs: The sampler's log-probability of each id (over the real vocabulary, temperature 1).
        kept: How many of ``tokens`` the env kept (the rest came after the turn's end and was dropped).
    """

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    kept: int


@dataclass(frozen=True)
class Episode:
    """One scripted episode: the sampler's turns and what the environment recorded.

    Attributes:
        index: Position in the list handed to the adapter (groups are consecutive runs of ``GROUP_SIZE``).
        label: What the episode exercises (``"text after </search>, wrong answer"`` …).
        question_id: The SearchQA question (``reset(options={"question_id": ...})``).
        group: Its group (episodes of a group share the question).
        turns: The sampler's turns, in order.
        starts: Where each turn starts in ``tokens``.
        tokens: The env's transcript: prompt, policy turns and tool output.
        sources: Who wrote each token (:class:`~searchgym.protocol.Source`).
        logprobs: The sampler's log-probability of each policy token (0.0 elsewhere).
        reward: The env's reward.
        refused: The env's error when it refused a sampled id (then ``tokens`` stops before that turn).
    """

    index: int
    label: str
    question_id: str
    group: int
    turns: tuple[Turn, ...]
    starts: tuple[int, ...]
    tokens: tuple[int, ...]
    sources: tuple[int, ...]
    logprobs: tuple[float, ...]
    reward: float
    refused: str | None = None

    @property
    def dropped(self) -> list[tuple[int, tuple[int, ...]]]:
        """``(position in tokens, ids)`` of what the env dropped after each turn's end."""
        out = []
        for start, turn in zip(self.starts, self.turns, strict=False):
            if turn.kept < len(turn.tokens):
                out.append((start + turn.kept, turn.tokens[turn.kept :]))
        return out


# -- the scripted episodes -------------------------------------------------------------------------------

# (label, turns). {question}, {gold}, {first} (the question's first words) fill in; {junk} marks where the
# sampler goes on after the closing tag; {oov} is an id beyond the vocabulary.
_MIXED = (
    (
        "one search, right answer",
        (
            " <think> I should look this up. </think> <search> {question} </search>",
            " <think> Found it. </think> <answer> {gold} </answer>",
        ),
    ),
    (
        "two searches, right answer",
        (
            " <think> One name first. </think> <search> {first} </search>",
            " <think> Now the whole question. </think> <search> {question} </search>",
            " <think> Done. </think> <answer> {gold} </answer>",
        ),
    ),
    ("answers at once, wrong", (" <think> A guess. </think> <answer> nobody </answer>",)),
    (
        "text after </search>, wrong answer",
        (
            " <think> Search. </think> <search> {question} </search>{junk}",
            " <think> Hmm. </think> <answer> nobody at all </answer>",
        ),
    ),
)
_ALL_WRONG = (
    ("answers at once, wrong", (" <answer> nobody </answer>",)),
    (
        "one search, wrong answer",
        (
            " <think> Look. </think> <search> {question} </search>",
            " <think> Unsure. </think> <answer> nobody </answer>",
        ),
    ),
    ("text after </answer>, wrong", (" <think> A guess. </think> <answer> nobody </answer>{junk}",)),
    (
        "two searches, wrong answer",
        (
            " <think> First. </think> <search> {first} </search>",
            " <think> Again. </think> <search> {question} </search>",
            " <think> Still unsure. </think> <answer> someone else </answer>",
        ),
    ),
)
_OUT_OF_VOCABULARY = (
    ("answers at once, wrong", (" <think> A guess. </think> <answer> nobody </answer>",)),
    ("answers at once, right", (" <think> I know. </think> <answer> {gold} </answer>",)),
    (
        "one search, right answer",
        (" <search> {question} </search>", " <think> Found it. </think> <answer> {gold} </answer>"),
    ),
    ("an id beyond the vocabulary", (" <think> {oov} </think> <answer> nobody </answer>",)),
)


def _encode_turn(tok: Tokenizer, text: str, fill: dict[str, str], junk: list[int]) -> list[int]:
    """A turn's ids: the text encoded; what follows ``{junk}`` encoded apart (a sampler's continuation)."""
    head, _, _ = text.partition("{junk}")
    ids: list[int] = []
    parts = head.split("{oov}")
    for k, part in enumerate(parts):
        ids += tok.encode(part.format(**fill))
        if k < len(parts) - 1:
            ids.append(tok.vocab_size + 3)
    return ids + (junk if "{junk}" in text else [])


def _fill(question: Any) -> dict[str, str]:
    return {
        "question": question.question,
        "gold": question.golden_answers[0],
        "first": " ".join(question.question.split()[:4]),
    }


def _play(
    tok: Tokenizer,
    model: Any,
    scripts: Sequence[tuple[tuple[str, tuple[str, ...]], ...]],
    question_offset: int,
    junk: list[int],
    first_index: int = 0,
) -> list[Episode]:
    """Plays the scripted groups through the vector env, one turn at a time; returns the recorded episodes
    with the sampler's log-probabilities (``model`` scoring each transcript)."""
    g = GROUP_SIZE
    env = SearchQAVectorEnv(len(scripts) * g, autoreset_mode="Disabled", tokenizer=tok, spec=ENV)
    try:
        questions = env.questions[question_offset : question_offset + len(scripts)]
        env.reset(seed=0, options={"group_size": g, "question_ids": [q.id for q in questions]})
        turns = [
            [_encode_turn(tok, t, _fill(questions[k]), junk) for t in script[1]]
            for k, group in enumerate(scripts)
            for script in group
        ]
        n = len(turns)
        starts: list[list[int]] = [[] for _ in range(n)]
        kept: list[list[int]] = [[] for _ in range(n)]
        refused: list[str | None] = [None] * n
        for k in range(max(len(t) for t in turns)):
            playing = [i for i in range(n) if k < len(turns[i]) and refused[i] is None]
            for i in playing:
                starts[i].append(env.episodes[i].length)
            batch: list[list[int] | None] = [None] * n
            for i in playing:
                if max(turns[i][k]) < tok.vocab_size:
                    batch[i] = turns[i][k]
            step = env.step_segments(batch)
            for i in playing:
                if batch[i] is not None:
                    kept[i].append(int(step.consumed[i]))
                    continue
                alone: list[list[int] | None] = [None] * n
                alone[i] = turns[i][k]
                try:
                    env.step_segments(alone)
                except InvalidActionError as e:
                    refused[i] = str(e)
                    kept[i].append(0)
        episodes = env.episodes
        for i in range(n):
            if refused[i] is None and not (episodes[i].done and len(kept[i]) == len(turns[i])):
                raise ConformError(f"scripted episode {i} did not end where its script ends")
        transcripts = [episodes[i].tokens[: episodes[i].length].tolist() for i in range(n)]
        sources = [episodes[i].sources[: episodes[i].length].tolist() for i in range(n)]
        scored = _score(model, transcripts, tok.vocab_size)
        out = []
        for i in range(n):
            group, member = divmod(i, g)
            lp = [v if s == Source.POLICY else 0.0 for v, s in zip(scored[i], sources[i], strict=True)]
            sampled = []
            for start, ids, n_kept in zip(starts[i], turns[i], kept[i], strict=True):
                context = transcripts[i][:start] + ids
                values = (
                    lp[start : start + n_kept] + _score(model, [context], tok.vocab_size)[0][start + n_kept :]
                )
                sampled.append(Turn(tuple(ids), tuple(values), n_kept))
            out.append(
                Episode(
                    index=first_index + i,
                    label=scripts[group][member][0],
                    question_id=questions[group].id,
                    group=group,
                    turns=tuple(sampled),
                    starts=tuple(starts[i]),
                    tokens=tuple(transcripts[i]),
                    sources=tuple(sources[i]),
                    logprobs=tuple(lp),
                    reward=float(episodes[i].reward),
                    refused=refused[i],
                )
            )
        return out
    finally:
        env.close()


@torch.no_grad()
def _score(model: Any, transcripts: Sequence[Sequence[int]], vocab_size: int) -> list[list[float]]:
    """Each token's log-probability given the tokens before it (over the real vocabulary; 0 for the first
    token and for ids beyond the vocabulary, which ``model`` must have rows for), as the sampler reports it."""
    width = max(len(t) for t in transcripts)
    ids = torch.zeros(len(transcripts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, t in enumerate(transcripts):
        ids[i, : len(t)] = torch.tensor(list(t))
        mask[i, : len(t)] = 1
    device = next(model.parameters()).device
    logp, _ = token_logprobs(model, ids.to(device), mask.to(device), vocab_size=vocab_size)
    return [logp[i, : len(t)].float().cpu().tolist() for i, t in enumerate(transcripts)]


def _unused_ids(tokenizer: Tokenizer, used: set[int], count: int) -> list[int]:
    """``count`` ids from the top of the vocabulary that occur in no transcript, are no special token and
    decode to printable text without a tag's brackets."""
    special = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    found: list[int] = []
    for i in range(tokenizer.vocab_size - 1, -1, -1):
        text = tokenizer.decode([i]).strip()
        if i not in used and i not in special and text.isprintable() and text and not set(text) & set("<>/"):
            found.append(i)
            if len(found) == count:
                return found
    raise ConformError("the vocabulary has too few ids outside the transcripts to write after a tag")


def scripted_episodes(
    tokenizer: Tokenizer, model: Any, padded_model: Any | None = None
) -> tuple[list[Episode], list[Episode], tuple[int, ...]]:
    """The scripted episodes: two groups on the train split's first two questions (mixed rewards; all
    rewards equal), one group on the third with an id beyond the vocabulary.

    Args:
        tokenizer: The policy's tokenizer.
        model: The policy; its log-probabilities are the sampler's.
        padded_model: The model of the out-of-vocabulary group (default ``model``).

    Returns:
        ``(main, out_of_vocabulary, junk)``: the 8 episodes every check but ``vocabulary`` uses, the 4 of
        ``vocabulary``, and the ids the sampler wrote after closing tags.
    """
    junk = tokenizer.encode(JUNK)
    main = _play(tokenizer, model, (_MIXED, _ALL_WRONG), 0, junk)
    used = {t for ep in main for t in ep.tokens}
    if used & set(junk):  # the env drops what follows a tag, so the transcripts do not depend on it
        junk = _unused_ids(tokenizer, used, len(junk))
        main = _play(tokenizer, model, (_MIXED, _ALL_WRONG), 0, junk)
    oov = _play(tokenizer, padded_model or model, (_OUT_OF_VOCABULARY,), 2, junk)
    return main, oov, tuple(junk)


# -- a scripted rollout policy -----------------------------------------------------------------------------


class ScriptedTurns:
    """Hands each running episode its next scripted turn, as a rollout policy of
    :func:`~searchgym.agents.training.rollout.collect_rollouts` (sub-env ``i`` plays ``episodes[i]``).

    Each call checks that the context it is asked to continue is the env's transcript before that turn.

    Args:
        episodes: The episodes, in sub-env order.
    """

    def __init__(self, episodes: Sequence[Episode]) -> None:
        self.episodes = list(episodes)
        self.next = [0] * len(self.episodes)

    def clear_cache(self) -> None:
        """Nothing cached (the rollout loop calls this between batches)."""

    def turn(self, index: int, context: Sequence[int]) -> Turn:
        """Episode ``index``'s next turn, after checking ``context`` (the transcript so far)."""
        ep = self.episodes[index]
        k = self.next[index]
        if k >= len(ep.turns):
            raise ConformError(f"episode {index} ({ep.label}) was asked for a turn after its last")
        if list(context) != list(ep.tokens[: ep.starts[k]]):
            raise ConformError(
                f"episode {index} ({ep.label}): turn {k + 1} was asked for on a context that is not the "
                "env's transcript so far"
            )
        self.next[index] += 1
        return ep.turns[k]

    def rollout_segments(self, observations: Sequence[dict[str, np.ndarray]]) -> list[Segment]:
        """One segment per running episode (those with turns left, in order)."""
        running = [i for i, ep in enumerate(self.episodes) if self.next[i] < len(ep.turns)]
        if len(running) != len(observations):
            raise ConformError(
                f"{len(observations)} episodes asked for a turn, but {len(running)} have turns left"
            )
        segments = []
        for i, obs in zip(running, observations, strict=True):
            context = [int(t) for t in obs["tokens"][: int(obs["length"][0])]]
            turn = self.turn(i, context)
            segments.append(Segment(list(turn.tokens), torch.tensor(turn.logprobs), stop=""))
        return segments
