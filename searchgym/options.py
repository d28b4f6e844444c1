"""Options as typed values: a dataclass field declares its default, help and flags once
(:func:`option`), and a ``Literal`` annotation its choices (:func:`literal_choices`, :func:`check_choices`).

The environments' :class:`~searchgym.envs.EnvSpec` and every trainer's config declare their fields with
these; the CLI builds its options from the same fields (:mod:`searchgym.cli._options`), so an option's help is
written once. Torch-free and import-light, so ``envs/`` and ``searchgym --help`` can use it.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import field
from typing import Any, Literal, get_args

import numpy as np

from searchgym.errors import ConfigError

__all__ = ["check_bounds", "check_choices", "literal_choices", "option"]


def option(
    default: Any,
    help: str,
    *flags: str,
    deprecated: tuple[str, ...] = (),
    bounds: tuple[float, float] | None = None,
) -> Any:
    """A config field with its CLI help (and optional extra flags, e.g. ``--lambda``): every entry point's
    dataclass declares its fields with it, so ``--help`` is written once.

    ``deprecated`` flags still set the field, and say on stderr which flag to use instead. ``bounds`` are the
    field's inclusive range, checked by :func:`check_bounds`: integers when both ends are, else finite
    numbers."""
    metadata: dict[str, Any] = {"help": help, "flags": flags, "deprecated": deprecated}
    if bounds is not None:
        metadata["bounds"] = bounds
    return field(default=default, metadata=metadata)


def literal_choices(hint: Any) -> tuple[Any, ...]:
    """The values a ``Literal`` annotation (or an optional one, ``Literal[...] | None``) allows; ``()`` for any
    other annotation."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next((a for a in get_args(hint) if a is not type(None)), hint)
    return get_args(hint) if typing.get_origin(hint) is Literal else ()


def check_choices(config: Any) -> None:
    """Every ``Literal`` field of a config dataclass holds one of its choices: the one rule behind
    ``--help``'s choices and the configs built in code.

    Raises:
        ConfigError: a field holds another value; the message lists the choices.
    """
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        choices = literal_choices(hints[f.name])
        value = getattr(config, f.name)
        if choices and value is not None and value not in choices:
            raise ConfigError(f"unknown {f.name} {value!r}; choose one of {list(choices)}")


def check_bounds(config: Any) -> None:
    """Every field declared with ``bounds`` lies in them (``None`` is allowed where the default is ``None``);
    NumPy numbers become plain ones. Works on frozen dataclasses too.

    Raises:
        ConfigError: a value is of the wrong kind or out of range; the message gives the range.
    """
    for f in dataclasses.fields(config):
        if "bounds" not in f.metadata:
            continue
        low, high = f.metadata["bounds"]
        value = getattr(config, f.name)
        optional = f.default is None
        if value is None and optional:
            continue
        none = " or None" if optional else ""
        integer = isinstance(low, int) and isinstance(high, int)
        kind = (int, np.integer) if integer else (int, float, np.integer, np.floating)
        if not isinstance(value, kind) or isinstance(value, bool | np.bool_):
            what = "an integer" if integer else "a number"
            raise ConfigError(f"{f.name} must be {what} in [{low}, {high}]{none}, got {value!r:.40}")
        if not (low <= value <= high and math.isfinite(value)):
            raise ConfigError(f"{f.name} must be >= {low} and <= {high}{none}, got {value}")
        object.__setattr__(config, f.name, int(value) if integer else float(value))
