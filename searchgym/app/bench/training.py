"""Speed of the LLM side: rollouts against Hugging Face ``generate``, GRPO updates, and one step's split.

Every figure that is compared is measured in the same run, on the same model and batch, so the ratios hold
on any machine:

* **rollouts** (:func:`run_rollout_benchmark`): GRPO rollout batches played through the vector env by
  :func:`~searchgym.agents.training.rollout.collect_rollouts` (policy tokens per second of wall time, env and
  retrieval included), once with the KV cache kept across tool turns and the inverse-CDF sampler (today's
  path), once as before (every turn reads its whole transcript, ``torch.multinomial`` draws), and once
  *unshared* (today's path, but a turn's equal contexts, such as a group's after the same search, each
  extended for itself); against
  ``model.generate`` sampling the same number of new tokens per sequence from the same prompts, in one
  batch of the same size (no tool turns, no stops: the upper bound of a rollout's pace);
* **updates** (:func:`run_update_benchmark`): :meth:`GRPOTrainer.update` on one rollout batch, from the same
  weights and optimizer state each time, with today's defaults and on the reference path
  (the plan's plain chunks, a separate ``pi_old`` re-scoring pass, no-grad scoring passes under
  ``torch.no_grad``): policy tokens per second, and the step's time split into rollout, update and
  diagnostics (the displacement re-score and the probe set).

The default model is the trainer's: the tiny offline Qwen2-style model at random weights (pass ``init`` for
a trained checkpoint, or ``model`` for any Hugging Face folder). Its turns run to the turn cap, so every
episode has several tool turns: the case the cross-turn cache is for.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["peak_memory_mb", "run_rollout_benchmark", "run_update_benchmark"]


def peak_memory_mb(device: str = "cpu") -> float:
    """Peak resident memory of this process (CPU) or peak allocated accelerator memory, in MiB."""
    if not device.startswith("cpu"):
        import torch

        return float(torch.cuda.max_memory_allocated()) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def _config(run_dir: str, **overrides: Any) -> Any:
    from searchgym.agents.grpo.config import GRPOConfig

    base: dict[str, Any] = {
        "run_dir": run_dir,
        "overwrite": True,
        "steps": 1,
        "eval_questions": 0,
        "eval_at_start": False,
        "tensorboard": False,
        "progress": False,
        "save_every": 0,
    }
    return GRPOConfig(**{**base, **{k: v for k, v in overrides.items() if v is not None}})


def _multinomial_sampler(policy: Any) -> Callable[..., Any]:
    """The sampler rollouts used before the inverse-CDF one (the baseline of the comparison)."""
    import torch

    from searchgym.agents.llm.scoring import vocab_log_probs

    def sample(logits: Any, generator: Any = None) -> tuple[Any, Any]:
        logp = vocab_log_probs(logits, policy.vocab_size, policy.temperature)
        if policy.greedy:
            ids = logp.argmax(dim=-1)
        else:
            ids = torch.multinomial(logp.exp(), 1, generator=generator or policy._generator).squeeze(-1)
        return ids, logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)

    return sample


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _generate_tokens_per_s(
    policy: Any, prompts: list[list[int]], new_tokens: int, seed: int, device: str
) -> float:
    """``model.generate`` sampling exactly ``new_tokens`` per prompt, in one left-padded batch."""
    import torch

    tok = policy.tokenizer
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    torch.manual_seed(seed)
    _sync(device)
    start = time.perf_counter()
    with torch.no_grad():
        out = policy.model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            do_sample=True,
            temperature=policy.temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    _sync(device)
    elapsed = time.perf_counter() - start
    return (out.shape[1] - width) * len(prompts) / elapsed


def run_rollout_benchmark(
    *,
    repeats: int = 3,
    questions: int = 10,
    group_size: int = 5,
    init: str | None = None,
    model: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    overrides: dict[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Rollout tokens/s (cached and as before) against ``generate`` on the same model, batch and lengths.

    Args:
        repeats: Rollout batches per path (seeds 0, 1, …); figures are medians.
        questions: Questions per batch.
        group_size: Responses per question (the batch holds ``questions * group_size`` episodes).
        init: A trainer checkpoint to load (default: the tiny model at random weights).
        model: A Hugging Face model folder or name instead.
        device: Torch device.
        dtype: Model dtype.
        overrides: Other :class:`GRPOConfig` fields (e.g. ``max_turn_tokens``); default the trainer's.
        log: Progress lines (e.g. to stderr).

    Returns:
        ``rollout_tokens_per_s``, ``rollout_tokens_per_s_before``, ``rollout_speedup``,
        ``rollout_tokens_per_s_unshared`` and ``rollout_speedup_shared`` (today's path with every context
        extended for itself, and today's over it: the median of the per-run ratios),
        ``generate_tokens_per_s``, ``rollout_vs_generate``, ``rollout_logp_mismatch`` (the largest gap
        between the cached path's and the uncached path's log-probs of the same tokens, same seed), and the
        batch's shape.
    """
    import torch

    from searchgym.agents.training.policy import config_policy
    from searchgym.agents.training.rollout import collect_rollouts
    from searchgym.envs.vector import SearchQAVectorEnv

    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(
            tmp,
            init=init,
            model=model,
            device=device,
            dtype=dtype,
            group_size=group_size,
            **(overrides or {}),
        )
    policy, _ = config_policy(cfg, temperature=cfg.loss.temperature, seed=0)
    env = SearchQAVectorEnv(
        questions * group_size, cfg.env, autoreset_mode="Disabled", tokenizer=policy.tokenizer
    )
    fast_sampler, slow_sampler = policy._sample, _multinomial_sampler(policy)
    rates: dict[str, list[float]] = {"after": [], "before": [], "unshared": [], "generate": []}
    mismatch, tokens_per_episode = 0.0, []
    for r in range(repeats):
        batches = {}
        for path in ("before", "unshared", "after"):
            policy.reuse_cache = path != "before"
            policy._prefill.share_extensions = path != "unshared"
            setattr(policy, "_sample", slow_sampler if path == "before" else fast_sampler)  # noqa: B010
            policy.reset({}, seed=r)
            _sync(device)
            start = time.perf_counter()
            batch = collect_rollouts(env, policy, seed=r, group_size=group_size)
            _sync(device)
            elapsed = time.perf_counter() - start
            n = int(batch.loss_mask.sum())
            rates[path].append(n / elapsed)
            batches[path] = batch
            if log:
                log(f"rollout {path:6s} run {r}: {n} policy tokens in {elapsed:.2f} s = {n / elapsed:.0f}/s")
        # Same tokens on both paths: the log-probs of the cached path against those of the full re-reads.
        setattr(policy, "_sample", fast_sampler)  # noqa: B010
        policy.reuse_cache = False
        policy.reset({}, seed=r)
        check = collect_rollouts(env, policy, seed=r, group_size=group_size)
        after = batches["after"]
        if torch.equal(check.tokens, after.tokens):
            gap = (check.logp_old - after.logp_old).abs()[after.loss_mask]
            mismatch = max(mismatch, float(gap.max()) if gap.numel() else 0.0)
        policy.reuse_cache = True
        n = int(after.loss_mask.sum())
        per_episode = max(1, math.ceil(n / len(after)))
        tokens_per_episode.append(per_episode)
        prompts = [
            [int(t) for t in row[: int(row_mask.sum())]] for row, row_mask in _prompts(env, r, group_size)
        ]
        rate = _generate_tokens_per_s(policy, prompts, per_episode, seed=r, device=device)
        rates["generate"].append(rate)
        if log:
            log(f"generate        run {r}: {per_episode} new tokens x {len(prompts)} prompts = {rate:.0f}/s")
    env.close()
    after_rate, before_rate = statistics.median(rates["after"]), statistics.median(rates["before"])
    generate_rate = statistics.median(rates["generate"])
    return {
        "rollout_tokens_per_s": after_rate,
        "rollout_tokens_per_s_before": before_rate,
        "rollout_speedup": after_rate / before_rate,
        "rollout_tokens_per_s_unshared": statistics.median(rates["unshared"]),
        "rollout_speedup_shared": statistics.median(
            a / b for a, b in zip(rates["after"], rates["unshared"], strict=True)
        ),
        "generate_tokens_per_s": generate_rate,
        "rollout_vs_generate": after_rate / generate_rate,
        "rollout_vs_generate_before": before_rate / generate_rate,
        "rollout_logp_mismatch": mismatch,
        "rollout_batch": questions * group_size,
        "rollout_tokens_per_episode": statistics.median(tokens_per_episode),
        "rollout_repeats": repeats,
    }


def _prompts(env: Any, seed: int, group_size: int) -> Any:
    """The batch's first observations (its prompts), as ``(tokens, mask)`` rows."""
    import numpy as np

    observations, _ = env.reset(seed=seed, options={"group_size": group_size})
    lengths = observations["length"].reshape(-1)
    for row, n in zip(observations["tokens"], lengths, strict=True):
        yield row, np.arange(row.shape[0]) < n


def path_config(cfg: Any, setting: Mapping[str, Any]) -> Any:
    """``cfg`` (a ``GRPOConfig``) with one update path's ``length_buckets`` and ``rescore_pi_old``: a new
    config, checked as any other (configs are frozen: the trainer's is replaced, never changed)."""
    batch = dataclasses.replace(cfg.batch, length_buckets=setting["length_buckets"])
    loss = dataclasses.replace(cfg.loss, rescore_pi_old=setting["rescore_pi_old"])
    return dataclasses.replace(cfg, batch=batch, loss=loss)


def run_update_benchmark(
    *,
    repeats: int = 3,
    questions: int = 10,
    group_size: int = 5,
    init: str | None = None,
    model: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    overrides: dict[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """GRPO update speed today against the reference update (the unoptimised path), and the split of one
    step's time, on the trainer's default recipe (``kl_coef`` 0.001: a reference is scored too).

    *Before* is the reference path: the plan's plain chunks as micro-batches, ``pi_old`` re-scored in a
    separate pass, no-grad passes under ``torch.no_grad``, the output layer's log-probs and entropy by
    autograd through ``log_softmax``, every row read whole. *After* is today's default (length buckets, the
    first update's own forward as ``pi_old`` and the sampler's log-probs for the rest, ``inference_mode``,
    the fused log-prob/entropy with its hand-written backward, a prefix all rows of a micro-batch share
    read once). *Re-scored* is today's path with ``rescore_pi_old=True``. The paths take turns running
    first (after one untimed warm-up update), start from the same weights and optimizer state and update
    on the same rollout batch, so they do the same maths. Arguments as :func:`run_rollout_benchmark`'s.

    Returns:
        ``update_tokens_per_s``, ``update_tokens_per_s_before``, ``update_tokens_per_s_rescored``,
        ``update_speedup`` (after over before, the median of the per-run ratios; the update's own time,
        without the displacement diagnostics it ends with, which are ``step_diagnostics_s``),
        ``update_tokens_per_s_with_diagnostics``, ``update_tokens_per_s_before_with_diagnostics`` and
        ``update_speedup_with_diagnostics`` (the same with them counted), ``padding_share`` and
        ``padding_share_before`` (padded slots over all slots of the update's forward passes),
        ``update_logp_mismatch`` (the largest gap between the sampler's and the first update's log-probs),
        and ``step_rollout_s``, ``step_update_s``, ``step_diagnostics_s`` with their shares.
    """
    import torch

    from searchgym.agents.grpo.advantages import group_advantages
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.agents.grpo.trainer import GRPOTrainer
    from searchgym.agents.llm import DEFAULT_SCORING, ScoringOptions

    # Before: no-grad scoring, plain autograd through the output layer's log-softmax, every row reads a
    # shared prefix itself. Today: the defaults (inference mode, the fused kernel, shared prefixes read once).
    plain = ScoringOptions(fused=False, shared_prefix_min=0, inference_mode=False)
    today = {"scoring": DEFAULT_SCORING}
    paths: dict[str, dict[str, Any]] = {
        "before": {"length_buckets": False, "rescore_pi_old": True, "scoring": plain},
        "after": {"length_buckets": True, "rescore_pi_old": None, **today},
        "rescored": {"length_buckets": True, "rescore_pi_old": True, **today},
    }
    if GRPOConfig().loss.rescore_pi_old is True:  # today's default re-scores
        paths["after"], paths["rescored"] = paths["rescored"], {**paths["after"]}
        paths["auto"] = paths.pop("rescored")
    rates: dict[str, list[float]] = {path: [] for path in paths}
    rates_total: dict[str, list[float]] = {path: [] for path in paths}
    padding: dict[str, float] = {}
    mismatch = 0.0
    split: dict[str, list[float]] = {"rollout": [], "update": [], "diagnostics": []}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(
            tmp,
            init=init,
            model=model,
            device=device,
            dtype=dtype,
            group_size=group_size,
            questions_per_step=questions,
            **(overrides or {}),
        )
        trainer = GRPOTrainer(cfg)
        trainer.step = 1
        model_state = copy.deepcopy(trainer.model.state_dict())
        optim_state = copy.deepcopy(trainer.optimizer.state_dict())
        sched_state = copy.deepcopy(trainer.scheduler.state_dict())
        diag_time = [0.0]
        displacement = trainer.displacement

        def timed_displacement(*args: Any) -> dict[str, float]:
            start = time.perf_counter()
            out = displacement(*args)
            _sync(device)
            diag_time[0] += time.perf_counter() - start
            return out

        setattr(trainer, "displacement", timed_displacement)  # noqa: B010 - times the diagnostics
        for r in range(repeats):
            trainer.step = r + 1
            trainer.model.load_state_dict(
                model_state
            )  # the batch's sampler is the weights every path starts from
            start = time.perf_counter()
            batch = trainer.rollout()
            _sync(device)
            rollout_s = time.perf_counter() - start
            advantages = group_advantages(batch.rewards, group_size)
            tokens = int(batch.loss_mask.sum()) * cfg.batch.epochs
            names = list(paths)
            order = names[r % len(names) :] + names[: r % len(names)]  # each path runs first in turn
            if r == 0:  # one untimed update first: the first call of a process pays for warm-up
                order = [order[-1], *order]
            for n, path in enumerate(order):
                timed = not (r == 0 and n == 0)
                setting = paths[path]
                # The path's options, in a config of its own (the trainer reads them there: _micro, _pi_old);
                # the scoring options are the policy's, read by every scoring pass.
                trainer.config = path_config(cfg, setting)
                trainer.policy.scoring = setting["scoring"]
                trainer.model.load_state_dict(model_state)
                trainer.optimizer.load_state_dict(optim_state)
                trainer.scheduler.load_state_dict(sched_state)
                diag_time[0] = 0.0
                _sync(device)
                start = time.perf_counter()
                metrics = trainer.update(batch, advantages)
                _sync(device)
                update_s = time.perf_counter() - start
                if not timed:
                    continue
                # The update's own time: the displacement diagnostics it ends with are timed apart (the
                # issue's split: rollout / update / diagnostics); both rates are reported.
                train_s = update_s - diag_time[0]
                rates[path].append(tokens / train_s)
                rates_total[path].append(tokens / update_s)
                padding[path] = _padding_share(trainer, batch)
                if log:
                    log(
                        f"update {path:8s} run {r}: {tokens} policy tokens in {train_s:.2f} s "
                        f"+ {diag_time[0]:.2f} s diagnostics = {tokens / train_s:.0f}/s "
                        f"({tokens / update_s:.0f}/s with them)"
                    )
                if path == "after":
                    mismatch = max(mismatch, metrics["rollout/logp_mismatch"])
                    start = time.perf_counter()
                    trainer.probe_metrics()
                    _sync(device)
                    probe_s = time.perf_counter() - start
                    split["rollout"].append(rollout_s)
                    split["update"].append(train_s)
                    split["diagnostics"].append(diag_time[0] + probe_s)
        trainer.env.close()
        trainer.logger.close()
    parts = {k: statistics.median(v) for k, v in split.items()}
    total = sum(parts.values())
    return {
        "update_tokens_per_s": statistics.median(rates["after"]),
        "update_tokens_per_s_before": statistics.median(rates["before"]),
        "update_speedup": statistics.median(
            a / b for a, b in zip(rates["after"], rates["before"], strict=True)
        ),
        **{
            f"update_tokens_per_s_{alt}": statistics.median(rates[alt])
            for alt in paths
            if alt not in ("after", "before")
        },
        **{
            f"update_speedup_{alt}": statistics.median(
                a / b for a, b in zip(rates[alt], rates["before"], strict=True)
            )
            for alt in paths
            if alt not in ("after", "before")
        },
        "update_tokens_per_s_with_diagnostics": statistics.median(rates_total["after"]),
        "update_tokens_per_s_before_with_diagnostics": statistics.median(rates_total["before"]),
        "update_speedup_with_diagnostics": statistics.median(
            a / b for a, b in zip(rates_total["after"], rates_total["before"], strict=True)
        ),
        "update_logp_mismatch": mismatch,
        "padding_share": padding["after"],
        "padding_share_before": padding["before"],
        **{f"step_{k}_s": v for k, v in parts.items()},
        **{f"step_{k}_share": v / total for k, v in parts.items()},
        "update_batch": questions * group_size,
        "update_repeats": repeats,
        "torch_threads": torch.get_num_threads(),
    }


def _padding_share(trainer: Any, batch: Any) -> float:
    """Padded slots over all slots in the micro-batches of the trainer's plan for ``batch``."""
    import torch

    from searchgym.agents.grpo.trainer import minibatch_plan

    cfg = trainer.config
    lengths = batch.attention_mask.sum(dim=1)
    plan = trainer._micro(
        minibatch_plan(
            len(batch),
            cfg.batch.group_size,
            cfg.batch.minibatch_responses,
            cfg.batch.epochs,
            cfg.batch.minibatch_plan,
            torch.Generator(),
        ),
        lengths,
    )
    slots = real = 0
    for micro in plan:
        for idx in micro:
            slots += int(lengths[idx].max()) * len(idx)
            real += int(lengths[idx].sum())
    return 1.0 - real / slots if slots else 0.0
