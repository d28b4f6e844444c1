"""Episodes as the rows TRL and verl consume: prompt / response token ids, loss masks, log-probs, rewards.

A searchgym transcript is ``prompt tokens`` followed by the response: the policy's turns interleaved with
tool output. Both engines split it the same way (TRL: ``prompt_ids`` / ``completion_ids``; verl:
``prompt_ids`` / ``response_ids``) and mask the tool tokens out of the loss (TRL's ``env_mask``, verl's
``response_mask``: 1 on the policy's tokens, 0 on tool tokens). Nothing is decoded: the ids are the ids
the policy sampled.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from searchgym.errors import ConfigError
from searchgym.protocol import Source

__all__ = [
    "FORMATS",
    "EpisodeTokens",
    "chat_turns",
    "episodes_from_batch",
    "split_transcript",
    "to_record",
    "write_jsonl",
]

Format = Literal["trl", "verl"]
FORMATS: tuple[str, ...] = ("trl", "verl")

# The episode info fields every exported record keeps (JSON-friendly, useful for analysis).
_INFO_KEYS = ("question_id", "question", "golden_answers", "answer", "em", "f1", "searches", "end_reason")


@dataclass
class EpisodeTokens:
    """One finished episode split at the end of its prompt.

    Attributes:
        prompt_ids: The prompt's token ids (``Source.PROMPT``).
        response_ids: Everything after the prompt: the policy's tokens and the tool output.
        response_mask: ``len(response_ids)`` 0/1: 1 on the policy's tokens (the loss mask), 0 on tool tokens.
        response_logprobs: ``len(response_ids)`` rollout log-probabilities (0.0 on tool tokens).
        reward: The episode's reward (the env's metric, exact match by default).
        info: The episode's info dict (``em``, ``f1``, ``searches``, ``question_id`` …).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    reward: float
    info: dict[str, Any]


def split_transcript(
    tokens: Sequence[int] | np.ndarray,
    sources: Sequence[int] | np.ndarray,
    logprobs: Sequence[float] | np.ndarray | None = None,
) -> tuple[list[int], list[int], list[int], list[float]]:
    """Splits a transcript into ``(prompt_ids, response_ids, response_mask, response_logprobs)``.

    The prompt is the leading run of ``Source.PROMPT`` tokens; padding (``Source.PAD``) is dropped.

    Args:
        tokens: ``(T,)`` token ids.
        sources: ``(T,)`` who wrote each token.
        logprobs: ``(T,)`` log-probability of each token (policy tokens), default all 0.

    Raises:
        ConfigError: the transcript has a prompt token after the prompt, or none at all.
    """
    src = np.asarray(sources, dtype=np.int64)
    ids = np.asarray(tokens, dtype=np.int64)
    real = src != int(Source.PAD)
    src, ids = src[real], ids[real]
    lp = np.zeros(len(ids)) if logprobs is None else np.asarray(logprobs, dtype=np.float64)[real]
    not_prompt = np.flatnonzero(src != int(Source.PROMPT))
    n = int(not_prompt[0]) if len(not_prompt) else len(src)
    if n == 0 or (src[n:] == int(Source.PROMPT)).any():
        raise ConfigError("a transcript is one prompt followed by the response; got another layout")
    mask = (src[n:] == int(Source.POLICY)).astype(np.int64)
    return (
        ids[:n].tolist(),
        ids[n:].tolist(),
        mask.tolist(),
        np.where(mask.astype(bool), lp[n:], 0.0).tolist(),
    )


def episodes_from_batch(batch: Any) -> list[EpisodeTokens]:
    """The episodes of a :class:`~searchgym.agents.training.rollout.RolloutBatch`, split at their prompts."""
    out = []
    for i in range(len(batch)):
        n = int(batch.attention_mask[i].sum())
        prompt, response, mask, logp = split_transcript(
            batch.tokens[i, :n].tolist(), batch.sources[i, :n].tolist(), batch.logp_old[i, :n].tolist()
        )
        out.append(EpisodeTokens(prompt, response, mask, logp, float(batch.rewards[i]), batch.infos[i]))
    return out


def chat_turns(response_mask: Sequence[int]) -> int:
    """Chat turns as verl's ``AgentLoopOutput.num_turns`` counts them: the prompt, then each run of policy
    (mask 1) or tool (mask 0) tokens of the response."""
    return 1 + sum(1 for i in range(len(response_mask)) if i == 0 or response_mask[i] != response_mask[i - 1])


def to_record(episode: EpisodeTokens, fmt: Format = "trl") -> dict[str, Any]:
    """One episode as a JSON-friendly row that builds the engine's own type.

    * ``"trl"``: ``prompt_ids``, ``completion_ids``, ``env_mask``, ``logprobs``, ``reward`` — what a TRL
      ``rollout_func`` returns per completion — and the episode's ``question_id``, ``question``,
      ``golden_answers``, ``answer``, ``em``, ``f1``, ``searches`` and ``end_reason`` beside them (TRL hands
      extra fields to the reward functions).
    * ``"verl"``: exactly the fields of verl's ``AgentLoopOutput``, so that ``AgentLoopOutput(**row)``
      works: ``prompt_ids``, ``response_ids``, ``response_mask``, ``response_logprobs``, ``reward_score``,
      ``num_turns``, ``metrics`` (empty: verl's defaults), and ``extra_fields`` holding what the
      ``searchgym`` agent loop returns there (``reward_extra_info`` with ``em``, ``f1``, ``searches``) plus
      the episode fields above.
    """
    info = {k: episode.info.get(k) for k in _INFO_KEYS}
    if fmt == "trl":
        return {
            "prompt_ids": episode.prompt_ids,
            "completion_ids": episode.response_ids,
            "env_mask": episode.response_mask,
            "logprobs": episode.response_logprobs,
            "reward": episode.reward,
            **info,
        }
    if fmt == "verl":
        extra = {k: float(info[k] or 0.0) for k in ("em", "f1", "searches")}
        return {
            "prompt_ids": episode.prompt_ids,
            "response_ids": episode.response_ids,
            "response_mask": episode.response_mask,
            "response_logprobs": episode.response_logprobs,
            "reward_score": episode.reward,
            "num_turns": chat_turns(episode.response_mask),
            "metrics": {},
            "extra_fields": {"reward_extra_info": extra, "turn_scores": [], "tool_rewards": [], **info},
        }
    raise ConfigError(f"unknown trajectory format {fmt!r}; choose one of {list(FORMATS)}")


def write_jsonl(records: Iterable[dict[str, Any]], path: str | Path) -> int:
    """Writes ``records`` as JSON lines, atomically (a temporary file moved into place). Returns the count."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, out)
    return n


def iter_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Reads the records :func:`write_jsonl` wrote."""
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)
