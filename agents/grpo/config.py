"""Configuration of the GRPO trainer: its sections (batch, loss, LLDS, probes) and config, and what every
GRPO-style entry point shares (:class:`GroupedConfig`).

Each section checks its own fields in ``__post_init__``, a config what spans its sections, with messages
that say what to change. The CLI builds its options from the same fields
(:func:`searchgym.app.cli._options.add_config_arguments`), so every option's help is written once, here, in the
field's ``metadata["help"]``. This module is torch-free so that ``searchgym --help``
stays fast.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import ClassVar, Literal, TypeAlias, get_args

from searchgym.errors import ConfigError
from searchgym.options import NO_LIMIT, check_bounds, check_choices, option, section

from ..training.config import RUN_DIR_HELP, EvalConfig, ModelConfig, OptimConfig, RunConfig, TrainConfig
from .loss_term import check_loss_term_spec

__all__ = [
    "ADVANTAGE_CHOICES",
    "DIAGNOSTIC_GATE",
    "GATES",
    "LLDS_CHOICES",
    "LLDS_COEF",
    "MA_SCHEDULES",
    "MINIBATCH_PLANS",
    "PRECISIONS",
    "ROLLOUT_CORRECTIONS",
    "SAPO_THRESHOLD",
    "BatchConfig",
    "GRPOBatchConfig",
    "GRPOConfig",
    "GRPOEvalConfig",
    "GRPOLossConfig",
    "GRPOModelConfig",
    "GRPORunConfig",
    "GroupedConfig",
    "LLDSConfig",
    "LossConfig",
    "ProbesConfig",
    "SamplerConfig",
]

Gate: TypeAlias = Literal["action", "response", "token"]
"""Where LLDS decides whether to regularise: per action (default), per response, or per token (no gate)."""
GATES: tuple[str, ...] = get_args(Gate)
LLDS_CHOICES: tuple[str, ...] = ("none", *GATES)
"""``--llds`` values: no regulariser, or the gate LLDS uses (see :func:`searchgym.agents.grpo.losses.llds_loss`)."""
LLDS_COEF = 0.2
"""LLDS's default weight lambda, the paper's (every trainer and engine integration starts from it)."""
MinibatchPlan: TypeAlias = Literal["groups", "shuffle"]
MINIBATCH_PLANS: tuple[str, ...] = get_args(MinibatchPlan)
MASchedule: TypeAlias = Literal["paper", "code"]
MA_SCHEDULES: tuple[str, ...] = get_args(MASchedule)
Advantage: TypeAlias = Literal["group", "mean", "sign", "greedy"]
ADVANTAGE_CHOICES: tuple[str, ...] = get_args(Advantage)
"""``--advantage`` values (see :func:`searchgym.agents.grpo.advantages.compute_advantages`)."""
Precision: TypeAlias = Literal["fp32", "bf16-autocast"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
"""``--precision`` values: the arithmetic of a run's rollouts and updates."""

SamplerDtype: TypeAlias = Literal["same", "bfloat16"]
RolloutCorrection: TypeAlias = Literal["none", "tis", "mis"]
ROLLOUT_CORRECTIONS: tuple[str, ...] = get_args(RolloutCorrection)
"""``--rollout-correction`` values (see :func:`searchgym.agents.grpo.mismatch.rollout_correction`)."""

DIAGNOSTIC_GATE: Gate = "action"
"""The gate of what LLDS would measure when it is off (``train/llds_*`` of vanilla GRPO), and of ledger-LLDS
then: the paper's best."""

SAPO_THRESHOLD = 0.8
"""Default ratio threshold of SAPO's conditional KL: the lower edge of the default PPO clip range."""


@dataclass(frozen=True)
class LLDSConfig:
    """LLDS's options, the one declaration ``train grpo``, ``train trl`` and verl's loss read
    (:func:`searchgym.agents.grpo.losses.llds_loss`): the gate (``None``: no LLDS term; the diagnostics are
    still measured), lambda, LLDS-MA, and ledger-LLDS (``train grpo`` only)."""

    gate: Gate | None = option(  # noqa: RUF009 - a Literal alias: the default is an immutable str
        "action",
        "LLDS gate, or none for vanilla GRPO; LLDS acts from a step's second update (a --minibatch-size "
        "below the rollout batch, or --epochs > 1)",
        name="llds",
    )
    coef: float = option(
        LLDS_COEF, "LLDS weight lambda", "--lambda", name="llds_coef", bounds=(0.0, math.inf)
    )
    ma: bool = option(False, "LLDS-MA: down-weight the final answer span in LLDS", name="llds_ma")
    ma_beta: float | None = option(
        None,
        "LLDS-MA answer weight (default: adaptive, from the batch's mean valid searches)",
        name="llds_ma_beta",
        bounds=(0.0, 1.0),
    )
    ma_schedule: MASchedule = option(  # noqa: RUF009 - a Literal alias: the default is an immutable str
        "code",
        "LLDS-MA's adaptive beta from the mean valid searches V: code = clip(V-1, 0, 1) (the authors' "
        "released code), paper = min(V/2, 1)",
        name="llds_ma_schedule",
    )
    ledger: bool = option(
        False,
        "ledger-LLDS: each update also penalises likelihood the ledger's responses lost since anchoring",
        name="llds_ledger",
    )
    ledger_lambda: float = option(0.2, "weight of the ledger-LLDS term (lambda_R)", name="ledger_lambda")
    ledger_batch: int | None = option(
        None,
        "ledger responses sampled per update for ledger-LLDS (default: one group, G)",
        name="ledger_batch",
        bounds=(1, NO_LIMIT),
    )

    def __post_init__(self) -> None:
        check_choices(self)
        check_bounds(self)
        if self.ma and self.gate is None:
            raise ConfigError("llds_ma needs an LLDS gate: pass --llds action (or token, response)")

    @property
    def enabled(self) -> bool:
        """Whether the LLDS term is in the loss."""
        return self.gate is not None and self.coef > 0

    @property
    def measured_gate(self) -> Gate:
        """The gate LLDS measures with: its own, or :data:`DIAGNOSTIC_GATE` when LLDS is off (what TRL's
        diagnostics then report, and ledger-LLDS's gate)."""
        return self.gate if self.gate is not None else DIAGNOSTIC_GATE


LLDS_SECTION = "LLDS"
"""The ``--help`` group of LLDS's options."""


@dataclass(frozen=True)
class BatchConfig:
    """Groups and mini-batches, what every GRPO-style entry point shares: ``questions_per_step`` questions ×
    ``group_size`` responses per rollout batch, cut into mini-batches of ``minibatch_size`` responses."""

    questions_per_step: int = option(
        10, "questions per rollout batch (groups per step)", bounds=(1, NO_LIMIT)
    )
    group_size: int = option(5, "responses per question (G)")
    minibatch_size: int | None = option(
        None,
        "responses per optimizer update (default: one group, G; the reference makes ~10 updates per batch)",
    )

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ConfigError(
                f"group_size must be >= 2 (GRPO's advantages compare responses to one question), got {self.group_size}"
            )
        check_bounds(self)
        mb = self.minibatch_responses
        if mb < 1 or self.batch_size % mb:
            raise ConfigError(
                f"minibatch_size {mb} must be >= 1 and divide the rollout batch "
                f"questions_per_step * group_size = {self.batch_size}"
            )

    @property
    def batch_size(self) -> int:
        """Responses per rollout batch."""
        return self.questions_per_step * self.group_size

    @property
    def minibatch_responses(self) -> int:
        """Responses per optimizer update (``minibatch_size``, default one group)."""
        return self.minibatch_size if self.minibatch_size is not None else self.group_size


@dataclass(frozen=True)
class LossConfig:
    """The sampling temperature and the loss weights every GRPO-style entry point shares."""

    temperature: float = option(1.0, "sampling temperature of the rollouts")
    clip_eps: float = option(0.2, "PPO clip range")
    kl_coef: float = option(
        0.001,
        "weight of the k3 KL to the frozen initial policy (0: no reference model)",
        bounds=(0.0, math.inf),
    )
    entropy_coef: float = option(
        0.001,
        "entropy bonus weight (reference: 0.001; 0 while no group is solved, see docs/grpo.md)",
        bounds=(0.0, math.inf),
    )

    def __post_init__(self) -> None:
        check_choices(self)
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")
        if not self.clip_eps > 0:
            raise ConfigError(f"clip_eps must be > 0, got {self.clip_eps}")
        check_bounds(self)


@dataclass(init=False, frozen=True)
class GroupedConfig(TrainConfig):
    """What every GRPO-style entry point (``train grpo``, ``train trl``) is made of on top of
    :class:`TrainConfig`: the sections ``batch`` (groups, mini-batches), ``loss`` (temperature, clip, KL,
    entropy) and ``llds`` (:class:`LLDSConfig`). Each subclass gives its own kind of ``batch`` and ``loss``,
    with its own fields, defaults and help."""

    batch: BatchConfig = section(BatchConfig(), "batches")  # noqa: RUF009 - a frozen dataclass
    loss: LossConfig = section(LossConfig(), "loss")  # noqa: RUF009 - a frozen dataclass
    llds: LLDSConfig = section(LLDSConfig(), LLDS_SECTION)  # noqa: RUF009 - a frozen dataclass


@dataclass(frozen=True)
class GRPORunConfig(RunConfig):
    """The run section of ``train grpo``: also its resume and checkpoint cadence."""

    run_dir: str = option("runs/grpo", RUN_DIR_HELP)
    resume: bool = option(
        False,
        "continue from RUN_DIR/checkpoint.pt (model, optimizer, RNG, step); the reference model comes back "
        "from the init checkpoint the run recorded",
    )
    save_every: int = option(
        10, "write RUN_DIR/checkpoint.pt every N steps (0: only at the end)", bounds=(0, NO_LIMIT)
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # its bounds too: save_every


@dataclass(frozen=True)
class GRPOModelConfig(ModelConfig):
    """The model section of ``train grpo``: also the arithmetic its rollouts and updates run in."""

    precision: Precision = option(  # noqa: RUF009 - a Literal alias: the default is an immutable str
        "fp32",
        "arithmetic of the rollouts and updates: fp32, or bf16-autocast (matrix products in bfloat16 under "
        "torch.autocast; weights, optimizer state, log-softmax and every log-probability stay float32; needs a "
        "CPU with AVX512-BF16 or AMX, or a bfloat16 GPU, else runs fp32 and says so). The probes and the greedy "
        "evaluation are scored in fp32 either way",
    )


@dataclass(frozen=True)
class GRPOBatchConfig(BatchConfig):
    """The batches of ``train grpo``: ``steps`` rollout batches, each used for ``epochs`` passes of
    mini-batch updates (``updates_per_step`` optimizer updates in all)."""

    steps: int = option(100, "rollout batches to train on", bounds=(1, NO_LIMIT))
    epochs: int = option(
        1, "passes over each rollout batch (reference: 1, each trajectory used once)", bounds=(1, NO_LIMIT)
    )
    minibatch_plan: MinibatchPlan = option(  # noqa: RUF009 - a Literal alias: the default is an immutable str
        "groups",
        "groups: mini-batches of whole groups in a shuffled group order (every trajectory once per epoch); "
        "shuffle: responses shuffled across groups (a mini-batch mixes parts of several groups)",
    )
    micro_batch_size: int | None = option(
        None, "responses per forward/backward (gradient accumulation; default: the whole mini-batch)"
    )
    length_buckets: bool = option(
        True,
        "cut each mini-batch into micro-batches of similar lengths (less padding, same gradient; pi_old is "
        "re-scored in the same shapes)",
    )
    shared_prefix: bool = option(
        False,
        "score each group's shared prefix once in the updates and re-scoring passes: rows of a micro-batch "
        "that start alike (a group's prompt and question, and the turns its responses have in common) read "
        "that prefix in one forward whose keys and values they all attend to (the same log-probs and "
        "gradients up to float rounding, fewer token slots)",
    )
    filter_groups: bool = option(
        False,
        "DAPO's dynamic sampling: draw further question batches until the step holds questions_per_step groups "
        "whose rewards are not all equal (at most --max-gen-batches batches; short steps are topped up with "
        "uninformative groups, rollout/informative_frac says how many were informative)",
    )
    max_gen_batches: int = option(
        4, "the most question batches --filter-groups samples per step", bounds=(1, NO_LIMIT)
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choices(self)
        mb = self.minibatch_responses
        if self.minibatch_plan == "groups" and mb % self.group_size:
            raise ConfigError(
                f"minibatch_size {mb} must be a multiple of group_size {self.group_size} with "
                "--minibatch-plan groups (mini-batches hold whole groups); or pass --minibatch-plan shuffle"
            )
        if self.micro_batch_size is not None and (self.micro_batch_size < 1 or mb % self.micro_batch_size):
            raise ConfigError(
                f"micro_batch_size must be >= 1 and divide minibatch_size={mb}, got {self.micro_batch_size}"
            )

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates per rollout batch."""
        return self.epochs * (self.batch_size // self.minibatch_responses)


@dataclass(frozen=True)
class GRPOLossConfig(LossConfig):
    """The loss of ``train grpo`` (:func:`searchgym.agents.grpo.losses.grpo_llds_loss`): the advantage, the
    clipped surrogate and its caps, KL, entropy, SAPO, a loss term of your own, and where pi_old comes from."""

    advantage: Advantage = option(  # noqa: RUF009 - a Literal alias: the default is an immutable str
        "group",
        "group: (r - mean) / (std + eps) within the group (GRPO); mean: r - mean (Dr. GRPO); sign: 2r - 1, a "
        "fixed reference with no group statistics; greedy: r - r_greedy, the reward of the current policy's "
        "greedy play on the same question (self-critical baseline, SCST; one greedy episode per question "
        "per step)",
    )
    ratio_cap: float = option(
        100.0, "cap on the importance ratio pi/pi_old, zero gradient beyond (reference: 100; inf: none)"
    )
    kl_value_cap: float = option(
        10.0, "clamp of each token's k3 KL value to [-cap, cap], zero gradient beyond (reference: 10)"
    )
    sapo_coef: float = option(
        0.0,
        "weight of SAPO's conditional KL to the rollout policy (Li et al. 2026): on tokens of A>=0 responses "
        "whose ratio pi/pi_old fell to --sapo-threshold or below; like LLDS it acts from a step's second "
        "update (0: off)",
        bounds=(0.0, math.inf),
    )
    sapo_threshold: float = option(
        SAPO_THRESHOLD, "SAPO's ratio threshold t in (0, 1]: a token is penalised once pi/pi_old <= t"
    )
    loss_term: str | None = option(
        None,
        "a loss term of your own, module:function: called on every micro-batch with its tensors and masks "
        "(LossTermInputs), it returns (scalar, metrics), added to the loss times --loss-term-coef and logged "
        "as train/loss_term and train/loss_term/NAME (docs/study.md; the module is imported from the current "
        "directory or the installed packages)",
    )
    loss_term_coef: float = option(1.0, "weight of --loss-term in the loss")
    rescore_pi_old: bool | None = option(
        None,
        "where pi_old comes from. Default (auto): the first update's own forward is pi_old for its responses "
        "(ratio exactly 1, LLDS exactly 0 there) and the sampler's log-probs serve the rest, unless they differ "
        "from that forward by more than 1e-3 (a bf16 model), when the rest are re-scored before the first "
        "optimizer step. --rescore-pi-old: a separate no-grad pass re-scores all of them (exact lld/ zeros on a "
        "step that changes nothing, one forward pass more); --no-rescore-pi-old: the sampler's log-probs for all",
    )
    skip_zero_signal: bool = option(
        False,
        "no optimizer step (no Adam moment update, no weight decay) on a mini-batch whose loss has exactly "
        "zero gradient (all advantages 0 and no KL/entropy/LLDS term acting): the momentum control",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.ratio_cap > 1 + self.clip_eps:
            raise ConfigError(f"ratio_cap must be > 1 + clip_eps = {1 + self.clip_eps}, got {self.ratio_cap}")
        if not self.kl_value_cap > 0:
            raise ConfigError(f"kl_value_cap must be > 0, got {self.kl_value_cap}")
        if not 0 < self.sapo_threshold <= 1:
            raise ConfigError(f"sapo_threshold must be in (0, 1], got {self.sapo_threshold}")
        if self.loss_term is not None:
            check_loss_term_spec(self.loss_term)
        if not math.isfinite(self.loss_term_coef):
            raise ConfigError(f"loss_term_coef must be a finite number, got {self.loss_term_coef}")


@dataclass(frozen=True)
class ProbesConfig:
    """What ``train grpo`` measures besides its loss (:mod:`searchgym.agents.grpo.probes`, the ledger, the
    early warning, the gradient noise scale)."""

    probe_size: int = option(
        64,
        "correct transcripts in the fixed probe set scored every step (lld/probe_logp*; 0: none)",
        bounds=(0, NO_LIMIT),
    )
    probe_demos: str | None = option(
        None, "demonstrations JSONL for the probe set (default: oracle episodes of the training split)"
    )
    onpolicy_probe_size: int = option(
        64,
        "correct responses the initial policy samples itself (temperature --temperature) on training questions "
        "and on held-out questions: the on-policy probes lld/probe_onpolicy_train|heldout (0: none)",
        bounds=(0, NO_LIMIT),
    )
    onpolicy_probe_episodes: int | None = option(
        None,
        "the most episodes sampled to find them, per probe (default: 4 x onpolicy_probe_size)",
        bounds=(1, NO_LIMIT),
    )
    onpolicy_heldout_split: str = option(
        "validation", "split of the held-out on-policy probe (questions the run never trains on)"
    )
    ledger_size: int = option(
        200,
        "cross-step ledger: the last N positively rewarded responses, with their log-likelihood right after "
        "the step that produced them (the anchor), re-scored every step (lld/ledger_*; 0: none)",
        bounds=(0, NO_LIMIT),
    )
    warning_window: int = option(
        3,
        "early-warning rule: lld/warning is 1 after this many consecutive steps with delta_adv_pos <= 0",
        bounds=(1, NO_LIMIT),
    )
    probe_every: int = option(
        1,
        "score the probe sets every N steps (and at the first and last); lld/probe_* are absent in between",
        bounds=(1, NO_LIMIT),
    )
    log_gns: bool = option(
        False,
        "log train/gns_groups every step: the gradient noise scale in groups, from micro-batch and mini-batch "
        "gradient norms (McCandlish et al. 2018); needs micro-batches smaller than the mini-batch",
    )

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass(frozen=True)
class SamplerConfig:
    """The sampler–learner mismatch dial (:mod:`searchgym.agents.grpo.mismatch`): rollouts sampled by a
    policy that differs from the learner's in a controlled way, as an inference engine's does, and the
    optional correction of the loss for it. All off (the default): the learner samples its own rollouts."""

    sampler_dtype: SamplerDtype = option(  # noqa: RUF009 - a Literal alias: the default is an immutable str
        "same", "the sampler's weights: the learner's (same), or the learner's rounded to bfloat16"
    )
    sampler_noise: float = option(
        0.0,
        "standard deviation of Gaussian noise added to the sampler's logits (0: none)",
        bounds=(0.0, 100.0),
    )
    sampler_stale: int = option(
        0,
        "the sampler's weights are the learner's of this many optimizer updates ago (0: current)",
        bounds=(0, 1000),
    )
    rollout_correction: RolloutCorrection = option(  # noqa: RUF009 - a Literal alias: immutable str
        "none",
        "correct the policy-gradient term for the sampler: tis = token weights min(pi_learner/pi_sampler, C); "
        "mis = drop responses whose geometric-mean ratio lies outside [1/C, C] (C: the threshold)",
    )
    rollout_correction_threshold: float = option(
        2.0, "C of --rollout-correction (tis: the weight cap; mis: the ratio bound)", bounds=(1.0, 1e6)
    )

    def __post_init__(self) -> None:
        check_choices(self)
        check_bounds(self)
        if self.rollout_correction != "none" and self.rollout_correction_threshold <= 1.0:
            raise ConfigError(
                f"rollout_correction_threshold must be > 1 (got {self.rollout_correction_threshold}): it bounds "
                "a ratio that is 1 where the sampler and the learner agree"
            )

    @property
    def dial_on(self) -> bool:
        """Whether the sampler differs from the learner (any of the three dials away from its default)."""
        return self.sampler_dtype != "same" or self.sampler_noise > 0 or self.sampler_stale > 0

    @property
    def active(self) -> bool:
        """Whether the trainer samples with a separate sampler or corrects for one."""
        return self.dial_on or self.rollout_correction != "none"


@dataclass(frozen=True)
class GRPOEvalConfig(EvalConfig):
    """GRPO's evaluations: also of the initial policy, and every N steps."""

    at_start: bool = option(
        True,
        "evaluate the initial policy as step 0 (the warm-start line in plots; needs eval_questions)",
        name="eval_at_start",
    )
    every: int = option(
        0,
        "evaluate greedily on eval_questions every N steps (0: only at the end)",
        name="eval_every",
        bounds=(0, NO_LIMIT),
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # its bounds too: eval_every


@dataclass(init=False, frozen=True)
class GRPOConfig(GroupedConfig):
    """GRPO (optionally with LLDS) on SearchQA.

    One *step* is one rollout batch: ``questions_per_step`` questions × ``group_size`` responses, then
    ``epochs`` passes of mini-batch updates over it (``batch.updates_per_step`` optimizer updates in all; with
    a single update LLDS is identically zero, see ``docs/grpo.md``).

    The defaults follow the LLDS authors' reference recipe (their verl fork of Search-R1) wherever it
    carries over to a CPU-sized run: one pass over each rollout batch in about ten mini-batches, clip 0.2,
    the importance ratio capped at 100 and the k3 value at 10, KL 0.001, entropy bonus 0.001, weight decay
    0.01, lambda 0.2 with the action gate. Departures are named in each option's help and in docs/grpo.md.
    """

    run: GRPORunConfig = section(GRPORunConfig(), "run")  # noqa: RUF009 - a frozen dataclass
    model: GRPOModelConfig = section(GRPOModelConfig(), "model")  # noqa: RUF009 - a frozen dataclass
    optim: OptimConfig = section(OptimConfig(weight_decay=0.01), "optimisation")  # noqa: RUF009 - frozen
    eval: GRPOEvalConfig = section(GRPOEvalConfig(), "evaluation")  # noqa: RUF009 - frozen
    batch: GRPOBatchConfig = section(GRPOBatchConfig(), "batches")  # noqa: RUF009 - a frozen dataclass
    loss: GRPOLossConfig = section(GRPOLossConfig(), "loss")  # noqa: RUF009 - a frozen dataclass
    probes: ProbesConfig = section(ProbesConfig(), "diagnostics")  # noqa: RUF009 - a frozen dataclass
    sampler: SamplerConfig = section(SamplerConfig(), "sampler-learner mismatch")  # noqa: RUF009 - frozen

    FROZEN_CONTROL: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        batch, probes = self.batch, self.probes
        if probes.onpolicy_probe_size and probes.onpolicy_heldout_split == self.env.split:
            raise ConfigError(
                f"onpolicy_heldout_split must differ from the training split {self.env.split!r} (held-out questions)"
            )
        if (
            (self.llds.enabled or self.loss.sapo_coef)
            and batch.minibatch_responses == batch.batch_size
            and batch.epochs == 1
        ):
            warnings.warn(
                "one optimizer update per step: LLDS and SAPO compare with the rollout policy, which the first "
                "update equals, so they never act; pass a --minibatch-size below questions_per_step * "
                f"group_size = {batch.batch_size} (or --epochs 2)",
                stacklevel=2,
            )
        if self.llds.ledger and not probes.ledger_size:
            raise ConfigError("llds_ledger needs a ledger: --ledger-size must be >= 1")
        if probes.log_gns and (
            batch.micro_batch_size is None or batch.micro_batch_size >= batch.minibatch_responses
        ):
            raise ConfigError(
                "log_gns compares micro-batch and mini-batch gradients: set --micro-batch-size below "
                f"minibatch_size={batch.minibatch_responses} (e.g. one group, {batch.group_size})"
            )

    @property
    def frozen(self) -> bool:
        """The frozen control (``lr == 0``): everything a training arm does except the optimizer step."""
        return self.optim.lr == 0

    @property
    def ledger_responses(self) -> int:
        """Ledger responses per update for ledger-LLDS (``ledger_batch``, default one group)."""
        return self.llds.ledger_batch if self.llds.ledger_batch is not None else self.batch.group_size
