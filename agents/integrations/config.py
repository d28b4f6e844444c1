"""Configuration of ``searchgym train trl``: one dataclass, the same field style as ``train grpo``.

Torch-free, so that ``searchgym --help`` stays fast. How the fields map onto TRL's ``GRPOConfig`` is in
:func:`searchgym.agents.integrations.trl.trl_args` and ``docs/scale.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from searchgym.agents.grpo.config import CommonConfig, GroupedLLDS, option
from searchgym.errors import ConfigError

__all__ = ["TRL_LOSS_TYPES", "TRLConfig"]

TRL_LOSS_TYPES: tuple[str, ...] = ("dapo", "bnpo", "grpo", "dr_grpo")
"""TRL loss aggregations offered (PPO-clipped ones); ``dapo`` is the token mean over the whole update."""


@dataclass
class TRLConfig(GroupedLLDS, CommonConfig):
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

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_groups_and_llds()
        for name in ("steps", "num_iterations", "warning_window"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.loss_type not in TRL_LOSS_TYPES:
            raise ConfigError(f"unknown loss_type {self.loss_type!r}; choose one of {list(TRL_LOSS_TYPES)}")

    @property
    def updates_per_rollout(self) -> int:
        """Optimizer updates per rollout batch: ``num_iterations * batch_size / minibatch_size``."""
        return self.num_iterations * (self.batch_size // self.minibatch_responses)
