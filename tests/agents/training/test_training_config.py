"""The config dataclasses' one rule for choices: every ``Literal`` field refuses a value outside it."""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any

import pytest

from searchgym.agents.grpo.config import GRPOConfig
from searchgym.agents.integrations.config import TRLConfig
from searchgym.agents.training.config import SFTConfig, TrainConfig
from searchgym.errors import ConfigError, MissingDependencyError, install_command
from searchgym.options import NO_LIMIT, bounds_text, flat_options, literal_choices, option, section

CONFIGS = (TrainConfig, SFTConfig, GRPOConfig, TRLConfig)
CASES = [
    (cls, name, literal_choices(hint))
    for cls in CONFIGS
    for name, (_, _, hint) in flat_options(cls).items()
    if literal_choices(hint)
]


def test_every_trainer_has_choice_fields() -> None:
    names = {(cls.__name__, name) for cls, name, _ in CASES}
    assert {("GRPOConfig", "llds"), ("GRPOConfig", "advantage"), ("TRLConfig", "loss_type")} <= names
    assert {("SFTConfig", "lr_schedule"), ("TrainConfig", "dtype"), ("TRLConfig", "prompt_style")} <= names


@pytest.mark.parametrize(("cls", "name", "choices"), CASES, ids=[f"{c.__name__}.{n}" for c, n, _ in CASES])
def test_a_value_outside_a_literal_field_is_refused_naming_the_choices(
    cls: type[Any], name: str, choices: tuple[Any, ...]
) -> None:
    message = f"unknown {name} 'not-a-choice'; choose one of {list(choices)!r}"
    with pytest.raises(ConfigError, match=re.escape(message)):
        cls(**{name: "not-a-choice"})
    for value in choices:  # and every choice is accepted on its own (other fields at their defaults)
        try:
            cls(**{name: value})
        except ConfigError as e:
            assert name not in str(e).split(";")[0], e
        except MissingDependencyError as e:  # a choice that needs an optional package names its extra
            assert (name, value) == ("report_to", "wandb") and install_command("wandb") in str(e)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_no_two_fields_share_a_flag(cls: type[Any]) -> None:
    options = flat_options(cls)  # refuses two fields with one option name
    flags = [
        flag
        for name, (_, f, _) in options.items()
        for flag in (
            f"--{name.replace('_', '-')}",
            *f.metadata.get("flags", ()),
            *f.metadata.get("deprecated", ()),
        )
    ]
    assert len(flags) == len(set(flags)), sorted(f for f in flags if flags.count(f) > 1)


@dataclasses.dataclass(frozen=True)
class _Part:
    lr: float = option(1.0, "a second learning rate")


@dataclasses.dataclass
class _Clash:
    lr: float = option(1.0, "learning rate")
    part: _Part = section(_Part(), "part")  # noqa: RUF009 - a frozen dataclass


def test_a_section_field_named_like_another_option_is_refused() -> None:
    with pytest.raises(ConfigError, match="two fields share the option 'lr'"):
        flat_options(_Clash)


def _config_kinds() -> list[Any]:
    """One instance of every config kind: each trainer's config, every section it holds, and the other
    option dataclasses (the env spec, SB3's, the benchmarks', the world's)."""
    from searchgym.app.bench.retrieval import RetrievalBenchConfig
    from searchgym.app.cli.train_sb3 import SB3TrainConfig
    from searchgym.data.world import WorldConfig
    from searchgym.envs.spec import EnvSpec

    kinds: dict[str, Any] = {}
    for cls in CONFIGS:
        config = cls()
        kinds[cls.__name__] = config
        for f in dataclasses.fields(config):
            section_value = getattr(config, f.name)
            kinds[type(section_value).__name__] = section_value
    for other in (EnvSpec(), SB3TrainConfig(algo="ppo"), RetrievalBenchConfig(), WorldConfig()):
        kinds[type(other).__name__] = other
    return list(kinds.values())


KINDS = _config_kinds()


@pytest.mark.parametrize("config", KINDS, ids=[type(c).__name__ for c in KINDS])
def test_assigning_to_a_field_of_a_config_is_refused(config: Any) -> None:
    name = dataclasses.fields(config)[0].name
    value = getattr(config, name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config, name, value)
    assert getattr(config, name) is value


def test_every_config_kind_is_covered_and_replace_gives_a_checked_copy() -> None:
    names = {type(c).__name__ for c in KINDS}
    assert {"TrainConfig", "GRPOConfig", "TRLConfig", "SFTConfig", "EnvSpec", "LLDSConfig"} <= names
    assert {"GRPOBatchConfig", "GRPOLossConfig", "TRLEngineConfig", "SFTOptions", "SamplerConfig"} <= names
    config = GRPOConfig()
    varied = dataclasses.replace(config, batch=dataclasses.replace(config.batch, length_buckets=False))
    assert varied.batch.length_buckets is False and config.batch.length_buckets is True
    assert varied.loss == config.loss and type(varied) is GRPOConfig
    with pytest.raises(ConfigError, match="group_size must be >= 2"):
        dataclasses.replace(config.batch, group_size=1)


BOUNDED = [
    (cls, name, f.metadata["bounds"])
    for cls in CONFIGS
    for name, (_, f, _) in flat_options(cls).items()
    if "bounds" in f.metadata
]


def test_the_range_checks_are_declared_bounds() -> None:
    names = {(cls.__name__, name) for cls, name, _ in BOUNDED}
    assert {("GRPOConfig", "steps"), ("GRPOConfig", "eval_questions"), ("GRPOConfig", "llds_coef")} <= names
    assert {("SFTConfig", "epochs"), ("TRLConfig", "warning_window"), ("TRLConfig", "entropy_coef")} <= names
    assert {("TrainConfig", "threads"), ("TrainConfig", "topk"), ("GRPOConfig", "ledger_batch")} <= names
    assert len({name for _, name, _ in BOUNDED}) >= 40


@pytest.mark.parametrize(("cls", "name", "bounds"), BOUNDED, ids=[f"{c.__name__}.{n}" for c, n, _ in BOUNDED])
def test_a_value_outside_declared_bounds_is_refused_naming_the_option_and_the_range(
    cls: type[Any], name: str, bounds: tuple[float, float]
) -> None:
    low, high = bounds
    integer = isinstance(low, int) and isinstance(high, int)
    outside = [low - 1 if integer else low - 0.5]
    if high < NO_LIMIT:
        outside.append(high + 1 if integer else high * 2)
    for value in outside:
        with pytest.raises(
            ConfigError, match=rf"^{re.escape(name)} must be {re.escape(bounds_text(bounds))}"
        ):
            cls(**{name: value})
    kind = "an integer" if integer else "a number"
    with pytest.raises(ConfigError, match=rf"^{re.escape(name)} must be {kind} "):
        cls(**{name: "3"})


@pytest.mark.parametrize("command", ["grpo", "sft", "trl"])
def test_declared_bounds_are_shown_in_help(command: str) -> None:
    from searchgym.app.cli import build_parser

    cls = {"grpo": GRPOConfig, "sft": SFTConfig, "trl": TRLConfig}[command]
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
    train = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    helps = {a.dest: a.help or "" for a in train._actions if a.help != argparse.SUPPRESS}
    omitted = set(getattr(cls, "CLI_OMITS", ()))
    shown = [(n, b) for c, n, b in BOUNDED if c is cls and n not in omitted]
    assert shown
    for name, bounds in shown:
        assert f"({bounds_text(bounds)})" in helps[name], (name, helps[name])
    assert "(>= 1)" in train.format_help() and "(>= 1 and <= 1024)" in train.format_help()
