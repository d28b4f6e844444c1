"""Supervised warm-start: cross-entropy on the oracle's own tokens (tool output is context only).

A tiny model trained from scratch cannot find the search protocol by sampling; a few epochs on oracle
transcripts teach it to search, read and answer, and GRPO starts from there (as Search-R1 starts from an
instruction-tuned model).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from searchgym.protocol import Source
from searchgym.run_lock import lock_run_dir

from .grpo.losses import masked_mean
from .training.checkpoint import save_checkpoint
from .training.config import SFTConfig
from .training.metrics import MetricLogger
from .training.policy import config_policy
from .training.rollout import evaluate_greedy, pad_transcripts
from .training.run import append_eval_episodes, make_optimizer, prepare_run_dir

__all__ = ["epoch_batches", "epoch_pools", "load_sft_demonstrations", "sft_loss", "train_sft"]


def sft_loss(logp: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Token-mean negative log-likelihood over the masked (policy) tokens.

    Args:
        logp: ``(B, T)`` log-probabilities of the transcript's tokens.
        loss_mask: ``(B, T)`` 1 on policy tokens.
    """
    return -masked_mean(logp, loss_mask)


def load_sft_demonstrations(config: SFTConfig, tokenizer: Any) -> list[Any]:
    """The demonstrations to learn from: ``config.sft.demos``, else ``config.sft.demonstrator``'s episodes on the
    training split.

    Only rewarded demonstrations are kept (the oracle can fail when retrieval misses the gold passage),
    unless ``config.sft.keep_unrewarded``: a designed-headroom teacher's demonstrations are wrong on purpose.
    """
    from .demonstrations import generate_demonstrations, read_demonstrations

    if config.sft.demos is not None:
        demos = read_demonstrations(config.sft.demos)
    else:
        import gymnasium as gym

        import searchgym  # noqa: F401 - registers the env ids

        env = gym.make("SearchQA-v0", spec=config.env, tokenizer=tokenizer)
        n = config.sft.demo_episodes or len(env.unwrapped.questions)  # type: ignore[attr-defined]
        demos = list(generate_demonstrations(env, n, config.run.seed, config.sft.demonstrator))
        env.close()
    return demos if config.sft.keep_unrewarded else [d for d in demos if d.reward > 0]


LENGTH_POOL_BATCHES = 50
"""``batch_order="length"`` sorts runs of this many batches' demonstrations by length: long enough runs that
a batch's lengths are close, short enough that which demonstrations meet still changes every epoch."""


def epoch_pools(demos: list[Any], epochs: int, curriculum: str | None) -> list[torch.Tensor]:
    """The indices of the demonstrations each epoch learns from: all of them, except in a curriculum's first
    epochs (``KIND:N``: the first ``N`` epochs see only the demonstrations of ``KIND``'s questions).

    Raises:
        ConfigError: the curriculum's kind names no demonstration (the message lists the kinds there are).
    """
    everything = torch.arange(len(demos))
    if curriculum is None:
        return [everything] * epochs
    from .training.config import parse_curriculum

    kind, first = parse_curriculum(curriculum)
    chosen = torch.tensor([i for i, d in enumerate(demos) if d.kind == kind], dtype=torch.long)
    if len(chosen) == 0:
        from searchgym.errors import ConfigError

        kinds = sorted({d.kind for d in demos if d.kind})
        raise ConfigError(
            f"curriculum {curriculum!r}: no demonstration is of a {kind!r} question; "
            + (f"their kinds are {', '.join(kinds)}" if kinds else "these demonstrations record no kind")
        )
    return [chosen] * first + [everything] * (epochs - first)


def epoch_batches(
    pool: torch.Tensor, lengths: torch.Tensor, size: int, order: str, generator: torch.Generator
) -> list[torch.Tensor]:
    """One epoch's batches of ``size`` demonstrations drawn from ``pool`` (indices).

    ``random`` shuffles the pool and cuts it. ``length`` shuffles it, sorts each run of
    :data:`LENGTH_POOL_BATCHES` batches by length (so a batch pads to about its own length), cuts, and
    shuffles the batches: each demonstration is still seen once per epoch, in a batch of its neighbours in
    length rather than of any.
    """
    shuffled = pool[torch.randperm(len(pool), generator=generator)]
    if order == "length":
        span = LENGTH_POOL_BATCHES * size
        runs = [shuffled[i : i + span] for i in range(0, len(shuffled), span)]
        shuffled = torch.cat([run[torch.argsort(lengths[run], stable=True)] for run in runs])
    batches = list(shuffled.split(size))
    if order == "length":
        batches = [batches[int(i)] for i in torch.randperm(len(batches), generator=generator)]
    return batches


def train_sft(config: SFTConfig) -> dict[str, float]:
    """Trains on demonstrations, saves ``RUN_DIR/checkpoint.pt`` and evaluates greedily.

    Returns:
        The final metrics (``eval/em`` … when ``eval_questions > 0``).

    Raises:
        ConfigError: ``run_dir`` already holds a run and ``config.run.overwrite`` is not set, or another process
            is writing into it.
    """
    with lock_run_dir(config.run.run_dir):  # one writer per run folder
        return _train_sft(config)


def _train_sft(config: SFTConfig) -> dict[str, float]:
    prepare_run_dir(config.run.run_dir, resume=False, overwrite=config.run.overwrite, resumable=False)
    if config.run.threads:
        torch.set_num_threads(config.run.threads)
    torch.manual_seed(config.run.seed)
    policy, arch = config_policy(config)
    model = policy.model
    demos = load_sft_demonstrations(config, policy.tokenizer)
    if not demos:
        from searchgym.errors import ConfigError

        raise ConfigError(
            "no demonstrations to learn from"
            if config.sft.keep_unrewarded
            else "no rewarded demonstrations to learn from (--keep-unrewarded learns from the others too)"
        )
    tokens, mask, sources = pad_transcripts(
        [d.tokens for d in demos], [d.sources for d in demos], policy.tokenizer.pad_token_id
    )
    pools = epoch_pools(demos, config.sft.epochs, config.sft.curriculum)
    size = config.sft.batch_size
    total_updates = sum(math.ceil(len(pool) / size) for pool in pools)
    optimizer, scheduler = make_optimizer(model, config.optim, total_updates=total_updates)
    logger = MetricLogger(config.run.run_dir, config=config)
    generator = torch.Generator().manual_seed(config.run.seed)
    lengths = mask.sum(dim=1)
    from tqdm.auto import tqdm

    bar = tqdm(total=total_updates, desc="sft", disable=not config.run.progress)
    update, start = 0, time.perf_counter()
    model.train()
    for epoch, pool in enumerate(pools):
        for idx in epoch_batches(pool, lengths, size, config.sft.batch_order, generator):
            width = int(lengths[idx].max())
            ids, attn = tokens[idx, :width].to(config.run.device), mask[idx, :width].to(config.run.device)
            loss_mask = sources[idx, :width].to(config.run.device) == int(Source.POLICY)
            logp, _ = policy.token_logprobs(ids, attn, score_mask=loss_mask)
            loss = sft_loss(logp, loss_mask)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(
                model.parameters(), config.optim.max_grad_norm or math.inf
            )
            optimizer.step()
            scheduler.step()
            update += 1
            logger.log(
                update,
                {
                    "sft/loss": float(loss.detach()),
                    "sft/epoch": float(epoch),
                    "train/grad_norm": float(grad_norm),
                    "train/lr": float(scheduler.get_last_lr()[0]),
                    "time/elapsed_s": time.perf_counter() - start,
                },
            )
            bar.update(1)
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}")
    bar.close()
    model.eval()
    save_checkpoint(
        Path(config.run.run_dir) / "checkpoint.pt",
        {
            "model": model.state_dict(),
            "arch": arch,
            "step": update,
            "kind": "sft",
            "config": config.to_dict(),
        },
    )
    final: dict[str, float] = {
        "sft/demonstrations": float(len(demos)),
        **{
            f"sft/demonstrations_{name}": float(n)
            for name, n in sorted(Counter(d.demonstrator for d in demos).items())
        },
        "time/elapsed_s": time.perf_counter() - start,
    }
    if config.eval.questions:
        episodes: list[dict[str, Any]] = []
        result = evaluate_greedy(
            policy.model,
            policy.tokenizer,
            config.env,
            config.eval,
            episodes,
            progress=config.run.progress,
        )
        append_eval_episodes(config.run.run_dir, update, episodes, config.env.reward)
        final.update({f"eval/{k}": v for k, v in result.items()})
    logger.log(update, final)
    logger.close()
    return final
