"""The GRPO (+LLDS) trainer: rollout → reward → advantage → mini-batch updates → log, one step at a time.

One *step* is one rollout batch: ``questions_per_step`` questions, ``group_size`` responses each, played
through :class:`SearchQAVectorEnv` turn by turn. The batch is then used for ``epochs`` passes of shuffled
mini-batch updates, all against the same ``pi_old`` (the policy that generated it): that is where LLDS
acts, since on the first update ``pi_theta == pi_old`` and the term is exactly zero.

Every numeric step is a pure function of :mod:`searchgym.agents.grpo.losses`; this module only moves
tensors between them, the model and the environment. Metrics are gathered into one dict per step and
written in one place (:class:`MetricLogger`), under slash namespaces: ``rollout/``, ``lld/``, ``train/``,
``eval/``, ``time/``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from searchgym.envs.vector import SearchQAVectorEnv

from .checkpoint import CheckpointError, get_rng_state, load_checkpoint, save_checkpoint, set_rng_state
from .config import GRPOConfig
from .losses import (
    adaptive_answer_weight,
    answer_span_mask,
    answer_weights,
    group_advantages,
    grpo_llds_loss,
    likelihood_metrics,
    llds_loss,
)
from .rollout import RolloutBatch, collect_rollouts, summarize_episodes
from .runtime import MetricLogger, build_policy, make_optimizer
from .sft import evaluate_checkpoint_policy

__all__ = ["GRPOTrainer", "train_grpo"]

CHECKPOINT = "checkpoint.pt"


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


class GRPOTrainer:
    """Owns the policy, its frozen reference, the optimizer and the envs of one GRPO run.

    Args:
        config: The run's configuration (validated on construction).

    Raises:
        CheckpointError: ``config.resume`` is set and ``RUN_DIR/checkpoint.pt`` is missing or corrupted.
    """

    def __init__(self, config: GRPOConfig) -> None:
        self.config = cfg = config
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.run_dir = Path(cfg.run_dir)
        self.policy, self.arch = build_policy(
            cfg, temperature=cfg.temperature, max_turn_tokens=cfg.max_turn_tokens, seed=cfg.seed
        )
        self.model = self.policy.model
        # The reference is the initial policy; skipped entirely (no copy, no forward) when kl_coef == 0.
        self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False) if cfg.kl_coef > 0 else None
        self.optimizer, self.scheduler = make_optimizer(
            self.model, cfg, total_updates=cfg.steps * cfg.updates_per_step
        )
        self.env = SearchQAVectorEnv(
            cfg.batch_size,
            autoreset_mode="Disabled",
            **{**cfg.env_kwargs(), "tokenizer": self.policy.tokenizer},
        )
        self.step = 0
        if cfg.resume:
            self._restore(self.run_dir / CHECKPOINT)
        self.logger = MetricLogger(
            self.run_dir, resume_step=self.step if cfg.resume else None, tensorboard=cfg.tensorboard
        )
        self.update_metrics: list[dict[str, float]] = []  # per optimizer update of the last step (tests)

    # -- the loop --------------------------------------------------------------------------------------

    def train(self) -> dict[str, float]:
        """Runs from the current step to ``config.steps``; returns the last step's metrics."""
        cfg = self.config
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps, initial=self.step, desc="grpo", disable=not cfg.progress)
        metrics: dict[str, float] = {}
        if self.step == 0 and cfg.eval_every and cfg.eval_questions:
            self.logger.log(0, self.evaluate())
        try:
            while self.step < cfg.steps:
                self.step += 1
                t0 = time.perf_counter()
                batch = self.rollout()  # rollout (and reward: the env scores each finished episode)
                t1 = time.perf_counter()
                advantages = group_advantages(batch.rewards, cfg.group_size)  # advantage
                correct = batch.rewards > 0
                metrics = self.rollout_metrics(batch, advantages)
                metrics |= self.update(batch, advantages)  # loss and optimizer steps
                metrics |= self.displacement(batch, correct)
                t2 = time.perf_counter()
                if cfg.eval_questions and (
                    self.step == cfg.steps or (cfg.eval_every and self.step % cfg.eval_every == 0)
                ):
                    metrics |= self.evaluate()
                metrics |= {
                    "time/rollout_s": t1 - t0,
                    "time/update_s": t2 - t1,
                    "time/step_s": time.perf_counter() - t0,
                }
                self.logger.log(self.step, metrics)  # log: the one place metrics are recorded
                if self.step == cfg.steps or (cfg.save_every and self.step % cfg.save_every == 0):
                    self.save()
                bar.update(1)
                bar.set_postfix(
                    reward=f"{metrics['rollout/reward']:.2f}", grad=f"{metrics['train/grad_norm']:.2f}"
                )
        finally:
            bar.close()
            self.logger.close()
            self.env.close()
        return metrics

    # -- rollout ---------------------------------------------------------------------------------------

    def rollout(self) -> RolloutBatch:
        """One batch of groups, sampled by the current policy; the questions and the sampling are seeded by
        ``(seed, step)``, so a resumed run draws what the uninterrupted run would have drawn."""
        seed = self.config.seed * 1_000_003 + self.step
        self.policy.reset({}, seed=seed)
        return collect_rollouts(self.env, self.policy, seed=seed, group_size=self.config.group_size)

    def rollout_metrics(self, batch: RolloutBatch, advantages: Tensor) -> dict[str, float]:
        """Reward, EM, searches, lengths, and the rollout policy's likelihood of correct/incorrect responses."""
        summary = summarize_episodes(batch.infos)
        groups = batch.rewards.view(-1, self.config.group_size)
        metrics = {
            "rollout/reward": float(batch.rewards.mean()),
            "rollout/em": summary["em"],
            "rollout/f1": summary["f1"],
            "rollout/searches": summary["searches"],
            "rollout/answered": summary["answered"],
            "rollout/response_length": summary["response_length"],
            "rollout/solved_groups": float((groups.max(dim=1).values > 0).float().mean()),
            "rollout/zero_adv_groups": float((groups.std(dim=1) == 0).float().mean()),
            "rollout/adv_abs": float(advantages.abs().mean()),
        }
        lik = likelihood_metrics(batch.logp_old, batch.loss_mask, batch.rewards > 0)
        return metrics | {f"lld/{k}": v for k, v in lik.items()}

    # -- updates ---------------------------------------------------------------------------------------

    def _llds_weights(self, batch: RolloutBatch) -> tuple[Tensor | None, float | None]:
        """LLDS-MA's per-token weights (``None`` without ``--llds-ma``) and the answer weight beta."""
        cfg = self.config
        if not cfg.llds_ma:
            return None, None
        searches = float(np.mean([i["searches"] for i in batch.infos]))
        beta = cfg.llds_ma_beta if cfg.llds_ma_beta is not None else adaptive_answer_weight(searches)
        span = answer_span_mask(batch.tokens, batch.sources, self.policy.tokenizer.token_bytes)
        return answer_weights(span, beta), beta

    def _minibatches(self, n: int, generator: torch.Generator) -> list[list[Tensor]]:
        """Shuffled mini-batches of response indices, each split into micro-batches: one list per epoch."""
        cfg = self.config
        micro = cfg.micro_batch_size or cfg.minibatch_size
        epochs = []
        for _ in range(cfg.epochs):
            order = torch.randperm(n, generator=generator)
            epochs.append([order[i : i + cfg.minibatch_size] for i in range(0, n, cfg.minibatch_size)])
        return [[mb[j : j + micro] for j in range(0, len(mb), micro)] for ep in epochs for mb in ep]

    @torch.no_grad()
    def _score(self, model: Any, batch: RolloutBatch, micro_batches: list[Tensor]) -> Tensor:
        """``(B, T)`` log-probs of the batch's policy tokens under ``model``, micro-batch by micro-batch."""
        out = torch.zeros(batch.logp_old.shape, dtype=torch.float32)
        for idx in micro_batches:
            mb = batch.select(idx).to(self.config.device)
            logp, _ = _token_logprobs(self.policy, model, mb)
            out[idx, : logp.shape[1]] = logp.float().cpu()
        return out

    def update(self, batch: RolloutBatch, advantages: Tensor) -> dict[str, float]:
        """``epochs`` × mini-batch optimizer updates on one rollout batch, all against the same ``pi_old``.

        ``pi_old`` is the policy that generated the batch, re-scored here with the exact shapes the first
        epoch uses: the first update then sees ``pi_theta == pi_old`` bit for bit (ratio 1, LLDS exactly
        0), which the sampler's own log-probs (cached, last-position forwards) match only to float noise.
        """
        cfg = self.config
        generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + self.step)
        plan = self._minibatches(len(batch), generator)
        first_epoch = [idx for mb in plan[: len(plan) // cfg.epochs] for idx in mb]
        model_mode = self.model.training
        self.model.eval()  # dropout off: pi_old and pi_theta must be the same function of the parameters
        logp_old = self._score(self.model, batch, first_epoch)
        mismatch = (logp_old - batch.logp_old).abs()[batch.loss_mask]
        ref_logp = self._score(self.ref_model, batch, first_epoch) if self.ref_model is not None else None
        weights, beta = self._llds_weights(batch)
        self.update_metrics = []
        for micro_batches in plan:
            self.update_metrics.append(
                self._update_minibatch(batch, micro_batches, advantages, logp_old, ref_logp, weights)
            )
        self.model.train(model_mode)
        per_update: dict[str, list[float]] = defaultdict(list)
        for m in self.update_metrics:
            for k, v in m.items():
                per_update[k].append(v)
        metrics = {f"train/{k}": _mean(v) for k, v in per_update.items()}
        metrics["train/grad_norm_max"] = max(per_update["grad_norm"], default=float("nan"))
        metrics["train/lr"] = float(self.scheduler.get_last_lr()[0])
        metrics["train/skipped_updates"] = float(sum(per_update["skipped"]))
        metrics["rollout/logp_mismatch"] = float(mismatch.max()) if mismatch.numel() else 0.0
        if beta is not None:
            metrics["train/llds_ma_beta"] = beta
        return metrics

    def _update_minibatch(
        self,
        batch: RolloutBatch,
        micro_batches: list[Tensor],
        advantages: Tensor,
        logp_old: Tensor,
        ref_logp: Tensor | None,
        weights: Tensor | None,
    ) -> dict[str, float]:
        """One optimizer update (gradients accumulated over micro-batches); skipped if anything is not finite."""
        cfg = self.config
        num_tokens = float(batch.loss_mask[torch.cat(micro_batches)].sum().clamp(min=1))
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        finite = True
        for idx in micro_batches:
            mb = batch.select(idx).to(cfg.device)
            width = mb.tokens.shape[1]
            loss, m = self.loss(
                mb,
                advantages[idx].to(cfg.device),
                logp_old[idx, :width].to(cfg.device),
                None if ref_logp is None else ref_logp[idx, :width].to(cfg.device),
                None if weights is None else weights[idx, :width].to(cfg.device),
                num_tokens,
            )
            finite = finite and bool(torch.isfinite(loss))
            if finite:
                loss.backward()
            share = float(mb.loss_mask.sum()) / num_tokens  # token-weighted, like the loss itself
            for k, v in m.items():
                # Terms already divided by num_tokens add up; ratios (fractions, means) are token-weighted.
                sums[k] += v if k in ("loss", "pg_loss", "llds_loss", "kl", "entropy") else v * share
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm or math.inf)
        finite = finite and bool(torch.isfinite(grad_norm))
        if finite:
            self.optimizer.step()
            self.scheduler.step()
        else:  # a NaN/Inf loss or gradient: skip this update, keep the weights, and say so in the log
            self.optimizer.zero_grad(set_to_none=True)
        return {**sums, "grad_norm": float(grad_norm), "skipped": float(not finite)}

    def loss(
        self,
        mb: RolloutBatch,
        advantages: Tensor,
        logp_old: Tensor,
        ref_logp: Tensor | None,
        weights: Tensor | None,
        num_tokens: float | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        """The GRPO(+LLDS) loss of one micro-batch; the policy's output layer runs on policy tokens only, so
        prompt and tool positions get no gradient at all."""
        cfg = self.config
        mask = mb.loss_mask
        logp, entropy = _token_logprobs(self.policy, self.model, mb, with_entropy=True)
        assert entropy is not None
        loss, metrics = grpo_llds_loss(
            logp,
            logp_old,
            advantages,
            mask,
            clip_eps=cfg.clip_eps,
            llds_coef=cfg.llds_coef if cfg.llds_enabled else 0.0,
            gate="action" if cfg.llds == "none" else cfg.llds,
            llds_weights=weights,
            ref_logp=ref_logp,
            kl_coef=cfg.kl_coef,
            entropy=entropy if cfg.entropy_coef else None,
            entropy_coef=cfg.entropy_coef,
            num_tokens=num_tokens,
        )
        with torch.no_grad():
            if not cfg.llds_enabled:  # vanilla GRPO still reports what LLDS (action gate) would measure
                metrics |= llds_loss(logp, logp_old, advantages, mask, "action", None, num_tokens)[1]
            preserved = (advantages >= 0)[:, None] & mask
            d = torch.where(preserved, logp_old - logp, 0.0)
            metrics["llds_lost_frac"] = float((d > 0).sum()) / max(int(preserved.sum()), 1)
            metrics["entropy"] = float(torch.where(mask, entropy, 0.0).sum()) / (
                num_tokens or max(int(mask.sum()), 1)
            )
            metrics["kl"] = metrics.pop("kl_ref", float("nan"))
        return loss, metrics

    # -- diagnostics -------------------------------------------------------------------------------------

    @torch.no_grad()
    def displacement(self, batch: RolloutBatch, correct: Tensor) -> dict[str, float]:
        """How this step's updates moved the likelihood of the batch's own responses (LLD when < 0 on correct ones).

        Returns ``lld/displacement`` (mean over correct responses of the per-token change of log-likelihood,
        after the updates minus before), its summed form, and the same for incorrect responses.
        """
        size = self.config.micro_batch_size or self.config.minibatch_size
        chunks = [torch.arange(i, min(i + size, len(batch))) for i in range(0, len(batch), size)]
        mode = self.model.training
        self.model.eval()
        after = self._score(self.model, batch, chunks)
        self.model.train(mode)
        mask = batch.loss_mask
        delta = torch.where(mask, after - batch.logp_old, 0.0)
        per_resp, tokens = delta.sum(dim=1), mask.sum(dim=1).clamp(min=1)
        out = {}
        for name, sel in (("", correct), ("_incorrect", ~correct)):
            if bool(sel.any()):
                out[f"lld/displacement{name}"] = float((per_resp[sel] / tokens[sel]).mean())
                out[f"lld/displacement_sum{name}"] = float(per_resp[sel].mean())
            else:
                out[f"lld/displacement{name}"] = out[f"lld/displacement_sum{name}"] = float("nan")
        return out

    def evaluate(self) -> dict[str, float]:
        """Greedy play on the first ``eval_questions`` questions of the eval split, as ``eval/`` metrics."""
        result = evaluate_checkpoint_policy(self.policy, self.config, self.config.eval_questions)
        return {f"eval/{k}": v for k, v in result.items()}

    # -- checkpoints -------------------------------------------------------------------------------------

    def save(self) -> Path:
        """Writes ``RUN_DIR/checkpoint.pt`` atomically: model, optimizer, scheduler, RNG states, step."""
        return save_checkpoint(
            self.run_dir / CHECKPOINT,
            {
                "kind": "grpo",
                "step": self.step,
                "model": self.model.state_dict(),
                "arch": self.arch,
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "rng": get_rng_state(),
                "config": dataclasses.asdict(self.config),
            },
        )

    def _restore(self, path: Path) -> None:
        payload = load_checkpoint(path, map_location=self.config.device)
        if payload.get("kind") != "grpo":
            raise CheckpointError(
                f"{path} is a {payload.get('kind')!r} checkpoint, not a GRPO run's; use --init to start from it"
            )
        try:
            self.model.load_state_dict(payload["model"])
            self.optimizer.load_state_dict(payload["optimizer"])
            self.scheduler.load_state_dict(payload["scheduler"])
            set_rng_state(payload["rng"])
            self.step = int(payload["step"])
        except (KeyError, RuntimeError, ValueError) as e:
            raise CheckpointError(f"cannot resume from {path}: {e}") from None


def _token_logprobs(
    policy: Any, model: Any, mb: RolloutBatch, with_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropies) of ``mb``'s policy tokens under ``model`` at the policy's temperature."""
    from ..llm import token_logprobs

    return token_logprobs(
        model,
        mb.tokens,
        mb.attention_mask,
        vocab_size=policy.vocab_size,
        temperature=policy.temperature,
        with_entropy=with_entropy,
        score_mask=mb.loss_mask,
    )


def train_grpo(config: GRPOConfig) -> dict[str, float]:
    """Builds a :class:`GRPOTrainer` and trains it; returns the last step's metrics."""
    return GRPOTrainer(config).train()
