"""Playing episodes with a policy and writing them as TRL / verl trajectory rows (needs the train extra)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchgym.errors import ConfigError

if TYPE_CHECKING:
    from searchgym.envs.spec import EnvSpec

from .trajectories import FORMATS, episodes_from_batch, to_record, write_jsonl

__all__ = ["export_trajectories"]


def export_trajectories(
    out: str | Path,
    *,
    fmt: str = "trl",
    policy: str | None = None,
    episodes: int = 64,
    group_size: int = 1,
    batch: int = 32,
    temperature: float = 1.0,
    greedy: bool = False,
    seed: int = 0,
    spec: EnvSpec | None = None,
    tokenizer: str | None = None,
) -> int:
    """Plays ``episodes`` episodes through the vector env and writes them with :func:`to_record`.

    Args:
        out: The JSONL file (written atomically).
        fmt: ``"trl"`` or ``"verl"`` field names.
        policy: A checkpoint or Hugging Face folder (:func:`~searchgym.agents.training.export.load_policy`);
            ``None``: a fresh tiny model (for pipeline checks).
        episodes: Episodes to write; a multiple of ``group_size``.
        group_size: Episodes per question (consecutive rows share a question, as a GRPO group).
        batch: Episodes generated together (rounded down to a multiple of ``group_size``).
        temperature: Sampling temperature.
        greedy: Greedy decoding.
        seed: Seed of the question draws and of sampling.
        spec: The environment (default: :class:`~searchgym.envs.EnvSpec`'s defaults).
        tokenizer: The env's tokenizer by name, when ``policy`` brings none (default: the built-in one).

    Returns:
        The number of episodes written.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown trajectory format {fmt!r}; choose one of {list(FORMATS)}")
    if episodes < 1 or group_size < 1 or episodes % group_size:
        raise ConfigError(f"episodes ({episodes}) must be a positive multiple of group_size ({group_size})")
    from searchgym.agents.llm import LLMPolicy
    from searchgym.agents.training.export import load_policy
    from searchgym.agents.training.rollout import collect_rollouts
    from searchgym.envs.spec import EnvSpec
    from searchgym.envs.vector import SearchQAVectorEnv

    spec = spec if spec is not None else EnvSpec()
    turn_tokens = spec.max_turn_tokens  # the policy's turn cap is the env's
    if policy is not None:
        agent = load_policy(
            policy,
            tokenizer=tokenizer,
            greedy=greedy,
            temperature=temperature,
            max_turn_tokens=turn_tokens,
        )
    else:
        from searchgym.tokenization import load_tokenizer

        tok = load_tokenizer(tokenizer)
        agent = LLMPolicy.tiny(tok, greedy=greedy, temperature=temperature, max_turn_tokens=turn_tokens)
    size = max(group_size, (min(batch, episodes) // group_size) * group_size)
    env = SearchQAVectorEnv(size, spec, autoreset_mode="Disabled", tokenizer=agent.tokenizer)
    records: list[dict[str, Any]] = []
    try:
        call = 0
        while len(records) < episodes:
            rollout = collect_rollouts(env, agent, seed=seed + call, group_size=group_size)
            records.extend(to_record(e, fmt) for e in episodes_from_batch(rollout))  # type: ignore[arg-type]
            call += 1
    finally:
        env.close()
    return write_jsonl(records[:episodes], out)
