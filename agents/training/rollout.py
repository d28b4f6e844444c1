"""Rollouts for GRPO: groups of episodes played turn by turn through the vector env, as padded tensors.

Every turn, one batched :meth:`LLMPolicy.rollout_segments` call generates a segment for every unfinished
sub-env, and one :meth:`SearchQAVectorEnv.step_segments` call feeds them (with one batched retrieval call
for all searches). Only the tokens the env consumed are kept, with their rollout log-probabilities, so
``logp_old`` lines up with the transcript's policy tokens exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from searchgym.envs.spec import EnvSpec
from searchgym.envs.vector import SearchQAVectorEnv
from searchgym.protocol import Source

from ..llm import LLMPolicy
from .config import EvalConfig

__all__ = [
    "RolloutBatch",
    "collect_rollouts",
    "concat_batches",
    "evaluate_policy",
    "pad_transcripts",
    "summarize_episodes",
]


@dataclass
class RolloutBatch:
    """``B`` finished episodes as right-padded tensors (``T`` = the longest transcript).

    Attributes:
        tokens: ``(B, T)`` int64 token ids (padding: the tokenizer's pad id).
        attention_mask: ``(B, T)`` int64, 1 on real tokens.
        sources: ``(B, T)`` int64 :class:`Source` of each token (0 on padding).
        logp_old: ``(B, T)`` float32 log-probability of each policy token under the rollout policy, 0
            elsewhere.
        rewards: ``(B,)`` float32 episode rewards.
        infos: ``B`` episode info dicts (``em``, ``searches``, ``end_reason`` …).
    """

    tokens: Tensor
    attention_mask: Tensor
    sources: Tensor
    logp_old: Tensor
    rewards: Tensor
    infos: list[dict[str, Any]]

    @property
    def loss_mask(self) -> Tensor:
        """``(B, T)`` bool: the tokens the policy wrote (never prompt, tool output or padding)."""
        return self.sources == int(Source.POLICY)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def select(self, index: Tensor | Sequence[int]) -> RolloutBatch:
        """The responses at ``index``, trimmed to their own longest transcript."""
        idx = torch.as_tensor(index, dtype=torch.long)
        width = max(int(self.attention_mask[idx].sum(dim=1).max()), 1)
        return RolloutBatch(
            tokens=self.tokens[idx, :width],
            attention_mask=self.attention_mask[idx, :width],
            sources=self.sources[idx, :width],
            logp_old=self.logp_old[idx, :width],
            rewards=self.rewards[idx],
            infos=[self.infos[int(i)] for i in idx],
        )

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The tensors moved to ``device``."""
        return RolloutBatch(
            self.tokens.to(device),
            self.attention_mask.to(device),
            self.sources.to(device),
            self.logp_old.to(device),
            self.rewards.to(device),
            self.infos,
        )


def pad_transcripts(
    tokens: Sequence[Sequence[int] | np.ndarray], sources: Sequence[Sequence[int] | np.ndarray], pad_id: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Right-pads transcripts into ``(tokens, attention_mask, sources)`` tensors of shape ``(B, T)``."""
    width = max((len(t) for t in tokens), default=1)
    ids = torch.full((len(tokens), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(tokens), width), dtype=torch.long)
    src = torch.zeros((len(tokens), width), dtype=torch.long)
    for i, (t, s) in enumerate(zip(tokens, sources, strict=True)):
        n = len(t)
        ids[i, :n] = torch.as_tensor(np.asarray(t, dtype=np.int64))
        src[i, :n] = torch.as_tensor(np.asarray(s, dtype=np.int64))
        mask[i, :n] = 1
    return ids, mask, src


def _play(env: SearchQAVectorEnv, policy: LLMPolicy, observations: dict[str, np.ndarray]) -> list[Tensor]:
    """Plays every sub-env to its end; returns each one's consumed-token log-probabilities, in order."""
    logps: list[list[Tensor]] = [[] for _ in range(env.num_envs)]
    policy.clear_cache()  # the KV cache kept across turns belongs to this batch of episodes only
    try:
        return _play_turns(env, policy, observations, logps)
    finally:
        policy.clear_cache()


def _play_turns(
    env: SearchQAVectorEnv,
    policy: LLMPolicy,
    observations: dict[str, np.ndarray],
    logps: list[list[Tensor]],
) -> list[Tensor]:
    # Each call ends at least one turn of every active episode, so the turn budget bounds the calls.
    for _ in range(2 * env.env_spec.max_turns + 2):
        active = [i for i, ep in enumerate(env.episodes) if not ep.done]
        if not active:
            break
        views = [{k: v[i] for k, v in observations.items()} for i in active]
        generated = policy.rollout_segments(views)
        segments: list[list[int] | None] = [None] * env.num_envs
        for i, seg in zip(active, generated, strict=True):
            if not seg.tokens:  # the env would wait forever for this turn
                raise RuntimeError(f"the policy produced an empty turn for sub-env {i} (stop {seg.stop!r})")
            segments[i] = seg.tokens
        step = env.step_segments(segments)
        for i, seg in zip(active, generated, strict=True):
            logps[i].append(seg.logprobs[: int(step.consumed[i])])
        observations = step.observations
    else:
        raise RuntimeError("episodes did not end within the turn budget; the env and the policy disagree")
    return [torch.cat(parts) if parts else torch.zeros(0) for parts in logps]


@torch.no_grad()
def collect_rollouts(
    env: SearchQAVectorEnv,
    policy: LLMPolicy,
    *,
    seed: int,
    group_size: int,
    question_ids: Sequence[str] | None = None,
) -> RolloutBatch:
    """Plays one batch of episodes: ``env.num_envs / group_size`` questions, ``group_size`` responses each.

    Args:
        env: A vector env with ``autoreset_mode="Disabled"``.
        policy: Generates the segments (sampling or greedy, as configured).
        seed: Seed of the question draw (``env.reset(seed=...)``).
        group_size: Responses per question (consecutive sub-envs share a question).
        question_ids: Pin the questions (one per group) instead of drawing them.

    Returns:
        The finished episodes as a :class:`RolloutBatch` (on the CPU).
    """
    options: dict[str, Any] = {"group_size": group_size}
    if question_ids is not None:
        options["question_ids"] = list(question_ids)
    observations, _ = env.reset(seed=seed, options=options)
    logps = _play(env, policy, observations)
    episodes = env.episodes
    tokens, mask, sources = pad_transcripts(
        [ep.tokens[: ep.length] for ep in episodes],
        [ep.sources[: ep.length] for ep in episodes],
        env.tokenizer.pad_token_id,
    )
    logp_old = torch.zeros(tokens.shape, dtype=torch.float32)
    policy_mask = sources == int(Source.POLICY)
    for i, lp in enumerate(logps):
        n = int(policy_mask[i].sum())
        if n != len(lp):
            raise RuntimeError(f"sub-env {i}: {n} policy tokens in the transcript but {len(lp)} log-probs")
        logp_old[i, policy_mask[i]] = lp
    rewards = torch.tensor([ep.reward for ep in episodes], dtype=torch.float32)
    return RolloutBatch(tokens, mask, sources, logp_old, rewards, env.episode_infos())


def concat_batches(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """The rows of several batches in one, re-padded to the longest transcript (empty without rows)."""
    lengths = [int(n) for b in batches for n in b.attention_mask.sum(dim=1).tolist()]
    rows = [(b, i) for b in batches for i in range(len(b))]
    tokens, mask, sources = pad_transcripts(
        [b.tokens[i, :n].numpy() for (b, i), n in zip(rows, lengths, strict=True)],
        [b.sources[i, :n].numpy() for (b, i), n in zip(rows, lengths, strict=True)],
        pad_id,
    )
    logp = torch.zeros(tokens.shape, dtype=torch.float32)
    for j, ((b, i), n) in enumerate(zip(rows, lengths, strict=True)):
        logp[j, :n] = b.logp_old[i, :n]
    rewards = torch.tensor([float(b.rewards[i]) for b, i in rows], dtype=torch.float32)
    return RolloutBatch(tokens, mask, sources, logp, rewards, [b.infos[i] for b, i in rows])


@torch.no_grad()
def evaluate_policy(
    policy: LLMPolicy,
    env: SearchQAVectorEnv,
    questions: int,
    episodes: list[dict[str, Any]] | None = None,
    *,
    progress: bool = False,
) -> dict[str, float]:
    """Greedy (or however ``policy`` is set) play on the first ``questions`` questions of ``env``'s split.

    Episodes run ``env.num_envs`` at a time through the vector env; the last, partial batch repeats its
    final question and ignores the extra episodes. ``episodes``, when given, receives each episode's info
    dict, in question order (for paired comparisons of two policies question by question). ``progress``
    shows a tqdm bar of the questions played (``eval``, removed when done).

    Returns:
        ``em``, ``f1``, ``searches`` (per episode), ``answered`` (share ending with an answer),
        ``response_length`` (policy tokens per episode) and ``episodes``.
    """
    from tqdm.auto import tqdm

    ids = [q.id for q in env.questions[: min(questions, len(env.questions))]]
    infos: list[dict[str, Any]] = []
    with tqdm(total=len(ids), desc="eval", unit="question", leave=False, disable=not progress) as bar:
        for start in range(0, len(ids), env.num_envs):
            chunk = ids[start : start + env.num_envs]
            padded = chunk + [chunk[-1]] * (env.num_envs - len(chunk))
            observations, _ = env.reset(seed=0, options={"group_size": 1, "question_ids": padded})
            _play(env, policy, observations)
            infos.extend(env.episode_infos()[: len(chunk)])
            bar.update(len(chunk))
    if episodes is not None:
        episodes.extend(infos)
    return summarize_episodes(infos)


def evaluate_greedy(
    model: Any,
    tokenizer: Any,
    spec: EnvSpec,
    evaluation: EvalConfig,
    episodes: list[dict[str, Any]] | None = None,
    *,
    progress: bool = False,
) -> dict[str, float]:
    """The greedy evaluation every trainer runs: ``model`` plays the first ``evaluation.questions``
    questions of ``evaluation.split`` greedily, ``evaluation.batch`` episodes at a time, in the env ``spec``
    describes (a trainer's ``config.env``). ``episodes`` receives the episodes' info dicts
    (:func:`evaluate_policy`, whose figures it returns); ``progress`` shows its bar."""
    greedy = LLMPolicy(model, tokenizer, greedy=True, max_turn_tokens=spec.max_turn_tokens)
    env = SearchQAVectorEnv(
        evaluation.batch, spec.replace(split=evaluation.split), autoreset_mode="Disabled", tokenizer=tokenizer
    )
    questions = evaluation.questions
    try:
        return evaluate_policy(greedy, env, questions, episodes, progress=progress)
    finally:
        env.close()


def summarize_episodes(infos: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Means over episodes of the figures every report uses."""
    if not infos:
        return {"em": float("nan"), "episodes": 0.0}

    def mean(key: str) -> float:
        return float(np.mean([float(i[key]) for i in infos]))

    return {
        "em": mean("em"),
        "f1": mean("f1"),
        "searches": mean("searches"),
        "answered": float(np.mean([i["end_reason"] == "answered" for i in infos])),
        "response_length": mean("policy_tokens"),
        "episodes": float(len(infos)),
    }
