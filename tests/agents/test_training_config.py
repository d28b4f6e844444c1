"""The config dataclasses' one rule for choices: every ``Literal`` field refuses a value outside it."""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Any

import pytest

from searchgym.agents.grpo.config import GRPOConfig
from searchgym.agents.integrations.config import TRLConfig
from searchgym.agents.training.config import CommonConfig, SFTConfig
from searchgym.errors import ConfigError, MissingDependencyError
from searchgym.options import literal_choices

CONFIGS = (CommonConfig, SFTConfig, GRPOConfig, TRLConfig)
CASES = [
    (cls, f.name, literal_choices(typing.get_type_hints(cls)[f.name]))
    for cls in CONFIGS
    for f in dataclasses.fields(cls)
    if literal_choices(typing.get_type_hints(cls)[f.name])
]


def test_every_trainer_has_choice_fields() -> None:
    names = {(cls.__name__, name) for cls, name, _ in CASES}
    assert {("GRPOConfig", "llds"), ("GRPOConfig", "advantage"), ("TRLConfig", "loss_type")} <= names
    assert {("SFTConfig", "lr_schedule"), ("CommonConfig", "dtype"), ("TRLConfig", "prompt_style")} <= names


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
            assert (name, value) == ("report_to", "wandb") and "searchgym[wandb]" in str(e)
