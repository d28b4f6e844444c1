"""Configuration every trainer shares (the run folder, the model, the environment) and the supervised
warm-start's; :mod:`searchgym.agents.grpo.config` adds GRPO's.

Each dataclass is validated once, in ``__post_init__``, with messages that say what to change. The CLI
builds its options from the same fields (:func:`searchgym.cli._options.add_config_arguments`), so every
option's help is written once, in the field's ``metadata["help"]`` (:func:`searchgym.options.option`). This
module is torch-free so that ``searchgym --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias, get_args

from searchgym.errors import ConfigError
from searchgym.options import check_choices, gather_options, is_section, option

__all__ = ["CONFIG_FORMAT", "REWARDS", "CommonConfig", "SFTConfig"]

Reward: TypeAlias = Literal["em", "subem", "f1"]
REWARDS: tuple[str, ...] = get_args(Reward)
"""``--reward`` values: the env's answer metrics (exact match, substring EM, token F1)."""


CONFIG_FORMAT = 2
"""The form of a config as checkpoints store it (:meth:`CommonConfig.to_dict`): its sections as mappings,
under ``"format"``. A mapping without it is the flat form of older checkpoints, one key per option
(:func:`searchgym.agents.training.checkpoint_checks.stored_config` reads both)."""


@dataclass(init=False)
class CommonConfig:
    """Fields shared by every training entry point: the run folder, the model, the environment.

    A config is built from its options by name (``GRPOConfig(lr=1e-3, llds="token")``, the names of the
    CLI's flags), or with whole sections (``llds=LLDSConfig(...)``): :func:`searchgym.options.gather_options`.
    """

    run_dir: str = option("runs/run", "folder for metrics.jsonl, checkpoints and TensorBoard events")
    overwrite: bool = option(
        False,
        "replace the run RUN_DIR already holds (checkpoint, metrics, events); without it that is refused",
    )
    model: str | None = option(
        None,
        "Hugging Face model name or path, or config:FILE (or config:qwen2-0.5b) for random weights of that "
        "architecture (default: the tiny offline model built from a config)",
    )
    tokenizer: str | None = option(None, "tokenizer name or path (default: the model's, else built-in)")
    init: str | None = option(None, "checkpoint to start from (e.g. the SFT model's checkpoint.pt)")
    device: str = option("cpu", "torch device: cpu, cuda, cuda:1, mps")
    dtype: Literal["float32", "bfloat16", "float16"] = option("float32", "model parameter dtype")
    tiny_layers: int = option(2, "layers of the tiny model (ignored with --model or --init)")
    tiny_hidden: int = option(128, "hidden size of the tiny model (ignored with --model or --init)")
    dataset: str | None = option(None, "FlashRAG folder (default: the generated world)")
    world_seed: int = option(0, "seed of the generated world (ignored with --dataset)")
    split: str = option("train", "training split")
    eval_split: str = option("test", "evaluation split")
    retriever: str = option("bm25", "retriever backend name or URL")
    retriever_patience: float = option(
        300.0,
        "seconds to wait for a URL retriever that stops answering (a restart) before failing; the run then "
        "goes on as if nothing happened (0: fail once the client's retries are spent)",
    )
    topk: int = option(3, "passages per search")
    max_turns: int = option(4, "turn budget per episode")
    max_turn_tokens: int = option(
        48, "token cap per turn (the tiny model's turns are < 20 tokens; Search-R1 uses 500 for a real LM)"
    )
    max_context_tokens: int = option(1024, "context size (transcript cap; ~4096 for a real LM)")
    reward: Reward = option(  # noqa: RUF009 - a Literal alias: the default is an immutable str
        "em", "episode reward, in training and in evaluations: exact match, substring EM or token F1"
    )
    lr: float = option(3e-4, "learning rate (use ~1e-6 for a 3B model)")
    warmup_steps: int = option(0, "linear learning-rate warm-up, in optimizer updates")
    warmup_start_lr: float | None = option(
        None,
        "the rate of the warm-up's first update (a straight ramp from it to --lr over --warmup-steps); "
        "default: the usual ramp from lr/warmup_steps",
    )
    lr_schedule: Literal["constant", "linear"] = option(
        "constant", "after the warm-up: constant, or linear decay to zero at the last update"
    )
    weight_decay: float = option(0.0, "AdamW weight decay")
    max_grad_norm: float = option(1.0, "gradient-norm clipping threshold (0 disables clipping)")
    eval_questions: int = option(200, "questions of the eval split scored greedily at the end (0: none)")
    eval_batch: int = option(64, "episodes generated together during evaluation")
    seed: int = option(0, "seed of sampling, shuffling and question order")
    threads: int | None = option(None, "torch CPU threads (default: torch's choice)")
    progress: bool = option(True, "show a tqdm progress bar")
    tensorboard: bool = option(True, "also write TensorBoard events when tensorboard is installed")

    FROZEN_CONTROL: ClassVar[bool] = False
    """Whether ``lr == 0`` is allowed (GRPO's frozen control); every other entry point needs a rate."""

    def __init__(self, **options: Any) -> None:
        for name, value in gather_options(type(self), options).items():
            setattr(self, name, value)
        self.__post_init__()

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data, its sections as mappings: what a checkpoint stores."""
        out: dict[str, Any] = {"format": CONFIG_FORMAT}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if is_section(f):
                value = value.to_dict() if hasattr(value, "to_dict") else dataclasses.asdict(value)
            out[f.name] = value
        return out

    def __post_init__(self) -> None:
        check_choices(self)
        for name in ("tiny_layers", "tiny_hidden", "topk", "max_turns", "max_turn_tokens", "eval_batch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.retriever_patience >= 0 and math.isfinite(self.retriever_patience)):
            raise ConfigError(f"retriever_patience must be >= 0 seconds, got {self.retriever_patience}")
        if self.max_context_tokens < 16:
            raise ConfigError(f"max_context_tokens must be >= 16, got {self.max_context_tokens}")
        if not (self.lr > 0 or (self.lr == 0 and self.FROZEN_CONTROL)):
            hint = " (--lr 0, the frozen control, is a GRPO option)" if self.lr == 0 else ""
            raise ConfigError(f"lr must be > 0, got {self.lr}{hint}")
        for name in ("warmup_steps", "eval_questions"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.weight_decay < 0 or self.max_grad_norm < 0:
            raise ConfigError(
                "weight_decay and max_grad_norm must be >= 0 (max_grad_norm 0 disables clipping)"
            )
        if self.warmup_start_lr is not None:
            if not 0 < self.warmup_start_lr <= self.lr:
                raise ConfigError(f"warmup_start_lr must be in (0, lr={self.lr}], got {self.warmup_start_lr}")
            if self.warmup_steps < 2:
                raise ConfigError("warmup_start_lr needs a warm-up of at least 2 steps (--warmup-steps)")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")

    def env_kwargs(self, split: str | None = None) -> dict[str, Any]:
        """Keyword arguments of ``SearchQAEnv`` / ``SearchQAVectorEnv`` for ``split`` (default: training)."""
        return {
            "dataset": self.dataset,
            "world_seed": self.world_seed,
            "split": split or self.split,
            "tokenizer": self.tokenizer if self.tokenizer is not None else self.model,
            "retriever": self.retriever,
            "retriever_patience": self.retriever_patience,
            "topk": self.topk,
            "max_turns": self.max_turns,
            "max_turn_tokens": self.max_turn_tokens,
            "max_context_tokens": self.max_context_tokens,
            "reward": self.reward,
        }


@dataclass(init=False)
class SFTConfig(CommonConfig):
    """Supervised warm-start on oracle demonstrations: cross-entropy on the policy's tokens only."""

    run_dir: str = option("runs/sft", "folder for metrics.jsonl, checkpoints and TensorBoard events")
    demos: str | None = option(None, "demonstrations JSONL (default: generate them from the training split)")
    demo_episodes: int | None = option(
        None, "demonstrations to generate (default: one per training question)"
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
    epochs: int = option(4, "passes over the demonstrations")
    batch_size: int = option(16, "demonstrations per optimizer update")
    lr: float = option(2e-3, "learning rate")
    warmup_steps: int = option(20, "linear learning-rate warm-up, in optimizer updates")
    lr_schedule: Literal["constant", "linear"] = option(
        "linear", "after the warm-up: constant, or linear decay to zero at the last update"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.demo_episodes is not None and self.demo_episodes < 1:
            raise ConfigError(f"demo_episodes must be >= 1, got {self.demo_episodes}")
        from searchgym.agents.demonstrations import parse_demonstrator

        parse_demonstrator(self.demonstrator)
