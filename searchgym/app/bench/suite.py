"""``searchgym bench all``: every speed figure in one run, with the ratios the performance targets name.

Figures and targets (see docs/dev/benchmarks.md): rollout tokens/s against ``generate`` on the same model and
batch (``rollout_vs_generate``), update tokens/s against the reference update path (unoptimised)
(``update_speedup``), oracle episodes/s on HotpotQA against the generated world (``hotpotqa_vs_world``),
env µs per step at 1/8/64/256 sub-envs, retrieval, and peak memory.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from typing import Any

__all__ = ["machine", "run_all"]


def machine(device: str = "cpu") -> dict[str, Any]:
    """What the figures were measured on."""
    import os

    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "processor": platform.processor() or platform.machine(),
        "device": device,
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover - the train extra is absent
        pass
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name()
    return info


def run_all(
    *,
    quick: bool = False,
    repeats: int | None = None,
    device: str = "cpu",
    init: str | None = None,
    model: str | None = None,
    dtype: str = "float32",
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Runs every benchmark; ``quick`` shrinks batches and repeats (under two minutes on 2 CPU cores).

    Returns:
        One flat dict of figures (``rollout_tokens_per_s``, ``generate_tokens_per_s``,
        ``rollout_vs_generate``, ``update_tokens_per_s``, ``eval_episodes_per_s_world``,
        ``eval_episodes_per_s_hotpotqa`` when the data is present, ``env_us_per_step``, …), with
        ``machine`` and ``seconds``.
    """
    from .env import env_us_per_step
    from .evaluation import run_eval_benchmark
    from .retrieval import RetrievalBenchConfig, run_retrieval_benchmark
    from .training import peak_memory_mb, run_rollout_benchmark, run_update_benchmark

    start = time.perf_counter()
    reps = repeats if repeats is not None else (1 if quick else 3)
    questions = 4 if quick else 10
    llm: dict[str, Any] = {"init": init, "model": model, "device": device, "dtype": dtype, "log": log}
    figures: dict[str, Any] = {"quick": quick, "machine": machine(device)}
    figures |= run_rollout_benchmark(repeats=reps, questions=questions, **llm)
    figures |= run_update_benchmark(repeats=reps, questions=questions, **llm)
    figures |= run_eval_benchmark(episodes=150 if quick else 500, repeats=reps, log=log)
    figures["env_us_per_step"] = env_us_per_step(steps=200 if quick else 1000, repeats=max(reps, 3))
    if log:
        log(f"env us/step: {figures['env_us_per_step']}")
    retrieval = run_retrieval_benchmark(
        RetrievalBenchConfig(passages=5_000 if quick else 20_000, repeats=reps, queries=128, batch=64),
        with_bm25s=False,
        with_reference=False,
    )
    ours = retrieval["backends"]["bm25"]
    figures["retrieval_passages"] = retrieval["corpus"]["passages"]
    figures["retrieval_p50_ms"] = ours["p50_ms"]
    figures["retrieval_batch_ms"] = ours["batch_ms"]
    figures["peak_memory_mb"] = peak_memory_mb(device)
    figures["seconds"] = time.perf_counter() - start
    return figures
