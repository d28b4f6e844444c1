"""The GRPO (+LLDS) trainer: rollout → reward → advantage → mini-batch updates → log, one step at a time.

One *step* is one rollout batch: ``questions_per_step`` questions, ``group_size`` responses each, played
through :class:`SearchQAVectorEnv` turn by turn. The batch is then used for ``epochs`` passes of
mini-batch updates (by default one pass, mini-batches of whole groups: :func:`minibatch_plan`), all against
the same ``pi_old`` (the policy that generated it): that is where LLDS acts, since on the first update
``pi_theta == pi_old`` and the term is exactly zero. After the updates the step measures what they did to
the likelihood of its own responses (LLD, split by advantage sign), of fixed probe sets (oracle
transcripts, and the initial policy's own correct samples on training and held-out questions), and of the
cross-step ledger of past successes (:mod:`.ledger`).

Every numeric step is a pure function of :mod:`searchgym.agents.grpo.losses`; this module only moves
tensors between them, the model and the environment. Metrics are gathered into one dict per step and
written in one place (:class:`MetricLogger`), under slash namespaces: ``rollout/``, ``lld/``, ``train/``,
``eval/``, ``time/``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from searchgym.envs.vector import SearchQAVectorEnv
from searchgym.run_lock import lock_run_dir

from ..llm import DEFAULT_SCORING, ScoringOptions
from ..llm.precision import resolve_precision
from ..training.clock import PhaseClock
from ..training.metrics import MetricLogger, read_metrics
from ..training.policy import config_policy
from ..training.rollout import (
    RolloutBatch,
    collect_rollouts,
    evaluate_greedy,
)
from ..training.run import (
    CHECKPOINT,
    append_eval_episodes,
    make_optimizer,
    prepare_run_dir,
    resume_init,
    write_run_record,
)
from .advantages import compute_advantages
from .batching import (
    call_overhead_tokens,
    filter_groups,
    informative_groups,
    length_buckets,
    minibatch_plan,
    step_seed,
)
from .checkpointing import restore_grpo_checkpoint, save_grpo_checkpoint
from .config import DIAGNOSTIC_GATE, GRPOConfig
from .diagnostics import lld_warning
from .displacement import displacement_by_advantage, ledger_displacement, probe_metrics
from .greedy import GreedyPlayer
from .ledger import Ledger, ledger_llds_backward
from .loss_term import LossTermInputs, apply_loss_term, load_loss_term
from .losses import (
    grpo_llds_loss,
    llds_loss,
    masked_mean,
)
from .mismatch import Sampler, correct_for_sampler
from .noise import MicroGradients
from .pi_old import pi_old_logprobs
from .probes import onpolicy_probe_note, onpolicy_probes, oracle_probe
from .spans import llds_ma_weights, probe_masks
from .step_metrics import add_micro_metrics, collapse_metrics, rollout_metrics, update_summary

__all__ = ["GRPOTrainer", "length_buckets", "minibatch_plan", "train_grpo"]


class _Fixed(NamedTuple):
    """What a step's updates read and none changes (:meth:`GRPOTrainer._before_updates`)."""

    logp_old: Tensor  # pi_old's log-probs, (B, T)
    gap: Tensor  # |pi_old - sampler| on the policy tokens pi_old was scored on
    ref_logp: Tensor | None  # the reference's log-probs (None without KL)
    weights: Tensor | None  # LLDS-MA's per-token weights (None without --llds-ma)
    beta: float | None  # LLDS-MA's answer weight
    is_weights: Tensor | None  # the rollout correction's token weights (None unless tis)
    keep: Tensor  # (B,) the responses the updates train on (all but those mis drops)
    metrics: dict[str, float]  # what the step measured of pi_old: collapse/ and mismatch/ metrics


class GRPOTrainer:
    """Owns the policy, its frozen reference, the optimizer, the probe set and the envs of one GRPO run.

    Args:
        config: The run's configuration (validated on construction).
        scoring: How the policy's log-probabilities are computed, in the rollouts, the updates and every
            gradient-free scoring pass (held by the policy: ``trainer.policy.scoring``); its
            ``autocast_bf16`` is set from ``config.model.precision`` (the probes are scored without it) and its
            ``group_prefixes`` from ``config.batch.shared_prefix``.

    Raises:
        CheckpointError: ``config.run.resume`` is set and ``RUN_DIR/checkpoint.pt`` is missing or corrupted, or
            the init checkpoint the run started from (the reference model) is gone or changed.
    """

    def __init__(self, config: GRPOConfig, *, scoring: ScoringOptions = DEFAULT_SCORING) -> None:
        # One writer per run folder, for the trainer's life: a second run into it is refused at once.
        self.run_lock = lock_run_dir(config.run.run_dir)
        if config.run.resume:
            config = resume_init(config)
        self.config = cfg = config
        run, batch = cfg.run, cfg.batch
        # --loss-term: the user's module, imported before any file is written
        self.loss_term = load_loss_term(cfg.loss.loss_term) if cfg.loss.loss_term else None
        prepare_run_dir(run.run_dir, run.resume, run.overwrite)  # never silently replaces an earlier run
        if run.threads:
            torch.set_num_threads(run.threads)
        torch.manual_seed(run.seed)
        self.run_dir, self.device = Path(run.run_dir), run.device
        # bf16-autocast where the machine has it; else one line says so, and the run is fp32
        bf16 = resolve_precision(cfg.model.precision, run.device) == "bf16-autocast"
        self.policy, self.arch = config_policy(
            cfg,
            temperature=cfg.loss.temperature,
            scoring=dataclasses.replace(scoring, autocast_bf16=bf16, group_prefixes=batch.shared_prefix),
        )
        self.model, tok = self.policy.model, self.policy.tokenizer
        # The mismatch dial: a separate sampler plays the rollouts (None: the learner samples its own).
        self.sampler = Sampler(self.policy, cfg.sampler, run.seed) if cfg.sampler.dial_on else None
        # The reference is the initial policy; skipped entirely (no copy, no forward) when kl_coef == 0.
        self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False) if cfg.loss.kl_coef else None
        # As in verl, the learning rate changes once per rollout step (all of a step's updates share it).
        self.optimizer, self.scheduler = make_optimizer(self.model, cfg.optim, total_updates=batch.steps)
        self.env = SearchQAVectorEnv(batch.batch_size, cfg.env, autoreset_mode="Disabled", tokenizer=tok)
        self.greedy = GreedyPlayer(self.policy, cfg.env, batch.group_size)
        # The fixed oracle probe set (its action-kind masks in probe_masks), and the on-policy probes.
        self.probe = oracle_probe(cfg.probes, cfg.env, tok)
        if self.probe is not None:
            self.probe_masks = probe_masks(self.probe.tokens, self.probe.sources, tok.token_bytes)
        # Sampled now, from the initial weights (a resumed run rebuilds the same sets before restoring).
        if (note := onpolicy_probe_note(cfg.probes, batch.steps * batch.batch_size)) is not None:
            print(note, file=sys.stderr)
        self.onpolicy_probes, self.warmstart = onpolicy_probes(
            cfg.probes, cfg.env, self.policy, progress=run.progress
        )
        size = cfg.probes.ledger_size
        self.ledger = Ledger(size, tok.pad_token_id) if size else None
        self.logp_after: Tensor | None = None  # the last step's responses after all of its updates
        self.step = 0
        if run.resume:
            self._restore(self.run_dir / CHECKPOINT)
        else:
            write_run_record(self.run_dir, cfg)
        self.logger = MetricLogger(self.run_dir, resume_step=self.step if run.resume else None, config=cfg)
        # The logged history feeds the early-warning rule; a resumed run reads back what it had logged.
        self.history: list[dict[str, Any]] = read_metrics(self.run_dir) if run.resume else []
        self.update_metrics: list[dict[str, float]] = []  # per optimizer update of the last step (tests)
        self.clock = PhaseClock()  # the update's phases (time/pi_old_s, time/forward_s …)

    # -- the loop --------------------------------------------------------------------------------------

    def train(self) -> dict[str, float]:
        """Runs from the current step to ``config.batch.steps``; returns the last step's metrics."""
        cfg = self.config
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.batch.steps, initial=self.step, desc="grpo", disable=not cfg.run.progress)
        metrics: dict[str, float] = {}
        if self.step == 0:  # the initial policy, as step 0: probes always, evaluation when asked
            start = self.probe_metrics() | {f"warmstart/{k}": v for k, v in self.warmstart.items()}
            if cfg.eval.questions and (cfg.eval.at_start or cfg.eval.every):
                start |= self.evaluate()
            self._log(0, start)
        try:
            while self.step < cfg.batch.steps:
                metrics = self.train_step()
                bar.update(1)
                bar.set_postfix(
                    reward=f"{metrics['rollout/reward']:.2f}", grad=f"{metrics['train/grad_norm']:.2f}"
                )
        finally:
            bar.close()
            self.logger.close()
            self.env.close()
            self.greedy.close()
        return metrics

    def train_step(self) -> dict[str, float]:
        """One step: rollout → reward → advantage → updates, then the probes, the ledger and the evaluation
        when they are due; logs the step (and saves when due) and returns its metrics."""
        cfg = self.config
        self.step += 1
        t0 = time.perf_counter()
        # rollout (and reward: the env scores each finished episode)
        batch, sampling = self.sample_step()
        t1 = time.perf_counter()
        # the self-critical baseline: greedy play on the batch's questions (--advantage greedy)
        greedy = self.greedy_play(batch).rewards if cfg.loss.advantage == "greedy" else None
        t_greedy = time.perf_counter()
        advantages = compute_advantages(
            batch.rewards, cfg.batch.group_size, cfg.loss.advantage, greedy_rewards=greedy
        )
        metrics = rollout_metrics(batch, advantages, cfg.batch.group_size, greedy) | sampling
        metrics |= self.update(batch, advantages)  # loss, optimizer updates, displacement
        t2 = time.perf_counter()
        if self.step in (1, cfg.batch.steps) or self.step % cfg.probes.probe_every == 0:
            metrics |= self.probe_metrics()
        t3 = time.perf_counter()
        metrics |= self.ledger_metrics(batch)  # cross-step displacement, then this step's successes
        t4 = time.perf_counter()
        if cfg.eval.questions and (
            self.step == cfg.batch.steps or (cfg.eval.every and self.step % cfg.eval.every == 0)
        ):
            metrics |= self.evaluate()
            metrics["time/eval_s"] = time.perf_counter() - t4
        if greedy is not None:
            metrics["time/greedy_s"] = t_greedy - t1
        metrics |= {
            "time/rollout_s": t1 - t0,
            "time/update_s": t2 - t_greedy,
            "time/probe_s": t3 - t2,
            "time/ledger_s": t4 - t3,
            "time/step_s": time.perf_counter() - t0,
        }
        metrics |= self.clock.take()
        self._log(self.step, metrics)  # log: the one place metrics are recorded
        if self.step == cfg.batch.steps or (cfg.run.save_every and self.step % cfg.run.save_every == 0):
            self.save()
        return metrics

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        """Adds the early-warning flag (a function of the logged history) and records the step."""
        if step > 0:
            self.history.append({"step": step, **metrics})
            metrics["lld/warning"] = float(lld_warning(self.history, self.config.probes.warning_window))
        self.logger.log(step, metrics)

    # -- rollout ---------------------------------------------------------------------------------------

    def _draw(self, draw: int = 0) -> RolloutBatch:
        """One batch of groups, sampled by the current policy; the questions and the sampling are seeded by
        ``(seed, step, draw)``, so a resumed run draws what the uninterrupted run would have drawn, and the
        first draw of a step is the same in every arm of a seed (the frozen control's included)."""
        seed = step_seed(self.config.run.seed, self.step, 500 + draw if draw else None)
        policy = self.policy
        if self.sampler is not None:
            self.sampler.sync()
            policy = self.sampler.policy
        policy.reset({}, seed=seed)
        return collect_rollouts(self.env, policy, seed=seed, group_size=self.config.batch.group_size)

    def rollout(self) -> RolloutBatch:
        """The step's rollout batch (:meth:`sample_step` without its metrics)."""
        return self.sample_step()[0]

    def sample_step(self) -> tuple[RolloutBatch, dict[str, float]]:
        """The step's rollout batch and its sampling metrics.

        ``rollout/sampled_reward`` is the first draw's mean reward: the same questions and seeds in every
        arm of a seed. With ``filter_groups`` (DAPO's dynamic sampling), further draws follow until
        ``questions_per_step`` groups have unequal rewards, at most ``max_gen_batches`` draws; a step still
        short is topped up with the first draw's uninformative groups (the batch keeps its shape, so the
        mini-batch plan holds). ``rollout/informative_frac`` is the share of the trained groups that are
        informative, ``rollout/gen_batches`` the draws made.
        """
        sizes = self.config.batch
        first = self._draw()
        batch, draws = first, 1
        if sizes.filter_groups:
            pad = self.policy.tokenizer.pad_token_id
            g, n = sizes.group_size, sizes.questions_per_step
            batch, draws = filter_groups(first, self._draw, g, n, sizes.max_gen_batches, pad)
        return batch, {
            "rollout/sampled_reward": float(first.rewards.mean()),
            "rollout/informative_frac": len(informative_groups(batch.rewards, sizes.group_size))
            / sizes.questions_per_step,
            "rollout/gen_batches": float(draws),
        }

    def greedy_play(self, batch: RolloutBatch) -> RolloutBatch:
        """The current policy's greedy episodes on ``batch``'s questions, one per group, in group order
        (:class:`.greedy.GreedyPlayer`): their rewards are the self-critical baseline of ``--advantage greedy``."""
        return self.greedy.play(batch, step_seed(self.config.run.seed, self.step))

    # -- updates ---------------------------------------------------------------------------------------

    def _llds_weights(self, batch: RolloutBatch) -> tuple[Tensor | None, float | None]:
        """LLDS-MA's per-token weights (``None`` without ``--llds-ma``) and the answer weight beta."""
        cfg = self.config
        if not cfg.llds.ma:
            return None, None
        searches = float(np.mean([i["searches"] for i in batch.infos]))
        return llds_ma_weights(
            batch.tokens,
            batch.sources,
            self.policy.tokenizer.token_bytes,
            searches,
            cfg.llds.ma_beta,
            cfg.llds.ma_schedule,
        )

    def _micro(self, minibatches: list[Tensor], lengths: Tensor | None = None) -> list[list[Tensor]]:
        """Each mini-batch split into micro-batches (gradient accumulation).

        With ``lengths`` (and ``length_buckets``, on by default), a mini-batch's responses are sorted by
        length and cut into runs of similar lengths (:func:`length_buckets`), at most ``micro_batch_size``
        each: fewer padding slots to compute, the same gradient (the loss is a token mean over the whole
        mini-batch whatever its micro-batches). Without, consecutive chunks of the plan's order.
        """
        micro = self.config.batch.micro_batch_size or self.config.batch.minibatch_responses
        if lengths is None or not self.config.batch.length_buckets:
            return [[mb[j : j + micro] for j in range(0, len(mb), micro)] for mb in minibatches]
        overhead = call_overhead_tokens(self.device)
        return [length_buckets(mb, lengths, micro, overhead) for mb in minibatches]

    def _score(
        self,
        model: Any,
        batch: RolloutBatch,
        micro_batches: list[Tensor],
        scoring: ScoringOptions | None = None,
    ) -> Tensor:
        """``(B, T)`` log-probs of the batch's policy tokens under ``model``, micro-batch by micro-batch, with
        ``scoring`` (default: the policy's).

        Runs under :data:`torch.inference_mode` (no autograd bookkeeping at all; the policy's
        :class:`ScoringOptions` may ask for ``torch.no_grad`` instead); the result is an ordinary tensor, so
        it can enter the loss as a constant.
        """
        out = torch.zeros(batch.logp_old.shape, dtype=torch.float32)
        with self.policy.scoring.no_grad():
            for idx in micro_batches:
                mb = batch.select(idx).to(self.device)
                logp, _ = self.policy.token_logprobs(
                    mb.tokens, mb.attention_mask, score_mask=mb.loss_mask, model=model, scoring=scoring
                )
                out[idx, : logp.shape[1]] = logp.float().cpu()
        return out

    def update(self, batch: RolloutBatch, advantages: Tensor) -> dict[str, float]:
        """``epochs`` × mini-batch optimizer updates on one rollout batch, all against the same ``pi_old``;
        then the step's measurements, the displacement the updates caused on the batch's own responses
        among them.

        ``pi_old`` is the policy that generated the batch; its log-probs are a plain tensor, fixed before the
        first update by :meth:`_pi_old`'s rule. The reference is scored in length-sorted micro-batches over
        the whole batch.
        """
        plan, first_epoch = self._plan(batch)
        model_mode = self.model.training
        self.model.eval()  # dropout off: pi_old and pi_theta must be the same function of the parameters
        fixed = self._before_updates(batch, plan, first_epoch)
        self.update_metrics = []
        if not bool(fixed.keep.all()):  # --rollout-correction mis: the dropped responses leave every update
            plan = [
                kept for mb in plan if (kept := [idx[fixed.keep[idx]] for idx in mb if fixed.keep[idx].any()])
            ]
        for n, micro_batches in enumerate(plan):  # one optimizer update per mini-batch
            self.update_metrics.append(
                self._update_minibatch(batch, micro_batches, advantages, fixed, self._ledger_rows(n))
            )
            if self.sampler is not None:
                self.sampler.record()
        metrics = self._after_updates(batch, advantages, fixed, first_epoch)
        self.model.train(model_mode)
        return metrics

    def _before_updates(
        self, batch: RolloutBatch, plan: list[list[Tensor]], first_epoch: list[Tensor]
    ) -> _Fixed:
        """What every update of the step reads and none changes: ``pi_old``, the reference's log-probs,
        LLDS-MA's weights."""
        with self.clock("pi_old"):
            logp_old, gap = self._pi_old(batch, plan, first_epoch)
        with self.clock("reference"):
            ref_logp = self._reference_logprobs(batch, first_epoch)
        weights, beta = self._llds_weights(batch)
        tok = self.policy.tokenizer
        metrics = collapse_metrics(batch, logp_old, tok.token_bytes, tok.eos_token_id)
        is_weights, keep, gap_metrics = correct_for_sampler(batch, logp_old, self.config.sampler)
        metrics |= {f"mismatch/{k}": v for k, v in gap_metrics.items()}
        return _Fixed(logp_old, gap, ref_logp, weights, beta, is_weights, keep, metrics)

    def _after_updates(
        self, batch: RolloutBatch, advantages: Tensor, fixed: _Fixed, first_epoch: list[Tensor]
    ) -> dict[str, float]:
        """The step's ``train/`` metrics, the schedule's step, and the LLD its updates caused."""
        rate = float(self.scheduler.get_last_lr()[0])  # the rate this step's updates ran at
        if not self.config.frozen:  # the frozen control's rate is 0 throughout, it never steps the optimizer
            self.scheduler.step()
        metrics = update_summary(self.update_metrics, rate, fixed.gap, fixed.beta, self.config.probes.log_gns)
        metrics |= fixed.metrics
        with self.clock("displacement"):
            metrics |= self.displacement(batch, advantages, fixed.logp_old, first_epoch)
        return metrics

    def _plan(self, batch: RolloutBatch) -> tuple[list[list[Tensor]], list[Tensor]]:
        """The step's mini-batches (``epochs`` passes, each mini-batch cut into micro-batches, seeded by the
        step), and the first epoch's micro-batches (every response once)."""
        sizes = self.config.batch
        generator = torch.Generator().manual_seed(step_seed(self.config.run.seed, self.step))
        order = minibatch_plan(
            len(batch),
            sizes.group_size,
            sizes.minibatch_responses,
            sizes.epochs,
            sizes.minibatch_plan,
            generator,
        )
        plan = self._micro(order, batch.attention_mask.sum(dim=1))
        return plan, [idx for mb in plan[: len(plan) // sizes.epochs] for idx in mb]

    def _pi_old(
        self, batch: RolloutBatch, plan: list[list[Tensor]], first_epoch: list[Tensor]
    ) -> tuple[Tensor, Tensor]:
        """``pi_old``'s log-probs and their gap to the sampler's (:func:`.pi_old.pi_old_logprobs`); with the
        mismatch dial or a correction the sampler is another policy, so every response is re-scored."""
        rule = True if self.config.sampler.active else self.config.loss.rescore_pi_old
        return pi_old_logprobs(
            batch, plan, first_epoch, rule, lambda rows: self._score(self.model, batch, rows)
        )

    def _reference_logprobs(self, batch: RolloutBatch, first_epoch: list[Tensor]) -> Tensor | None:
        """The reference model's log-probs of the batch (``None`` without a KL term)."""
        if self.ref_model is None:
            return None
        if self.config.batch.length_buckets:
            layout = self._micro([torch.arange(len(batch))], batch.attention_mask.sum(dim=1))[0]
        else:
            layout = first_epoch
        return self._score(self.ref_model, batch, layout)

    def _ledger_rows(self, update: int) -> Tensor | None:
        """The ledger responses ledger-LLDS regularises in this step's ``update``-th update (seeded by
        ``(seed, step, update)``); ``None`` when ledger-LLDS is off or the ledger is empty."""
        cfg = self.config
        if not (cfg.llds.ledger and cfg.llds.ledger_lambda and self.ledger is not None and len(self.ledger)):
            return None
        generator = torch.Generator().manual_seed(step_seed(cfg.run.seed, self.step, update))
        return torch.randperm(len(self.ledger), generator=generator)[: cfg.ledger_responses]

    def _update_minibatch(
        self,
        batch: RolloutBatch,
        micro_batches: list[Tensor],
        advantages: Tensor,
        fixed: _Fixed,
        ledger_rows: Tensor | None = None,
    ) -> dict[str, float]:
        """One optimizer update (gradients accumulated over micro-batches); skipped if anything is not finite.

        With ``ledger_rows``, the ledger-LLDS term of those ledger responses joins the gradient. With
        ``skip_zero_signal``, an update whose gradient is exactly zero makes no optimizer step (Adam's
        moments and the weight decay stay as they were); ``zero_signal`` says whether it was zero.
        """
        cfg = self.config
        rows = torch.cat(micro_batches)
        num_tokens = float(batch.loss_mask[rows].sum().clamp(min=1))
        # SAPO's token mean runs over the mini-batch's A >= 0 responses
        positive = (advantages[rows] >= 0)[:, None] & batch.loss_mask[rows].bool()
        sapo_tokens = float(positive.sum().clamp(min=1))
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        finite = True
        params = [p for p in self.model.parameters() if p.requires_grad]
        noise = (
            MicroGradients(params, cfg.batch.group_size) if cfg.probes.log_gns and not cfg.frozen else None
        )
        for idx in micro_batches:
            mb = batch.select(idx).to(self.device)
            width = mb.tokens.shape[1]
            ref_logp, weights = fixed.ref_logp, fixed.weights
            # The frozen control computes the loss (its metrics) but no gradient.
            with torch.set_grad_enabled(not cfg.frozen), self.clock("forward"):
                loss, m = self.loss(
                    mb,
                    advantages[idx].to(self.device),
                    fixed.logp_old[idx, :width].to(self.device),
                    None if ref_logp is None else ref_logp[idx, :width].to(self.device),
                    None if weights is None else weights[idx, :width].to(self.device),
                    num_tokens,
                    sapo_tokens=sapo_tokens,
                    is_weights=None
                    if fixed.is_weights is None
                    else fixed.is_weights[idx, :width].to(self.device),
                )
            finite = finite and bool(torch.isfinite(loss))
            if finite and not cfg.frozen:
                with self.clock("backward"):
                    loss.backward()
                if noise is not None:
                    noise.add(len(idx), float(mb.loss_mask.sum()) / num_tokens)
            add_micro_metrics(sums, m, float(mb.loss_mask.sum()) / num_tokens)
        if ledger_rows is not None and finite and not cfg.frozen:
            with self.clock("ledger_llds"):
                ledger_loss, m = self._ledger_term(ledger_rows)
            finite = bool(torch.isfinite(ledger_loss))
            sums.update(m)
        with self.clock("optimizer"):
            if cfg.frozen:  # no gradient and no optimizer step: the weights and Adam's state never change
                grad_norm = torch.zeros(())
            else:
                grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.max_grad_norm or math.inf)
            finite = finite and bool(torch.isfinite(grad_norm))
            zero = finite and float(grad_norm) == 0.0  # no term of the loss moves any weight
            if finite and not cfg.frozen and not (zero and cfg.loss.skip_zero_signal):
                self.optimizer.step()
            else:  # a NaN/Inf loss or gradient, or a skipped zero-signal update: the weights and moments stay
                self.optimizer.zero_grad(set_to_none=True)
        gns = noise.sizes() if noise is not None else {}
        return {
            **sums,
            **gns,
            "grad_norm": float(grad_norm),
            "skipped": float(not finite),
            "zero_signal": float(zero),
        }

    def _ledger_term(self, rows: Tensor) -> tuple[Tensor, dict[str, float]]:
        """Backpropagates ledger-LLDS over the ledger responses ``rows`` (:func:`.ledger.ledger_llds_backward`),
        in length-bucketed micro-batches."""
        assert self.ledger is not None
        ledger, anchor = self.ledger.batch()
        micro = self._micro([rows], ledger.attention_mask.sum(dim=1))[0]
        return ledger_llds_backward(self.policy, ledger, anchor, micro, self.config.llds, self.device)

    def loss(
        self,
        mb: RolloutBatch,
        advantages: Tensor,
        logp_old: Tensor | None,
        ref_logp: Tensor | None,
        weights: Tensor | None,
        num_tokens: float | None = None,
        *,
        sapo_tokens: float | None = None,
        is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        """The GRPO(+LLDS) loss of one micro-batch; the policy's output layer runs on policy tokens only, so
        prompt and tool positions get no gradient at all.

        ``logp_old=None`` takes this forward's own log-probs as ``pi_old`` (an on-policy loss: the gradient
        noise measurement's). ``num_tokens`` and
        ``sapo_tokens`` are the whole mini-batch's token counts (all policy tokens; those of ``A >= 0``
        responses) when a mini-batch is split into micro-batches. ``is_weights`` are the rollout correction's
        token weights of the policy-gradient term.
        """
        cfg = self.config
        mask = mb.loss_mask
        logp, entropy = self.policy.token_logprobs(
            mb.tokens, mb.attention_mask, score_mask=mb.loss_mask, with_entropy=True
        )
        assert entropy is not None
        if logp_old is None:
            logp_old = logp.detach()
        loss, metrics = grpo_llds_loss(
            logp,
            logp_old,
            advantages,
            mask,
            cfg.loss,
            cfg.llds,
            llds_weights=weights,
            ref_logp=ref_logp,
            entropy=entropy if cfg.loss.entropy_coef else None,
            num_tokens=num_tokens,
            sapo_tokens=sapo_tokens,
            is_weights=is_weights,
        )
        if self.loss_term is not None:  # --loss-term, weighted by the micro-batch's share of the tokens
            inputs = LossTermInputs.of(mb, logp, logp_old, advantages, entropy, ref_logp, self.step)
            share = float(mask.sum()) / num_tokens if num_tokens else 1.0
            term, term_metrics = apply_loss_term(
                self.loss_term, inputs, cfg.loss.loss_term_coef, share, str(cfg.loss.loss_term)
            )
            loss = loss + term
            metrics["loss"] += float(term.detach())
            metrics |= term_metrics
        with torch.no_grad():
            if not cfg.llds.enabled:  # vanilla GRPO still reports what LLDS would measure
                metrics |= llds_loss(logp, logp_old, advantages, mask, DIAGNOSTIC_GATE, None, num_tokens)[1]
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
    def displacement(
        self, batch: RolloutBatch, advantages: Tensor, logp_before: Tensor, micro_batches: list[Tensor]
    ) -> dict[str, float]:
        """LLD on the step's own responses: ``lld/delta_adv_{pos,zero,neg}``, after minus before its updates.

        ``logp_before`` is ``pi_old`` as the updates used it; the same responses are scored again now, with
        the first epoch's micro-batch shapes. An update-free step so measures exactly 0 where ``pi_old`` was
        re-scored or came from the first update's own forward, and float noise (~1e-8) where it is the
        sampler's (``rescore_pi_old``).
        """
        self.model.eval()
        after = self._score(self.model, batch, micro_batches)
        self.logp_after = after  # the anchors of the step's successes (ledger_metrics)
        out = displacement_by_advantage(logp_before, after, advantages, batch.loss_mask)
        return {f"lld/{k}": v for k, v in out.items()}

    @torch.no_grad()
    def ledger_metrics(self, batch: RolloutBatch) -> dict[str, float]:
        """Cross-step LLD: the ledger of earlier successes re-scored now against its anchors
        (``lld/ledger_delta``, ``lld/ledger_frac_displaced``, ``lld/ledger_size``: the responses measured);
        then this step's positively rewarded responses join it, anchored at their log-likelihood after all
        of this step's updates (``lld/ledger_added``)."""
        if self.ledger is None:
            return {}
        mode = self.model.training
        self.model.eval()
        if len(self.ledger):
            ledger, anchor = self.ledger.batch()
            out = ledger_displacement(self._score_all(ledger), anchor, ledger.loss_mask)
        else:
            out = {"ledger_delta": float("nan"), "ledger_frac_displaced": float("nan"), "ledger_size": 0.0}
        self.model.train(mode)
        assert self.logp_after is not None, "ledger_metrics runs after update()"
        out["ledger_added"] = float(self.ledger.add(batch, self.logp_after, self.step))
        return {f"lld/{k}": v for k, v in out.items()}

    def _score_all(self, batch: RolloutBatch, scoring: ScoringOptions | None = None) -> Tensor:
        """``(B, T)`` log-probs of every response of ``batch`` under the current model, no grad, in
        length-bucketed micro-batches (the shapes of the update passes)."""
        micro = self._micro([torch.arange(len(batch))], batch.attention_mask.sum(dim=1))[0]
        return self._score(self.model, batch, micro, scoring)

    @torch.no_grad()
    def probe_metrics(self) -> dict[str, float]:
        """Mean per-token log-likelihood of the probe set, overall and per action kind (``lld/probe_logp*``).

        Scored with float32 matrix products whatever ``precision`` the run trains at, so the probe curves of
        runs at different precisions compare."""
        mode = self.model.training
        self.model.eval()
        out: dict[str, float] = {}
        fp32 = dataclasses.replace(self.policy.scoring, autocast_bf16=False)
        if self.probe is not None:
            out |= probe_metrics(self._score_all(self.probe, fp32), self.probe_masks)
        for name, probe in self.onpolicy_probes.items():
            value = (
                float(masked_mean(self._score_all(probe, fp32), probe.loss_mask)) if len(probe) else math.nan
            )
            out[f"probe_onpolicy_{name}"] = value
        self.model.train(mode)
        return {f"lld/{k}": v for k, v in out.items()}

    def evaluate(self) -> dict[str, float]:
        """Greedy play on the first ``eval_questions`` questions of the eval split, as ``eval/`` metrics; each
        question's outcome is appended to ``RUN_DIR/eval_episodes.jsonl`` (step, question id, EM, F1, the
        reward, searches, answered), so two evaluations can be compared question by question."""
        episodes: list[dict[str, Any]] = []
        cfg, tok = self.config, self.policy.tokenizer
        result = evaluate_greedy(self.model, tok, cfg.env, cfg.eval, episodes, progress=cfg.run.progress)
        append_eval_episodes(self.run_dir, self.step, episodes, cfg.env.reward)
        return {f"eval/{k}": v for k, v in result.items()}

    # -- checkpoints -------------------------------------------------------------------------------------

    def save(self) -> Path:
        """Writes ``RUN_DIR/checkpoint.pt`` atomically: model, optimizer, scheduler, RNG states, step."""
        return save_grpo_checkpoint(
            self.run_dir / CHECKPOINT,
            step=self.step,
            model=self.model,
            arch=self.arch,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            config=self.config,
            ledger=self.ledger,
            sampler=None if self.sampler is None else self.sampler.state(),
        )

    def _restore(self, path: Path) -> None:
        self.step = restore_grpo_checkpoint(
            path, self.config, self.model, self.optimizer, self.scheduler, self.ledger, self.sampler
        )


def train_grpo(config: GRPOConfig) -> dict[str, float]:
    """Builds a :class:`GRPOTrainer` and trains it; returns the last step's metrics."""
    trainer = GRPOTrainer(config)
    with trainer.run_lock:
        return trainer.train()
