"""Evaluation speed: oracle episodes per second on the generated world and on a real corpus (HotpotQA).

The oracle agent does almost no work of its own, so its episode rate is the environment's: prompt and tool
text tokenisation, BM25 retrieval, answer parsing and scoring. Both figures are measured in the same run.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["default_data_dir", "run_eval_benchmark"]

HOTPOTQA = "hotpotqa_dev_distractor_1100"


def default_data_dir() -> Path | None:
    """``../shared/data`` next to the working directory or to the source checkout, if present."""
    here = Path(__file__).resolve().parents[2]
    for base in (Path.cwd(), here):
        candidate = (base / ".." / "shared" / "data").resolve()
        if (candidate / HOTPOTQA).is_dir():
            return candidate
    return None


def _oracle_rate(episodes: int, repeats: int, dataset: str | None) -> float:
    import gymnasium as gym

    import searchgym  # noqa: F401 - registers the env ids
    from searchgym.agents import OracleAgent, evaluate

    rates = []
    for _ in range(repeats):
        extra: dict[str, Any] = {"dataset": dataset} if dataset else {}
        env = gym.make("SearchQA-v0", split="test", **extra)
        base: Any = env.unwrapped
        agent = OracleAgent(base.dataset, base.split, base.tokenizer, base.config.max_turns)
        rates.append(evaluate(env, agent, episodes, seed=0, progress=False).episodes_per_s)
        env.close()
    return statistics.median(rates)


def run_eval_benchmark(
    *,
    episodes: int = 500,
    repeats: int = 3,
    data_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Oracle episodes/s on the world's test split and, when the data is there, on HotpotQA's.

    Each run builds a fresh env (caches start empty), then plays ``episodes`` episodes on questions
    ``0 … episodes - 1``.

    Returns:
        ``eval_episodes_per_s_world``, and ``eval_episodes_per_s_hotpotqa`` with ``hotpotqa_vs_world`` when
        ``data_dir`` (default :func:`default_data_dir`) holds the HotpotQA sample.
    """
    figures: dict[str, Any] = {"eval_episodes": episodes, "eval_repeats": repeats}
    figures["eval_episodes_per_s_world"] = _oracle_rate(episodes, repeats, None)
    if log:
        log(f"oracle on the world: {figures['eval_episodes_per_s_world']:.0f} episodes/s")
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    if root is not None and (root / HOTPOTQA).is_dir():
        rate = _oracle_rate(episodes, repeats, str(root / HOTPOTQA))
        figures["eval_episodes_per_s_hotpotqa"] = rate
        figures["hotpotqa_vs_world"] = rate / figures["eval_episodes_per_s_world"]
        if log:
            log(f"oracle on HotpotQA: {rate:.0f} episodes/s")
    return figures
