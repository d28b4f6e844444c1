"""Configuration of ``searchgym train trl``: its sections (run, batch, loss, the TRL engine), the same field
style as ``train grpo``.

Torch-free, so that ``searchgym --help`` stays fast. How the fields map onto TRL's ``GRPOConfig`` is in
:func:`searchgym.agents.integrations.trl.trl_args` and ``docs/scale.md``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias, get_args

from searchgym.agents.grpo.config import BatchConfig, GroupedConfig, LossConfig
from searchgym.agents.training.config import OptimConfig, RunConfig
from searchgym.errors import ConfigError
from searchgym.options import NO_LIMIT, check_bounds, check_choices, option, section

__all__ = [
    "TRL_LOSS_TYPES",
    "TRLBatchConfig",
    "TRLConfig",
    "TRLEngineConfig",
    "TRLLossConfig",
    "TRLRunConfig",
    "parse_trl_args",
]

TRLLossType: TypeAlias = Literal["dapo", "bnpo", "grpo", "dr_grpo"]
TRL_LOSS_TYPES: tuple[str, ...] = get_args(TRLLossType)
"""TRL loss aggregations offered (PPO-clipped ones); ``dapo`` is the token mean over the whole update."""


@dataclass(frozen=True)
class TRLRunConfig(RunConfig):
    """The run section of ``train trl``: also what it saves and its resume."""

    run_dir: str = option("runs/trl", "folder for TRL's output, metrics.jsonl and the final model")
    save_model: bool = option(True, "save the final model and tokenizer to RUN_DIR/model (save_pretrained)")
    save_every: int = option(
        0,
        "save a TRL checkpoint (model, optimizer, scheduler, RNG) to RUN_DIR/checkpoint-N every N updates "
        "(0: none)",
        deprecated=("--save-steps",),
        bounds=(0, NO_LIMIT),
    )
    save_total_limit: int | None = option(
        None, "keep only the newest N checkpoints (default: all)", bounds=(1, NO_LIMIT)
    )
    resume: bool = option(False, "continue the run in RUN_DIR from its newest checkpoint-N")

    def __post_init__(self) -> None:
        super().__post_init__()  # its bounds too: save_every, save_total_limit
        if self.resume and self.overwrite:
            raise ConfigError("--resume continues the run in run_dir and --overwrite replaces it: choose one")


@dataclass(frozen=True)
class TRLBatchConfig(BatchConfig):
    """The batches of ``train trl``: ``updates`` optimizer updates as TRL counts them, the rollout batch and
    its mini-batches across all processes, each process's micro-batches."""

    updates: int = option(
        20,
        "optimizer updates to train for (TRL's max_steps; train grpo's --steps counts rollout batches)",
        deprecated=("--steps",),
        bounds=(1, NO_LIMIT),
    )
    questions_per_step: int = option(
        2, "questions per rollout batch, across all processes", bounds=(1, NO_LIMIT)
    )
    group_size: int = option(4, "responses per question (G, TRL's num_generations)")
    minibatch_size: int | None = option(
        None,
        "responses per optimizer update, across all processes (default: one group, G); must divide the "
        "rollout batch, and be a multiple of the number of processes",
    )
    micro_batch_size: int | None = option(
        None,
        "responses per forward pass on each process; gradients accumulate up to the mini-batch (default: "
        "minibatch_size / processes, no accumulation)",
        deprecated=("--micro-batch",),
    )
    epochs: int = option(
        1,
        "passes over each rollout batch (TRL's num_iterations, mu)",
        deprecated=("--num-iterations",),
        bounds=(1, NO_LIMIT),
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # its bounds too: updates, epochs
        if self.micro_batch_size is not None and (
            self.micro_batch_size < 1 or self.minibatch_responses % self.micro_batch_size
        ):
            raise ConfigError(
                f"micro_batch_size {self.micro_batch_size} must be >= 1 and divide minibatch_size "
                f"{self.minibatch_responses}"
            )

    @property
    def updates_per_rollout(self) -> int:
        """Optimizer updates per rollout batch: ``epochs * batch_size / minibatch_size``."""
        return self.epochs * (self.batch_size // self.minibatch_responses)

    def process_batches(self, num_processes: int) -> tuple[int, int, int]:
        """TRL's per-process sizes for ``num_processes`` processes.

        Returns:
            ``(per_device_train_batch_size, gradient_accumulation_steps, steps_per_generation)``: each
            process forwards ``micro_batch_size`` responses at a time, accumulates ``gradient_accumulation_steps``
            of them per update, and gets ``batch_size / num_processes`` responses per rollout batch.

        Raises:
            ConfigError: the mini-batch does not split evenly over the processes and micro-batches.
        """
        mb = self.minibatch_responses
        if num_processes < 1 or mb % num_processes:
            raise ConfigError(
                f"minibatch_size {mb} must be a multiple of the number of processes ({num_processes}): "
                "every process takes an equal share of each optimizer update"
            )
        micro = self.micro_batch_size if self.micro_batch_size is not None else mb // num_processes
        if (mb // num_processes) % micro:
            raise ConfigError(
                f"micro_batch_size {micro} must divide each process's share of the mini-batch "
                f"(minibatch_size {mb} / {num_processes} processes = {mb // num_processes})"
            )
        accumulation = mb // (num_processes * micro)
        return micro, accumulation, self.batch_size // (num_processes * micro)


@dataclass(frozen=True)
class TRLLossConfig(LossConfig):
    """The loss of ``train trl``: TRL's aggregation, and the weights shared with ``train grpo``."""

    loss_type: TRLLossType = option(  # noqa: RUF009 - a Literal alias: the default is an immutable str
        "dapo", "TRL's loss aggregation (dapo: token mean over the update, as train grpo)"
    )
    entropy_coef: float = option(0.0, "entropy bonus weight (TRL's entropy_coef)", bounds=(0.0, math.inf))


@dataclass(frozen=True)
class TRLEngineConfig:
    """How TRL generates (its vLLM backend), and the early warning ``train trl`` logs."""

    use_vllm: bool = option(False, "generate each turn with TRL's vLLM backend (GPU; needs vllm installed)")
    vllm_mode: Literal["colocate", "server"] = option("colocate", "TRL's vllm_mode")
    warning_window: int = option(
        3,
        "early-warning rule: lld/warning is 1 after this many consecutive logs with delta_adv_pos <= 0",
        bounds=(1, NO_LIMIT),
    )

    def __post_init__(self) -> None:
        check_choices(self)
        check_bounds(self)


@dataclass(init=False, frozen=True)
class TRLConfig(GroupedConfig):
    """GRPO (optionally with LLDS) on SearchQA, trained by TRL's ``GRPOTrainer``.

    The run lasts ``batch.updates`` optimizer updates, as TRL counts them (``max_steps``; ``train grpo``'s
    ``steps`` count rollout batches instead). One rollout batch is ``questions_per_step`` questions ×
    ``group_size`` responses, across all processes; it is cut into mini-batches of ``minibatch_size``
    responses (also across all processes) and used for ``epochs`` passes, so each rollout batch makes
    ``updates_per_rollout`` optimizer updates whatever the number of processes. LLDS needs at least two:
    with one, ``pi_theta == pi_old`` at every update and the term is identically zero (the trainer warns).
    Each process forwards ``micro_batch_size`` responses at a time and accumulates gradients up to the
    mini-batch. The options shared with ``train grpo`` have its names.
    """

    run: TRLRunConfig = section(TRLRunConfig(), "run")  # noqa: RUF009 - a frozen dataclass
    optim: OptimConfig = section(OptimConfig(weight_decay=0.01), "optimisation")  # noqa: RUF009 - frozen
    batch: TRLBatchConfig = section(TRLBatchConfig(), "batches")  # noqa: RUF009 - a frozen dataclass
    loss: TRLLossConfig = section(TRLLossConfig(), "loss")  # noqa: RUF009 - a frozen dataclass
    trl: TRLEngineConfig = section(TRLEngineConfig(), "TRL")  # noqa: RUF009 - a frozen dataclass

    CLI_OMITS: ClassVar[tuple[str, ...]] = ("llds_ledger", "ledger_lambda", "ledger_batch")
    """LLDS's options ``train trl`` has no use for (ledger-LLDS needs ``train grpo``'s ledger)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.llds.ledger:
            raise ConfigError("ledger-LLDS (--llds-ledger) is a train grpo option")


def parse_trl_args(items: Sequence[str]) -> dict[str, Any]:
    """``--trl-arg key=value`` items as a dict; a value is read as JSON when it parses (``true``, ``0.5``,
    ``["a"]``), else kept as a string (``deepspeed=ds.json``).

    Raises:
        ConfigError: an item has no ``=`` or an empty key, or a key is given twice.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--trl-arg expects key=value (a field of TRL's GRPOConfig), got {item!r}")
        if key in out:
            raise ConfigError(f"--trl-arg {key} is given twice")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out
