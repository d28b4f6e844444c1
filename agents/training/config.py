"""Configuration every trainer shares (:class:`TrainConfig`: the sections run, model, env, optim, eval) and
the supervised warm-start's; :mod:`searchgym.agents.grpo.config` adds GRPO's sections.

Each section is a frozen dataclass that checks its own fields in ``__post_init__``; a config checks what
spans its sections in its own, with messages that say what to change. The CLI
builds its options from the same fields (:func:`searchgym.app.cli._options.add_config_arguments`), so every
option's help is written once, in the field's ``metadata["help"]`` (:func:`searchgym.options.option`). This
module is torch-free so that ``searchgym --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from searchgym.envs.spec import TRAINING, EnvSpec
from searchgym.errors import ConfigError
from searchgym.options import (
    NO_LIMIT,
    check_bounds,
    check_choices,
    gather_options,
    is_section,
    option,
    section,
)

from .reporting import REPORT_TO_HELP, ReportTo, check_report_to

__all__ = [
    "CONFIG_FORMAT",
    "EvalConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "SFTConfig",
    "SFTOptions",
    "TrainConfig",
    "parse_curriculum",
]

CONFIG_FORMAT = 3
"""The form of a config as checkpoints store it (:meth:`TrainConfig.to_dict`): every section as a mapping,
under ``"format"``. Format 2 held the sections env, optim, eval and llds as mappings and every other option
flat; a mapping without ``"format"`` is the flat form, one key per option
(:func:`searchgym.agents.training.checkpoint_checks.stored_config` reads all three)."""

RUN_DIR_HELP = "folder for metrics.jsonl, checkpoints and TensorBoard events"


@dataclass(frozen=True)
class RunConfig:
    """Where a run writes and how it runs: its folder, the seed, the device, threads, and its reporters."""

    run_dir: str = option("runs/run", RUN_DIR_HELP)
    overwrite: bool = option(
        False,
        "replace the run RUN_DIR already holds (checkpoint, metrics, events); without it that is refused",
    )
    seed: int = option(0, "seed of sampling, shuffling and question order")
    device: str = option("cpu", "torch device: cpu, cuda, cuda:1, mps")
    threads: int | None = option(None, "torch CPU threads (default: torch's choice)", bounds=(1, NO_LIMIT))
    progress: bool = option(True, "show a tqdm progress bar")
    tensorboard: bool = option(
        True,
        "also write TensorBoard events when tensorboard is installed (--no-tensorboard: --report-to none)",
    )
    report_to: ReportTo = option("tensorboard", REPORT_TO_HELP)  # noqa: RUF009 - a Literal alias: an immutable str

    def __post_init__(self) -> None:
        check_report_to(self.report_to)
        check_bounds(self)


@dataclass(frozen=True)
class ModelConfig:
    """The model a run starts from (:func:`searchgym.agents.training.policy.build_policy`): a Hugging Face
    model, a checkpoint, or the tiny offline model, and its tokenizer."""

    name: str | None = option(
        None,
        "Hugging Face model name or path, or config:FILE (or config:qwen2-0.5b) for random weights of that "
        "architecture (default: the tiny offline model built from a config)",
        name="model",
    )
    tokenizer: str | None = option(None, "tokenizer name or path (default: the model's, else built-in)")
    init: str | None = option(None, "checkpoint to start from (e.g. the SFT model's checkpoint.pt)")
    dtype: Literal["float32", "bfloat16", "float16", "float64"] = option(
        "float32", "model parameter dtype (float64: a reference run whose samples no CPU's rounding can flip)"
    )
    tiny_layers: int = option(
        2, "layers of the tiny model (ignored with --model or --init)", bounds=(1, NO_LIMIT)
    )
    tiny_hidden: int = option(
        128, "hidden size of the tiny model (ignored with --model or --init)", bounds=(1, NO_LIMIT)
    )

    def __post_init__(self) -> None:
        check_choices(self)
        check_bounds(self)

    @property
    def tokenizer_name(self) -> str | None:
        """The tokenizer the run's envs use, by name: ``tokenizer``, else the model's (``None``: built-in)."""
        return self.tokenizer if self.tokenizer is not None else self.name


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer and its learning-rate schedule (:func:`searchgym.agents.training.run.make_optimizer`):
    AdamW, a linear warm-up, then a constant or linearly decaying rate."""

    lr: float = option(3e-4, "learning rate (use ~1e-6 for a 3B model; GRPO's frozen control: 0)")
    warmup_steps: int = option(
        0,
        "linear learning-rate warm-up, in schedule steps: optimizer updates for train sft and train trl, "
        "rollout steps for train grpo (its rate changes once per step, as in verl; the reference warms up "
        "over 28.5%% of training)",
        bounds=(0, NO_LIMIT),
    )
    warmup_start_lr: float | None = option(
        None,
        "the rate of the warm-up's first step (a straight ramp from it to --lr over --warmup-steps); "
        "default: the usual ramp from lr/warmup_steps",
    )
    lr_schedule: Literal["constant", "linear"] = option(
        "constant", "after the warm-up: constant, or linear decay to zero at the last step"
    )
    weight_decay: float = option(0.0, "AdamW weight decay (reference: 0.01)", bounds=(0.0, math.inf))
    max_grad_norm: float = option(
        1.0, "gradient-norm clipping threshold (0 disables clipping)", bounds=(0.0, math.inf)
    )
    adam_betas: str = option("0.9,0.999", "AdamW's beta1,beta2")
    adam_eps: float = option(1e-8, "AdamW's epsilon")

    def __post_init__(self) -> None:
        check_choices(self)
        if not (self.lr >= 0 and math.isfinite(self.lr)):
            raise ConfigError(f"lr must be > 0 (0: GRPO's frozen control), got {self.lr}")
        check_bounds(self)
        if self.warmup_start_lr is not None:
            if not 0 < self.warmup_start_lr <= self.lr:
                raise ConfigError(f"warmup_start_lr must be in (0, lr={self.lr}], got {self.warmup_start_lr}")
            if self.warmup_steps < 2:
                raise ConfigError("warmup_start_lr needs a warm-up of at least 2 steps (--warmup-steps)")
        b1, b2 = self.betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ConfigError(f"adam_betas must both be in [0, 1), got {self.adam_betas!r}")
        if not self.adam_eps > 0:
            raise ConfigError(f"adam_eps must be > 0, got {self.adam_eps}")

    @property
    def betas(self) -> tuple[float, float]:
        """``adam_betas`` as two floats."""
        try:
            b1, b2 = (float(x) for x in self.adam_betas.split(","))
        except ValueError:
            raise ConfigError(
                f"adam_betas must be two numbers, 'B1,B2' (e.g. 0.9,0.99), got {self.adam_betas!r}"
            ) from None
        return b1, b2


@dataclass(frozen=True)
class EvalConfig:
    """The greedy evaluation a trainer runs (:func:`searchgym.agents.training.rollout.evaluate_greedy`): the
    first ``questions`` questions of ``split``, ``batch`` episodes at a time, in the run's env."""

    split: str = option("test", "evaluation split", name="eval_split")
    questions: int = option(
        200,
        "questions of the eval split scored greedily at the end (0: none)",
        name="eval_questions",
        bounds=(0, NO_LIMIT),
    )
    batch: int = option(
        64, "episodes generated together during evaluation", name="eval_batch", bounds=(1, NO_LIMIT)
    )

    def __post_init__(self) -> None:
        check_bounds(self)
        if not isinstance(self.split, str) or not self.split:
            raise ConfigError(f"eval_split must be a non-empty string, got {self.split!r}")


@dataclass(init=False, frozen=True)
class TrainConfig:
    """What every training entry point is made of: the sections ``run``, ``model``, ``env``, ``optim`` and
    ``eval``; each trainer's config adds its own.

    A config is built from its options by name (``GRPOConfig(lr=1e-3, llds="token")``, the names of the
    CLI's flags), or with whole sections (``llds=LLDSConfig(...)``): :func:`searchgym.options.gather_options`.
    It is frozen, as its sections are: ``dataclasses.replace(config, batch=...)`` gives a varied copy,
    checked as any other.
    """

    run: RunConfig = section(RunConfig(), "run")  # noqa: RUF009 - a frozen dataclass
    model: ModelConfig = section(ModelConfig(), "model")  # noqa: RUF009 - a frozen dataclass
    env: EnvSpec = section(TRAINING, "environment")  # noqa: RUF009 - a frozen dataclass
    optim: OptimConfig = section(OptimConfig(), "optimisation")  # noqa: RUF009 - a frozen dataclass
    eval: EvalConfig = section(EvalConfig(), "evaluation")  # noqa: RUF009 - a frozen dataclass

    FROZEN_CONTROL: ClassVar[bool] = False
    """Whether ``lr == 0`` is allowed (GRPO's frozen control); every other entry point needs a rate."""

    def __init__(self, **options: Any) -> None:
        for name, value in gather_options(type(self), options).items():
            object.__setattr__(self, name, value)  # the one assignment: a frozen config's construction
        self.__post_init__()

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data, every section as a mapping: what a checkpoint stores."""
        out: dict[str, Any] = {"format": CONFIG_FORMAT}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if is_section(f):
                value = value.to_dict() if hasattr(value, "to_dict") else dataclasses.asdict(value)
            out[f.name] = value
        return out

    def __post_init__(self) -> None:
        lr = self.optim.lr
        if not (lr > 0 or (lr == 0 and self.FROZEN_CONTROL)):
            hint = " (--lr 0, the frozen control, is a GRPO option)" if lr == 0 else ""
            raise ConfigError(f"lr must be > 0, got {lr}{hint}")

    @property
    def eval_env(self) -> EnvSpec:
        """The environment of the greedy evaluations: the training env on ``eval_split``."""
        return self.env.replace(split=self.eval.split)


@dataclass(frozen=True)
class SFTOptions:
    """The supervised warm-start's own options: its demonstrations and how it passes over them."""

    demos: str | None = option(None, "demonstrations JSONL (default: generate them from the training split)")
    demo_episodes: int | None = option(
        None, "demonstrations to generate (default: one per training question)", bounds=(1, NO_LIMIT)
    )
    demonstrator: str = option(
        "oracle",
        "who plays the generated demonstrations: oracle, shortcut (answers a bridge question after its first "
        "hop), or a mixture drawn per episode, e.g. mix:oracle=0.1,shortcut=0.9 (ignored with --demos)",
    )
    keep_unrewarded: bool = option(
        False,
        "learn from every demonstration, rewarded or not (a shortcut teacher's are wrong by design); "
        "default: only rewarded ones",
    )
    epochs: int = option(4, "passes over the demonstrations", bounds=(1, NO_LIMIT))
    batch_size: int = option(16, "demonstrations per optimizer update", bounds=(1, NO_LIMIT))
    batch_order: Literal["random", "length"] = option(
        "random",
        "how an epoch's batches are drawn: random, or length (demonstrations of about the same length "
        "batched together, so less padding; the batches in random order)",
    )
    curriculum: str | None = option(
        None,
        "KIND:N learns only from demonstrations of questions of kind KIND for the first N epochs "
        "(e.g. attribute:2), then from all; needs demonstrations that record their question's kind",
    )

    def __post_init__(self) -> None:
        check_bounds(self)
        check_choices(self)
        from searchgym.agents.demonstrations import parse_demonstrator

        parse_demonstrator(self.demonstrator)
        if self.curriculum is not None:
            kind, epochs = parse_curriculum(self.curriculum)
            if epochs > self.epochs:
                raise ConfigError(
                    f"curriculum {self.curriculum!r} asks for {epochs} epochs of {kind!r} demonstrations, "
                    f"but the run has {self.epochs} (--epochs)"
                )


def parse_curriculum(text: str) -> tuple[str, int]:
    """``KIND:N`` as ``(KIND, N)``: the first ``N`` epochs learn from ``KIND``'s demonstrations only.

    Raises:
        ConfigError: ``text`` is not ``KIND:N`` with a non-empty kind and ``N`` >= 1.
    """
    kind, sep, epochs = text.rpartition(":")
    if not sep or not kind or not epochs.isdigit() or int(epochs) < 1:
        raise ConfigError(f"curriculum must be KIND:N with N >= 1 epochs (e.g. attribute:2), got {text!r}")
    return kind, int(epochs)


@dataclass(init=False, frozen=True)
class SFTConfig(TrainConfig):
    """Supervised warm-start on oracle demonstrations: cross-entropy on the policy's tokens only."""

    run: RunConfig = section(RunConfig(run_dir="runs/sft"), "run")  # noqa: RUF009 - a frozen dataclass
    optim: OptimConfig = section(  # noqa: RUF009 - a frozen dataclass
        OptimConfig(lr=2e-3, warmup_steps=20, lr_schedule="linear"), "optimisation"
    )
    sft: SFTOptions = section(SFTOptions(), "demonstrations")  # noqa: RUF009 - a frozen dataclass
