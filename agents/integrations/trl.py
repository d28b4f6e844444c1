"""searchgym inside TRL's ``GRPOTrainer``: token-exact SearchQA rollouts, LLDS, and the LLD early warning.

Three pieces, usable separately (see ``docs/scale.md``):

* :class:`SearchQARollout` — a ``rollout_func`` for ``GRPOTrainer(rollout_func=...)``. It plays each
  prompt (a question id of the env's split) as one SearchQA episode through the native vector env (one
  batched retrieval call per turn), generating each turn with the trainer's own model (searchgym's
  :class:`~searchgym.agents.llm.LLMPolicy`, KV cache, token-exact stops) or with TRL's vLLM backend when
  ``use_vllm`` is on. It returns the ids the policy sampled, their log-probabilities, ``env_mask`` (1 on
  policy tokens, 0 on tool output: TRL multiplies it into the loss mask) and the episodes' rewards, EM, F1
  and searches as extra fields for the reward functions (:func:`episode_reward`, :func:`episode_em`).
* :class:`LLDSGRPOTrainer` — ``GRPOTrainer`` plus the LLDS term of :func:`searchgym.agents.grpo.losses.llds_loss`
  (action, response or token gate; LLDS-MA), computed on the gradient-carrying log-probabilities TRL's loss
  uses, plus the LLD diagnostic ``lld/delta_adv_*`` of each rollout batch. It warns (:class:`LLDSInactiveWarning`)
  when each rollout batch makes a single optimizer update: TRL then uses the detached current
  log-probabilities as ``pi_old`` and LLDS is identically zero.
* :class:`LLDWarningCallback` — a ``TrainerCallback`` that applies
  :func:`searchgym.agents.grpo.diagnostics.lld_warning` to the logged ``lld/delta_adv_pos`` and logs
  ``lld/warning``.

:func:`searchgym.agents.integrations.trl_train.train_trl` wires them together for ``searchgym train trl``.

Verified against TRL 1.16.0 (``trl/trainer/grpo_trainer.py``): ``rollout_func(prompts, trainer)`` gets the
process's prompts as the sampler produced them (each repeated ``num_generations`` times, consecutively) and
must return one completion per prompt; ``env_mask`` becomes ``tool_mask`` only when ``tools`` is not set;
``old_per_token_logps`` is kept only when a rollout batch serves more than one optimizer update. In
``trl/generation/vllm_generation.py``, server mode gathers every process's prompts and hands each process
the slice ``[rank * n, (rank + 1) * n)``, and colocated vLLM with tensor parallelism gathers within its
group the same way: every process must send the same number of prompts on every call (see
:class:`_VLLMTurns`).

For TRL users who prefer tool calls to Search-R1's tags, :class:`~searchgym.agents.integrations.trl_env.SearchQAToolEnv`
(re-exported here) is an ``environment_factory`` environment on the same data, retriever and reward.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

try:
    import torch
    import transformers
    import trl
    from torch import Tensor
except ImportError as e:  # pragma: no cover - depends on the installation
    from searchgym.errors import MissingDependencyError

    raise MissingDependencyError(getattr(e, "name", None) or "trl", "trl", "The TRL integration") from e

from searchgym.agents.grpo.config import LLDSConfig
from searchgym.agents.grpo.diagnostics import lld_warning
from searchgym.agents.grpo.displacement import displacement_by_advantage
from searchgym.agents.grpo.losses import llds_loss
from searchgym.agents.grpo.spans import llds_ma_weights
from searchgym.errors import ConfigError
from searchgym.protocol import Source
from searchgym.tokenization import Tokenizer

from .config import TRLConfig
from .trl_env import SearchQAToolEnv, tool_env_dataset
from .trl_rollout import (
    SearchQARollout,
    episode_em,
    episode_f1,
    episode_reward,
    question_dataset,
)

__all__ = [
    "LLDSGRPOTrainer",
    "LLDSInactiveWarning",
    "LLDWarningCallback",
    "SearchQARollout",
    "SearchQAToolEnv",
    "check_trl_overrides",
    "episode_em",
    "episode_f1",
    "episode_reward",
    "question_dataset",
    "tool_env_dataset",
    "trl_args",
]

_POLICY, _TOOL = int(Source.POLICY), int(Source.TOOL)


# -- LLDS in TRL's loss --------------------------------------------------------------------------------


class LLDSInactiveWarning(UserWarning):
    """LLDS is configured but identically zero: each rollout batch makes a single optimizer update."""


class LLDWarningCallback(transformers.TrainerCallback):
    """Applies the LLD early-warning rule to TRL's logs and logs ``lld/warning``.

    Each log holding ``lld/delta_adv_pos`` (one per rollout batch, from :class:`LLDSGRPOTrainer`) is one
    record of :func:`~searchgym.agents.grpo.diagnostics.lld_warning`'s history. When the rule fires
    (``delta_adv_pos <= 0`` on ``window`` consecutive rollout batches) the log gets ``lld/warning = 1``
    and a Python warning is issued once per streak. Put it before the reporting callbacks (the trainer
    does) so that they record ``lld/warning`` too.

    Args:
        window: Consecutive rollout batches required.

    Attributes:
        history: The records seen, oldest first.
        fired_at: The global steps at which the rule fired.
    """

    def __init__(self, window: int = 3) -> None:
        if window < 1:
            raise ConfigError(f"window must be >= 1, got {window}")
        self.window = window
        self.history: list[dict[str, Any]] = []
        self.fired_at: list[int] = []

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any
    ) -> None:
        if not logs or logs.get("lld/delta_adv_pos") is None:
            return
        self.history.append({"step": state.global_step, "lld/delta_adv_pos": logs["lld/delta_adv_pos"]})
        fired = lld_warning(self.history, self.window)
        logs["lld/warning"] = float(fired)
        if fired:
            new_streak = not self.fired_at or self.fired_at[-1] != self.history[-2]["step"]
            # Every process sees the same (gathered) record; one warning per run, from the main process.
            if new_streak and getattr(state, "is_world_process_zero", True):
                warnings.warn(
                    f"LLD early warning at step {state.global_step}: the log-likelihood of positively "
                    f"rewarded responses did not rise on {self.window} consecutive rollout batches "
                    "(lld/delta_adv_pos <= 0), the precursor of GRPO collapse; consider LLDS (--llds action)",
                    RuntimeWarning,
                    stacklevel=2,
                )
            self.fired_at.append(int(state.global_step))


class LLDSGRPOTrainer(trl.GRPOTrainer):
    """TRL's ``GRPOTrainer`` with the LLDS regulariser and the LLD diagnostics.

    The loss is TRL's (its ``loss_type``, clipping, KL, entropy) plus ``coef * L_LLDS`` where ``L_LLDS`` is
    :func:`~searchgym.agents.grpo.losses.llds_loss` on the same micro-batch: the log-probabilities TRL's loss
    is built on (with their gradients), TRL's ``pi_old`` (``old_per_token_logps``), TRL's per-response
    advantages and its loss mask (completion mask × ``env_mask``). The term is normalised like TRL's own
    policy term: with ``loss_type="dapo"`` by TRL's global token count (``num_items_in_batch`` over the
    processes, rescaled to one accumulation window), so it is exact under data parallelism and gradient
    accumulation; with ``grpo``/``bnpo``/``dr_grpo`` as a token mean over the micro-batch divided by the
    gradient-accumulation steps.

    Metrics (in TRL's logs; searchgym's are gathered over the processes like TRL's own: means of the
    processes' values, counts summed): ``train/llds_loss`` (the update's LLDS term, before lambda),
    ``train/llds_gate_open`` (every update, even with LLDS off), ``train/llds_ma_beta``; ``rollout/em``,
    ``rollout/f1``, ``rollout/searches``, ``rollout/episodes`` (from the :class:`SearchQARollout` fields);
    ``lld/delta_adv_pos`` / ``_zero`` / ``_neg``: each rollout batch's own responses re-scored after that
    batch's updates, minus their ``pi_old`` (:func:`~searchgym.agents.grpo.losses.displacement_by_advantage`),
    logged at the batch's last update (or earlier, at a checkpoint or at the end of training, so no batch's
    record is lost); ``lld/warning`` (:class:`LLDWarningCallback`).

    Args:
        *args: ``GRPOTrainer``'s.
        llds: The LLDS term (default: action gate, lambda 0.2).
        tokenizer: The searchgym tokenizer of the env (needed for LLDS-MA's answer span).
        warning_window: Window of :class:`LLDWarningCallback` (``None``: no callback).
        **kwargs: ``GRPOTrainer``'s.
    """

    def __init__(
        self,
        *args: Any,
        llds: LLDSConfig | None = None,
        tokenizer: Tokenizer | None = None,
        warning_window: int | None = 3,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.llds = llds if llds is not None else LLDSConfig()
        if self.llds.ma and tokenizer is None:
            raise ConfigError("LLDS-MA needs the env's searchgym tokenizer: pass tokenizer=")
        self.sg_tokenizer = tokenizer
        self._capture = False
        self.llds_logp: Tensor | None = None  # the last micro-batch's gradient-carrying log-probs
        self.llds_last: dict[str, float] = {}
        self.lld_recorded = True  # whether the current rollout batch's LLD is logged (none yet)
        if self.llds.enabled and not self.llds_can_act:
            warnings.warn(
                f"LLDS is identically zero here: each rollout batch makes {self.updates_per_rollout:g} "
                "optimizer update, so TRL's pi_old is the current policy. Use --epochs > 1 (TRL's num_iterations), "
                "or a --minibatch-size below the rollout batch (steps_per_generation > gradient_accumulation_steps).",
                LLDSInactiveWarning,
                stacklevel=2,
            )
        if warning_window is not None:
            # First in line: the reporting callbacks then see lld/warning.
            self.callback_handler.callbacks.insert(0, LLDWarningCallback(warning_window))
        # Last in line: after transformers' flow callback has decided whether this step saves or stops.
        self.add_callback(_LLDFlushCallback(self))

    @property
    def updates_per_rollout(self) -> float:
        """Optimizer updates made with each rollout batch."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        return float(generate_every / self.args.gradient_accumulation_steps)

    @property
    def llds_can_act(self) -> bool:
        """Whether ``pi_theta`` can differ from ``pi_old`` (more than one update per rollout batch)."""
        return self.updates_per_rollout > 1

    def _gather_sums(self, values: Sequence[float]) -> list[float]:
        """Element-wise sums of ``values`` over every process (a collective: all processes call it)."""
        # float32: every accelerator has it (MPS has no float64); sums of counts and means stay exact enough.
        local = torch.tensor([float(v) for v in values], dtype=torch.float32, device=self.accelerator.device)
        gathered: Tensor = self.accelerator.gather(local)
        return [float(v) for v in gathered.view(-1, len(values)).sum(dim=0)]

    # -- the rollout batch -------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output: dict[str, Any] = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        if mode == "train":
            self.lld_recorded = False
        # The rollout's extra fields were merged into ``inputs`` by TRL (one value per completion).
        sums: list[float] = []
        for key in ("em", "f1", "searches"):
            values = [float(x[f"searchgym_{key}"]) for x in inputs if f"searchgym_{key}" in x]
            sums += [sum(values), len(values)]
        total = self._gather_sums(sums)
        means = {}
        for k, key in enumerate(("em", "f1", "searches")):
            if total[2 * k + 1]:
                means[key] = total[2 * k] / total[2 * k + 1]
                self._metrics[mode][f"rollout/{key}"].append(means[key])
        if total[1]:
            self._metrics[mode]["rollout/episodes"].append(total[1])
        if self.llds.ma:
            mask = self._loss_mask(output)
            sources = torch.where(mask.bool(), _POLICY, _TOOL)
            assert self.sg_tokenizer is not None
            # The batch's mean searches over every process, so that all processes weight the answer alike.
            output["llds_weights"], beta = llds_ma_weights(
                output["completion_ids"],
                sources,
                self.sg_tokenizer.token_bytes,
                means.get("searches", 0.0),
                self.llds.ma_beta,
                self.llds.ma_schedule,
            )
            self._metrics[mode]["train/llds_ma_beta"].append(beta)
        return output

    @staticmethod
    def _loss_mask(inputs: dict[str, Any]) -> Tensor:
        mask: Tensor = inputs["completion_mask"]
        return mask * inputs["tool_mask"] if "tool_mask" in inputs else mask

    @torch.no_grad()
    def flush_displacement(self) -> None:
        """Logs the LLD of the current rollout batch: its responses re-scored now, against their ``pi_old``.

        Every micro-batch with a ``pi_old`` counts: the one recorded when it was trained on, else TRL's
        ``old_per_token_logps``. The means per advantage sign are over every process's responses.
        """
        self.lld_recorded = True
        local = [0.0] * 6  # (sum of per-response deltas, responses) for A > 0, A = 0, A < 0
        for b in self._buffered_inputs or []:
            before = b.get("llds_logp_before", b.get("old_per_token_logps"))
            if before is None:
                continue
            ids = torch.cat([b["prompt_ids"], b["completion_ids"]], dim=1)
            attention = torch.cat([b["prompt_mask"], b["completion_mask"]], dim=1)
            after, _, _ = self._get_per_token_logps_and_entropies(
                self.model, ids, attention, b["completion_ids"].size(1)
            )
            metrics = displacement_by_advantage(before, after, b["advantages"], self._loss_mask(b))
            for k, name in enumerate(("pos", "zero", "neg")):
                n = metrics[f"n_adv_{name}"]
                if n:
                    local[2 * k] += metrics[f"delta_adv_{name}"] * n
                    local[2 * k + 1] += n
        total = self._gather_sums(local)
        for k, name in enumerate(("pos", "zero", "neg")):
            n = total[2 * k + 1]
            self._metrics["train"][f"lld/delta_adv_{name}"].append(total[2 * k] / n if n else float("nan"))

    # -- the loss ----------------------------------------------------------------------------------------

    def _get_per_token_logps_and_entropies(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        out = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        if self._capture:
            self.llds_logp = out[0]
        return out

    def _llds_tokens(self, inputs: dict[str, Any], mode: str) -> float | None:
        """LLDS's denominator: TRL's own for ``dapo`` (global tokens per accumulation window), else ``None``
        (the micro-batch's tokens)."""
        if self.loss_type != "dapo" or "num_items_in_batch" not in inputs:
            return None
        tokens = float(inputs["num_items_in_batch"]) / self.accelerator.num_processes
        if mode == "train":
            tokens *= self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return max(tokens, 1.0)

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Tensor:
        self._capture = True
        try:
            loss: Tensor = super()._compute_loss(model, inputs)
        finally:
            self._capture = False
        logp = self.llds_logp
        assert logp is not None
        mask = self._loss_mask(inputs)
        old = inputs.get("old_per_token_logps")
        logp_old = logp.detach() if old is None else old
        # pi_old of this micro-batch, kept in the buffered batch for the displacement diagnostic.
        inputs.setdefault("llds_logp_before", logp_old.detach())
        advantages = inputs["advantages"]
        if advantages.dim() != 1:
            raise ConfigError("LLDS needs per-response advantages of shape (B,)")
        mode = "train" if self.model.training else "eval"
        tokens = self._llds_tokens(inputs, mode)
        term, metrics = llds_loss(
            logp,
            logp_old,
            advantages,
            mask,
            self.llds.measured_gate,
            inputs.get("llds_weights"),
            num_tokens=tokens,
        )
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        # A dapo term is already a share of the update; a micro-batch mean is divided like TRL's bnpo.
        trained = term if tokens is not None else term / accumulation
        # Logged: the update's LLDS term (sum of the shares; mean of the micro-batch means), mean over processes.
        per_update = metrics["llds_loss"] * (accumulation if tokens is not None else 1)
        value, gate_open = self._gather_sums([per_update, metrics["llds_gate_open"]])
        processes = self.accelerator.num_processes
        self.llds_last = {"llds_loss": value / processes, "llds_gate_open": gate_open / processes}
        self._metrics[mode]["train/llds_loss"].append(self.llds_last["llds_loss"])
        self._metrics[mode]["train/llds_gate_open"].append(self.llds_last["llds_gate_open"])
        if self.llds.enabled:
            loss = loss + self.llds.coef * trained
        return loss


class _LLDFlushCallback(transformers.TrainerCallback):
    """Records each rollout batch's LLD exactly once, in the log of the step that ends it.

    At the batch's last update; or earlier when this step saves a checkpoint (a run resumed from it starts
    a new rollout batch, so the record would be lost) or ends training (the last batch may be cut short).
    """

    def __init__(self, trainer: LLDSGRPOTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        t = self.trainer
        if t.lld_recorded or t._buffered_inputs is None:
            return
        batch_done = t._step % (args.steps_per_generation * t.num_iterations) == 0
        if batch_done or control.should_save or control.should_training_stop:
            t.flush_displacement()


# -- the command ---------------------------------------------------------------------------------------

# GRPOConfig fields that trl_args derives from searchgym's options: --trl-arg refuses them.
_MANAGED: dict[str, str] = {
    "output_dir": "--run-dir",
    "max_steps": "--updates",
    "per_device_train_batch_size": "--micro-batch-size",
    "gradient_accumulation_steps": "--micro-batch-size and --minibatch-size",
    "steps_per_generation": "--questions-per-step and --minibatch-size",
    "generation_batch_size": "--questions-per-step and --group-size",
    "num_generations": "--group-size",
    "num_iterations": "--epochs",
    "learning_rate": "--lr",
    "weight_decay": "--weight-decay",
    "warmup_steps": "--warmup-steps",
    "lr_scheduler_type": "--lr-schedule",
    "max_grad_norm": "--max-grad-norm",
    "adam_beta1": "--adam-betas",
    "adam_beta2": "--adam-betas",
    "adam_epsilon": "--adam-eps",
    "beta": "--kl-coef",
    "epsilon": "--clip-eps",
    "loss_type": "--loss-type",
    "temperature": "--temperature",
    "entropy_coef": "--entropy-coef",
    "seed": "--seed",
    "save_strategy": "--save-every",
    "save_steps": "--save-every",
    "save_total_limit": "--save-total-limit",
    "use_cpu": "--device",
    "bf16": "--dtype",
    "fp16": "--dtype",
    "disable_tqdm": "--progress / --no-progress",
    "max_completion_length": "--max-turn-tokens",
    "use_vllm": "--use-vllm",
    "vllm_mode": "--vllm-mode",
    "mask_truncated_completions": "the episode's end (an episode ends on </answer>, not EOS)",
}


def check_trl_overrides(overrides: dict[str, Any]) -> None:
    """Checks ``--trl-arg`` keys: fields of TRL's ``GRPOConfig`` that no searchgym option sets.

    Raises:
        ConfigError: a key is not a ``GRPOConfig`` field (with close names), or searchgym sets it (naming
            the option to use instead).
    """
    import difflib

    known = {f.name for f in fields(trl.GRPOConfig)}
    for key in overrides:
        if key in _MANAGED:
            raise ConfigError(f"--trl-arg {key}: searchgym sets it from {_MANAGED[key]}; use that option")
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"--trl-arg {key}: not a field of TRL {trl.__version__}'s GRPOConfig{hint}")


def trl_args(config: TRLConfig, num_processes: int | None = None, **overrides: Any) -> Any:
    """TRL's ``GRPOConfig`` for a :class:`TRLConfig` (``overrides`` win).

    One rollout batch (``questions_per_step * group_size`` responses over all processes) is TRL's generation
    batch; an optimizer update takes ``minibatch_size`` responses over all processes. Each process forwards
    ``micro_batch_size`` of them at a time (``per_device_train_batch_size``) and accumulates
    ``minibatch_size / (processes * micro_batch_size)`` micro-batches per update, so
    ``steps_per_generation = batch / (processes * micro_batch_size)``; ``epochs`` passes (TRL's
    ``num_iterations``).

    Args:
        config: The run's configuration.
        num_processes: Processes taking part (default: ``WORLD_SIZE``, which torchrun and accelerate set).
        **overrides: ``GRPOConfig`` fields that win.
    """
    processes = num_processes if num_processes is not None else int(os.environ.get("WORLD_SIZE", "1"))
    micro, accumulation, per_generation = config.batch.process_batches(processes)
    optim = config.optim
    kwargs: dict[str, Any] = {
        "output_dir": config.run.run_dir,
        "max_steps": config.batch.updates,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": accumulation,
        "steps_per_generation": per_generation,
        "num_generations": config.batch.group_size,
        "num_iterations": config.batch.epochs,
        "learning_rate": optim.lr,
        "weight_decay": optim.weight_decay,
        "warmup_steps": optim.warmup_steps,
        "lr_scheduler_type": "constant_with_warmup" if optim.lr_schedule == "constant" else "linear",
        "max_grad_norm": optim.max_grad_norm if optim.max_grad_norm > 0 else 1e9,
        "adam_beta1": optim.betas[0],
        "adam_beta2": optim.betas[1],
        "adam_epsilon": optim.adam_eps,
        "beta": config.loss.kl_coef,
        "epsilon": config.loss.clip_eps,
        "loss_type": config.loss.loss_type,
        "temperature": config.loss.temperature,
        "entropy_coef": config.loss.entropy_coef,
        "seed": config.run.seed,
        "logging_steps": 1,
        "save_strategy": "steps" if config.run.save_every else "no",
        "report_to": "none",  # metrics.jsonl and --report-to come from searchgym's MetricLogger
        "use_cpu": config.run.device == "cpu",
        "bf16": config.model.dtype == "bfloat16",
        "fp16": config.model.dtype == "float16",
        "disable_tqdm": not config.run.progress,
        "mask_truncated_completions": False,  # an episode ends on </answer>, not EOS: not a truncation
        "max_completion_length": config.env.max_turn_tokens,  # per vLLM call, i.e. per turn
        "use_vllm": config.trl.use_vllm,
        "vllm_mode": config.trl.vllm_mode,
        "dataloader_num_workers": 0,
    }
    if config.run.save_every:
        kwargs["save_steps"] = config.run.save_every
        kwargs["save_total_limit"] = config.run.save_total_limit
    if config.trl.use_vllm:
        kwargs["generation_kwargs"] = {"stop": ["</search>", "</answer>"], "include_stop_str_in_output": True}
    return trl.GRPOConfig(**{**kwargs, **overrides})
