"""The config dataclasses' one rule for choices: every ``Literal`` field refuses a value outside it."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from searchgym.agents.grpo.config import GRPOConfig
from searchgym.agents.integrations.config import TRLConfig
from searchgym.agents.training.config import SFTConfig, TrainConfig
from searchgym.errors import ConfigError, MissingDependencyError, install_command
from searchgym.options import flat_options, literal_choices, option, section

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
