"""Evaluation speed: oracle episodes per second on the generated world and on a real corpus (HotpotQA).

The oracle agent does almost no work of its own, so its episode rate is the environment's: prompt and tool
text tokenisation, BM25 retrieval, answer parsing and scoring. Both figures are measured in the same run,
the two datasets interleaved, and each ratio is the median of the per-run ratios.

Two rates per dataset: the first pass over the questions in a fresh env, with the tool-text token cache
emptied (every passage is tokenised when first retrieved), and a second pass over the same questions in the
same env (as when a second agent or checkpoint is evaluated, or the G responses of a GRPO group retrieve the
same passages), where retrieved passages come from the cache.
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
    here = Path(__file__).resolve().parents[3]
    for base in (Path.cwd(), here):
        candidate = (base / ".." / "shared" / "data").resolve()
        if (candidate / HOTPOTQA).is_dir():
            return candidate
    return None


def _oracle_rates(episodes: int, dataset: str | None) -> tuple[float, float, float]:
    """Oracle episodes/s in a fresh env with an empty token cache, then again on the same questions; and
    the first pass's env steps/s (episodes of different lengths compared per step)."""
    import gymnasium as gym

    import searchgym  # noqa: F401 - registers the env ids
    from searchgym.agents import OracleAgent, evaluate

    extra: dict[str, Any] = {"dataset": dataset} if dataset else {}
    env = gym.make("SearchQA-v0", split="test", **extra)
    try:
        base: Any = env.unwrapped
        base.tokenizer.clear_cache()
        agent = OracleAgent(base.dataset, base.split, base.tokenizer, base.env_spec.max_turns)
        first = evaluate(env, agent, episodes, seed=0, progress=False)
        again = evaluate(env, agent, episodes, seed=0, progress=False).episodes_per_s
    finally:
        env.close()
    steps_per_episode = sum(r.steps for r in first.records) / max(len(first.records), 1)
    return first.episodes_per_s, again, first.episodes_per_s * steps_per_episode


def run_eval_benchmark(
    *,
    episodes: int = 500,
    repeats: int = 3,
    data_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Oracle episodes/s on the world's test split and, when the data is there, on HotpotQA's.

    Each run builds a fresh env per dataset (token cache emptied), plays ``episodes`` episodes on questions
    ``0 … episodes - 1``, then plays them again in the same env (the ``_repeat`` figures).

    Returns:
        ``eval_episodes_per_s_world`` and ``eval_episodes_per_s_world_repeat``; when ``data_dir`` (default
        :func:`default_data_dir`) holds the HotpotQA sample, ``eval_episodes_per_s_hotpotqa``,
        ``eval_episodes_per_s_hotpotqa_repeat``, ``hotpotqa_vs_world`` and ``hotpotqa_vs_world_repeat``
        (medians of the per-run ratios); ``eval_steps_per_s_*`` (env steps/s of the first pass) and
        ``hotpotqa_vs_world_per_step``, the first-pass ratio per env step: HotpotQA's oracle episodes are
        about 1.5 times as long as the world's (more question and answer tokens, more searches), which
        bounds the per-episode ratio whatever each step costs.
    """
    figures: dict[str, Any] = {"eval_episodes": episodes, "eval_repeats": repeats}
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    hotpot = str(root / HOTPOTQA) if root is not None and (root / HOTPOTQA).is_dir() else None
    runs: dict[str, list[tuple[float, float, float]]] = {"world": [], "hotpotqa": []}
    # Once per process, untimed: imports and the compiled BM25 kernel's load (when numba is installed) are
    # no dataset's cost, and would otherwise land on whichever dataset runs first.
    _oracle_rates(2, None)
    for _ in range(repeats):
        runs["world"].append(_oracle_rates(episodes, None))
        if hotpot is not None:
            runs["hotpotqa"].append(_oracle_rates(episodes, hotpot))
    for name, rates in runs.items():
        if not rates:
            continue
        figures[f"eval_episodes_per_s_{name}"] = statistics.median(r[0] for r in rates)
        figures[f"eval_episodes_per_s_{name}_repeat"] = statistics.median(r[1] for r in rates)
        figures[f"eval_steps_per_s_{name}"] = statistics.median(r[2] for r in rates)
        if log:
            log(
                f"oracle on {name}: {figures[f'eval_episodes_per_s_{name}']:.0f} episodes/s, "
                f"{figures[f'eval_episodes_per_s_{name}_repeat']:.0f} on the same questions again"
            )
    if runs["hotpotqa"]:
        pairs = list(zip(runs["world"], runs["hotpotqa"], strict=True))
        figures["hotpotqa_vs_world"] = statistics.median(h[0] / w[0] for w, h in pairs)
        figures["hotpotqa_vs_world_repeat"] = statistics.median(h[1] / w[1] for w, h in pairs)
        figures["hotpotqa_vs_world_per_step"] = statistics.median(h[2] / w[2] for w, h in pairs)
    return figures
