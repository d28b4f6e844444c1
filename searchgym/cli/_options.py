"""The training commands' options, built from the config dataclasses' fields (help, type, choices and
default written once, in the field), in the sections of ``--help``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from typing import Any, Literal, TypeVar, get_args, get_origin

from searchgym.agents.training.config import CommonConfig

__all__ = ["SECTIONS", "add_config_arguments", "config_from_args"]

C = TypeVar("C", bound=CommonConfig)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


SECTIONS: dict[str, tuple[str, ...]] = {
    "run": (
        "run_dir",
        "overwrite",
        "resume",
        "seed",
        "device",
        "threads",
        "progress",
        "tensorboard",
        "save_every",
        "save_total_limit",
        "save_model",
    ),
    "model": ("model", "tokenizer", "init", "dtype", "precision", "tiny_layers", "tiny_hidden"),
    "environment": (
        "dataset",
        "world_seed",
        "split",
        "retriever",
        "retriever_patience",
        "topk",
        "max_turns",
        "max_turn_tokens",
        "max_context_tokens",
        "max_obs_tokens",
        "reward",
        "prompt_style",
    ),
    "optimisation": (
        "lr",
        "warmup_steps",
        "warmup_start_lr",
        "lr_schedule",
        "weight_decay",
        "max_grad_norm",
        "adam_betas",
        "adam_eps",
        "skip_zero_signal",
    ),
    "batches": (
        "steps",
        "updates",
        "questions_per_step",
        "group_size",
        "epochs",
        "minibatch_size",
        "minibatch_plan",
        "micro_batch_size",
        "length_buckets",
        "shared_prefix",
        "filter_groups",
        "max_gen_batches",
        "batch_size",
        "demos",
        "demo_episodes",
        "demonstrator",
        "keep_unrewarded",
        "use_vllm",
        "vllm_mode",
    ),
    "loss": (
        "temperature",
        "advantage",
        "loss_type",
        "clip_eps",
        "ratio_cap",
        "kl_value_cap",
        "kl_coef",
        "entropy_coef",
        "sapo_coef",
        "sapo_threshold",
        "loss_term",
        "loss_term_coef",
        "rescore_pi_old",
    ),
    "LLDS": (
        "llds",
        "llds_coef",
        "llds_ma",
        "llds_ma_beta",
        "llds_ma_schedule",
        "llds_ledger",
        "ledger_lambda",
        "ledger_batch",
    ),
    "diagnostics": (
        "probe_size",
        "probe_demos",
        "onpolicy_probe_size",
        "onpolicy_probe_episodes",
        "onpolicy_heldout_split",
        "probe_every",
        "ledger_size",
        "warning_window",
        "log_gns",
    ),
    "evaluation": ("eval_split", "eval_questions", "eval_batch", "eval_at_start", "eval_every"),
}
"""The ``--help`` sections of the training commands: each field's section (a field in none goes under
"other options")."""


class _Deprecated(argparse.Action):
    """An old flag that still sets its field, and says once on stderr which flag replaced it."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(f"searchgym: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_config_arguments(parser: argparse.ArgumentParser, cls: type[CommonConfig]) -> None:
    """Adds one option per field of ``cls``, with the field's help, type, choices and default, in the
    :data:`SECTIONS` of ``--help``.

    ``bool`` fields become ``--x / --no-x``; ``Literal`` fields get ``choices``; ``X | None`` fields take
    an ``X``. Defaults are the field defaults, so ``--help`` shows them.
    """
    hints = typing.get_type_hints(cls)
    section_of = {name: title for title, names in SECTIONS.items() for name in names}
    used = {section_of.get(f.name, "other options") for f in dataclasses.fields(cls)}
    groups = {t: parser.add_argument_group(t) for t in (*SECTIONS, "other options") if t in used}
    for f in dataclasses.fields(cls):
        title = section_of.get(f.name, "other options")
        kind = hints[f.name]
        flags = [_flag(f.name), *f.metadata.get("flags", ())]
        kwargs: dict[str, Any] = {"default": f.default, "help": f.metadata.get("help", ""), "dest": f.name}
        origin = get_origin(kind)
        if origin in (typing.Union, types.UnionType):
            kind = next(a for a in get_args(kind) if a is not type(None))
            origin = get_origin(kind)
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif origin is Literal:
            kwargs["choices"] = list(get_args(kind))
        else:
            kwargs["type"] = kind
        groups[title].add_argument(*flags, **kwargs)
        for old in f.metadata.get("deprecated", ()):
            extra = {"type": kwargs["type"]} if "type" in kwargs else {}
            parser.add_argument(
                old, dest=f.name, action=_Deprecated, help=argparse.SUPPRESS, new=flags[0], **extra
            )


def config_from_args(cls: type[C], args: argparse.Namespace, **overrides: Any) -> C:
    """Builds (and so validates) ``cls`` from parsed options; ``overrides`` win."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return cls(**{**values, **overrides})
