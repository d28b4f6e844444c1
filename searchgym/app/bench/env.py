"""Environment overhead: per-token step cost of SearchQA-v0, single and vectorised, the env's share of a
batched scripted rollout, and the cost of a snapshot, a restore and a fork. Retrieval is replaced by a
constant retriever so that only the env is measured."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from searchgym.retrieval import Hit, Retriever

__all__ = ["ConstantRetriever", "env_us_per_step", "run_env_benchmark", "snapshot_us"]


class ConstantRetriever(Retriever):
    """Returns the same passages for every query, at no cost (isolates the env from retrieval)."""

    name = "constant"

    def __init__(self, hits: Sequence[Hit]) -> None:
        self.hits = list(hits)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return [self.hits[:k] for _ in queries]


def _text_tokens(tokenizer: Any, n: int) -> list[int]:
    """``n`` tokens of tag-free thinking text: turns never end inside the measured window."""
    text = "Reasoning about the question, the founder and the city, step by step. " * (n // 5 + 1)
    return tokenizer.encode(text)[:n]


def _single_step_us(steps: int, repeats: int) -> float:
    import gymnasium as gym

    env = gym.make(
        "SearchQA-v0", max_turn_tokens=steps + 1, max_context_tokens=2048, disable_env_checker=True
    )
    base: Any = env.unwrapped
    tokens = _text_tokens(base.tokenizer, steps)
    times = []
    for r in range(repeats):
        env.reset(seed=r)
        start = time.perf_counter()
        for t in tokens:
            env.step(t)
        times.append((time.perf_counter() - start) / len(tokens) * 1e6)
    return statistics.median(times)


def _vector_step_us(num_envs: int, steps: int, repeats: int) -> float:
    from searchgym.envs import SearchQAVectorEnv

    envs = SearchQAVectorEnv(num_envs=num_envs, max_turn_tokens=steps + 1)
    tokens = _text_tokens(envs.tokenizer, steps)
    times = []
    for r in range(repeats):
        envs.reset(seed=r)
        actions = [np.full(num_envs, t, dtype=np.int64) for t in tokens]
        start = time.perf_counter()
        for a in actions:
            envs.step(a)
        times.append((time.perf_counter() - start) / (len(tokens) * num_envs) * 1e6)
    return statistics.median(times)


def _rollout_env_share(num_envs: int, repeats: int) -> dict[str, float]:
    """Oracle turns for ``num_envs`` episodes, fed as segments to the vector env with real BM25 retrieval."""
    from searchgym.agents import oracle_turns
    from searchgym.envs import SearchQAVectorEnv

    envs = SearchQAVectorEnv(num_envs=num_envs, split="test", autoreset_mode="Disabled")
    tok = envs.tokenizer
    shares, totals = [], []
    for r in range(repeats):
        agent_time = env_time = 0.0
        start = time.perf_counter()
        t0 = time.perf_counter()
        _, infos = envs.reset(seed=r)
        env_time += time.perf_counter() - t0
        ids = list(infos["question_id"])
        t0 = time.perf_counter()
        plans = [
            [tok.encode(t) for t in oracle_turns(envs.dataset, q, "test", envs.env_spec.max_turns)]
            for q in ids
        ]
        agent_time += time.perf_counter() - t0
        while any(plans):
            t0 = time.perf_counter()
            segments = [
                plan.pop(0) if plan and not ep.done else None
                for plan, ep in zip(plans, envs.episodes, strict=True)
            ]
            agent_time += time.perf_counter() - t0
            t0 = time.perf_counter()
            envs.step_segments(segments)
            env_time += time.perf_counter() - t0
        total = time.perf_counter() - start
        totals.append(total)
        shares.append(env_time / total)
    return {"rollout_env_share": statistics.median(shares), "rollout_seconds": statistics.median(totals)}


def snapshot_us(
    tokens: int = 1000, repeats: int = 5, calls: int = 2000, num_envs: int = 8
) -> dict[str, float]:
    """µs per ``snapshot()`` and per ``restore()`` of a single env holding a ``tokens``-token episode (policy
    tokens after the prompt), and per sub-env of a vector env's ``fork(0, num_envs)`` of such an episode.

    Medians over ``repeats`` runs of ``calls`` calls each.
    """
    from searchgym.envs import SearchQAEnv, SearchQAVectorEnv

    sizes: dict[str, Any] = {"max_turn_tokens": tokens + 1, "max_context_tokens": tokens + 512}
    env = SearchQAEnv(**sizes)
    env.reset(seed=0)
    text = _text_tokens(env.tokenizer, tokens)
    for t in text:
        env.step(t)
    snap = env.snapshot()
    snap_times, restore_times = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            env.snapshot()
        snap_times.append((time.perf_counter() - start) / calls * 1e6)
        start = time.perf_counter()
        for _ in range(calls):
            env.restore(snap)
        restore_times.append((time.perf_counter() - start) / calls * 1e6)
    envs = SearchQAVectorEnv(num_envs=num_envs, autoreset_mode="Disabled", **sizes)
    envs.reset(seed=0)
    envs.restore(0, snap)
    fork_times = []
    forks = max(1, calls // num_envs)
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(forks):
            envs.fork(0, num_envs)
        fork_times.append((time.perf_counter() - start) / (forks * (num_envs - 1)) * 1e6)
    envs.close()
    env.close()
    return {
        "snapshot_us": statistics.median(snap_times),
        "restore_us": statistics.median(restore_times),
        "fork_us_per_branch": statistics.median(fork_times),
        "snapshot_tokens": float(snap.length),
    }


def env_us_per_step(
    sizes: Sequence[int] = (1, 8, 64, 256), steps: int = 400, repeats: int = 5
) -> dict[str, float]:
    """µs per sub-env step at each vector size (``1``: a single env through ``gym.make``'s wrappers).

    The vector sizes feed ``max(50, steps // 4)`` tokens per run; medians over ``repeats``.
    """
    return {
        str(n): _single_step_us(steps, repeats)
        if n == 1
        else _vector_step_us(n, max(50, steps // 4), repeats)
        for n in sizes
    }


def run_env_benchmark(steps: int = 1000, repeats: int = 5, num_envs: int = 64) -> dict[str, Any]:
    """Runs every measurement and returns the figures (medians over ``repeats``)."""
    from searchgym.data import WorldConfig, generate_world

    world_times = []
    for _ in range(repeats):
        start = time.perf_counter()
        generate_world(WorldConfig(seed=12345))
        world_times.append(time.perf_counter() - start)
    figures: dict[str, Any] = {
        "world_generation_s": statistics.median(world_times),
        "step_overhead_us": _single_step_us(steps, repeats),
        "vector_step_overhead_us": _vector_step_us(num_envs, max(50, steps // 4), repeats),
        "vector_num_envs": num_envs,
    }
    figures.update(_rollout_env_share(num_envs, repeats))
    figures.update(snapshot_us(repeats=repeats))
    figures["goal_us"] = 10.0
    figures["repeats"] = repeats
    return figures
