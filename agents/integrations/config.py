"""Configuration of ``searchgym train trl``: one dataclass, the same field style as ``train grpo``.

Torch-free, so that ``searchgym --help`` stays fast. How the fields map onto TRL's ``GRPOConfig`` is in
:func:`searchgym.agents.integrations.trl.trl_args` and ``docs/scale.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from searchgym.agents.grpo.config import LLDS_CHOICES, MA_SCHEDULES, CommonConfig, option
from searchgym.errors import ConfigError

__all__ = ["TRL_LOSS_TYPES", "TRLConfig"]

TRL_LOSS_TYPES: tuple[str, ...] = ("dapo", "bnpo", "grpo", "dr_grpo")
"""TRL loss aggregations offered (PPO-clipped ones); ``dapo`` is the token mean over the whole update."""


@dataclass
class TRLConfig(CommonConfig):
    """GRPO (optionally with LLDS) on SearchQA, trained by TRL's ``GRPOTrainer``.

    One *step* is one optimizer update, as in TRL (``max_steps``). One rollout batch is
    ``questions_per_step`` questions × ``group_size`` responses; it is cut into mini-batches of
    ``minibatch_size`` responses and used for ``num_iterations`` passes, so each rollout batch makes
    ``updates_per_rollout`` optimizer updates. LLDS needs at least two: with one, ``pi_theta == pi_old`` at
    every update and the term is identically zero (the trainer warns).
    """

    run_dir: str = option("runs/trl", "folder for TRL's output, metrics.jsonl and the final model")
    steps: int = option(20, "optimizer updates (TRL's max_steps)")
    questions_per_step: int = option(2, "questions per rollout batch")
    group_size: int = option(4, "responses per question (G, TRL's num_generations)")
    minibatch_size: int | None = option(
        None, "responses per optimizer update (default: one group, G); must divide the rollout batch"
    )
    num_iterations: int = option(1, "passes over each rollout batch (TRL's num_iterations, mu)")
    temperature: float = option(1.0, "sampling temperature of the rollouts")
    loss_type: Literal["dapo", "bnpo", "grpo", "dr_grpo"] = option(
        "dapo", "TRL's loss aggregation (dapo: token mean over the update, as train grpo)"
    )
    clip_eps: float = option(0.2, "PPO clip range (TRL's epsilon)")
    kl_coef: float = option(0.001, "weight of the k3 KL to the initial model (TRL's beta; 0: no reference)")
    entropy_coef: float = option(0.0, "entropy bonus weight (TRL's entropy_coef)")
    weight_decay: float = option(0.01, "AdamW weight decay (reference: 0.01)")
    llds: Literal["none", "token", "response", "action"] = option(
        "action", "LLDS gate, or none for TRL's plain GRPO loss"
    )
    llds_coef: float = option(0.2, "LLDS weight lambda", "--lambda")
    llds_ma: bool = option(False, "LLDS-MA: down-weight the final answer span in LLDS")
    llds_ma_beta: float | None = option(
        None, "LLDS-MA answer weight (default: adaptive, from the rollout batch's mean valid searches)"
    )
    llds_ma_schedule: Literal["paper", "code"] = option(
        "code", "LLDS-MA's adaptive beta: code = clip(V-1, 0, 1), paper = min(V/2, 1)"
    )
    warning_window: int = option(
        3, "early-warning rule: lld/warning is 1 after this many consecutive logs with delta_adv_pos <= 0"
    )
    use_vllm: bool = option(False, "generate each turn with TRL's vLLM backend (GPU; needs vllm installed)")
    vllm_mode: Literal["colocate", "server"] = option("colocate", "TRL's vllm_mode")
    save_model: bool = option(True, "save the final model and tokenizer to RUN_DIR/model (save_pretrained)")
    overwrite: bool = option(False, "replace an existing run in RUN_DIR")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2:
            raise ConfigError(
                f"group_size must be >= 2 (GRPO's advantages compare responses to one question), got {self.group_size}"
            )
        for name in ("steps", "questions_per_step", "num_iterations", "warning_window"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        mb = self.minibatch_responses
        if mb < 1 or self.batch_size % mb:
            raise ConfigError(
                f"minibatch_size {mb} must be >= 1 and divide the rollout batch "
                f"questions_per_step * group_size = {self.batch_size}"
            )
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")
        if not self.clip_eps > 0:
            raise ConfigError(f"clip_eps must be > 0, got {self.clip_eps}")
        if self.loss_type not in TRL_LOSS_TYPES:
            raise ConfigError(f"unknown loss_type {self.loss_type!r}; choose one of {list(TRL_LOSS_TYPES)}")
        if self.llds not in LLDS_CHOICES:
            raise ConfigError(f"unknown llds {self.llds!r}; choose one of {list(LLDS_CHOICES)}")
        if self.llds_ma_schedule not in MA_SCHEDULES:
            raise ConfigError(
                f"unknown llds_ma_schedule {self.llds_ma_schedule!r}; choose one of {list(MA_SCHEDULES)}"
            )
        for name in ("llds_coef", "kl_coef", "entropy_coef"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.llds_ma and self.llds == "none":
            raise ConfigError("llds_ma needs an LLDS gate: pass --llds action (or token, response)")
        if self.llds_ma_beta is not None and not 0 <= self.llds_ma_beta <= 1:
            raise ConfigError(f"llds_ma_beta must be in [0, 1], got {self.llds_ma_beta}")

    @property
    def batch_size(self) -> int:
        """Responses per rollout batch (TRL's generation_batch_size on one process)."""
        return self.questions_per_step * self.group_size

    @property
    def minibatch_responses(self) -> int:
        """Responses per optimizer update (``minibatch_size``, default one group)."""
        return self.minibatch_size if self.minibatch_size is not None else self.group_size

    @property
    def updates_per_rollout(self) -> int:
        """Optimizer updates per rollout batch: ``num_iterations * batch_size / minibatch_size``."""
        return self.num_iterations * (self.batch_size // self.minibatch_responses)

    @property
    def llds_enabled(self) -> bool:
        """Whether the LLDS term is in the loss."""
        return self.llds != "none" and self.llds_coef > 0
