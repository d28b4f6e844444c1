"""The gradient noise scale of GRPO at a checkpoint: how many groups an update needs.

``searchgym bench gns`` samples ``groups`` groups with the trainer's own rollout path (the configured
questions, group size, temperature, reward and advantage), computes each group's gradient of the GRPO loss
at ``pi_old`` (the first update's gradient: ratio 1, so LLDS is 0 and the clip is inactive; KL off), and
reports the simple noise scale ``B_noise = tr Σ / |E g|²`` of :mod:`searchgym.agents.grpo.noise`, in groups
and in rollouts, with the signal-to-noise ratio ``|E g|² / (tr Σ / B)`` an update of the configured
mini-batch (``B`` groups) would have. An update of about ``B_noise`` groups is the point past which a larger
batch buys little (McCandlish et al. 2018's critical batch is of that order).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable
from typing import Any

__all__ = ["recommendation", "run_gns_benchmark"]


def run_gns_benchmark(
    config: Any, groups: int = 64, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Measures the noise scale of ``config``'s GRPO gradient over ``groups`` groups (see the module doc).

    Only the model, the environment and the GRPO options of ``config`` (a ``GRPOConfig``) are used: the run
    folder is a temporary one, probes, ledger, KL and evaluation are off.
    """
    import dataclasses

    import torch

    from searchgym.agents.grpo.advantages import compute_advantages
    from searchgym.agents.grpo.noise import GradientMoments, flat_grad
    from searchgym.agents.grpo.trainer import GRPOTrainer
    from searchgym.errors import ConfigError

    if groups < 2:
        raise ConfigError(f"--groups must be >= 2 (a covariance needs two gradients), got {groups}")
    say = log or (lambda _line: None)
    with tempfile.TemporaryDirectory(prefix="searchgym-gns-") as tmp:
        cfg = dataclasses.replace(
            config,
            run_dir=tmp,
            overwrite=True,
            resume=False,
            questions_per_step=groups,
            minibatch_size=None,
            micro_batch_size=None,
            steps=1,
            kl_coef=0.0,
            probe_size=0,
            onpolicy_probe_size=0,
            ledger_size=0,
            llds_ledger=False,
            eval_questions=0,
            eval_at_start=False,
            filter_groups=False,
            log_gns=False,
            tensorboard=False,
            progress=False,
            save_every=0,
            lr=config.optim.lr
            or 1e-4,  # the gradient does not depend on the rate; the frozen control has none
        )
        trainer = GRPOTrainer(cfg)
        trainer.step = 1
        t0 = time.perf_counter()
        batch = trainer.rollout()  # one draw: filter_groups is off
        t1 = time.perf_counter()
        say(
            f"sampled {groups} groups x {cfg.batch.group_size} in {t1 - t0:.1f} s; computing one gradient per group"
        )
        advantages = compute_advantages(batch.rewards, cfg.batch.group_size, cfg.loss.advantage)
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        moments = GradientMoments()
        trainer.model.eval()
        for g in range(groups):
            rows = torch.arange(g * cfg.batch.group_size, (g + 1) * cfg.batch.group_size)
            mb = batch.select(rows).to(cfg.run.device)
            tokens = float(mb.loss_mask.sum().clamp(min=1))
            trainer.model.zero_grad(set_to_none=True)
            loss, _ = trainer.loss(mb, advantages[rows].to(cfg.run.device), None, None, None, tokens)
            loss.backward()
            moments.add(flat_grad(params))
        trainer.env.close()
        t2 = time.perf_counter()
    est = moments.noise_scale()
    rewards = batch.rewards.view(groups, cfg.batch.group_size)
    informative = float((rewards.max(dim=1).values > rewards.min(dim=1).values).float().mean())
    minibatch_groups = config.batch.minibatch_responses / config.batch.group_size
    snr = est["grad_sq"] / (est["trace_cov"] / minibatch_groups) if est["trace_cov"] > 0 else math.inf
    figures: dict[str, Any] = {
        "groups": groups,
        "group_size": cfg.batch.group_size,
        "rollouts": groups * cfg.batch.group_size,
        "advantage": cfg.loss.advantage,
        "reward": cfg.env.reward,
        "mean_reward": float(batch.rewards.mean()),
        "informative_frac": informative,
        "grad_sq": est["grad_sq"],
        "trace_cov": est["trace_cov"],
        "noise_scale_groups": est["noise_scale"],
        "noise_scale_rollouts": est["noise_scale"] * cfg.batch.group_size,
        "minibatch_groups": minibatch_groups,
        "snr_minibatch": snr,
        "rollout_s": t1 - t0,
        "gradients_s": t2 - t1,
    }
    figures["recommendation"] = recommendation(figures)
    return figures


def recommendation(figures: dict[str, Any]) -> str:
    """One line: the configured mini-batch's signal-to-noise ratio and the groups an update needs for 1."""
    b_noise, mb, snr = figures["noise_scale_groups"], figures["minibatch_groups"], figures["snr_minibatch"]
    if not math.isfinite(b_noise) or b_noise <= 0:
        return (
            f"no signal resolved over {figures['groups']} groups (|E g|^2 <= 0): measure with more --groups "
            "before choosing a batch"
        )
    need = math.ceil(b_noise)
    verdict = "more signal than noise" if snr >= 1 else "mostly noise"
    return (
        f"an update of {mb:g} groups has SNR {snr:.2f} ({verdict}); about {need} groups "
        f"({need * figures['group_size']} rollouts) per update reach SNR 1"
    )
