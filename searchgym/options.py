"""Options as typed values: a dataclass field declares its default, help and flags once
(:func:`option`), and a ``Literal`` annotation its choices (:func:`literal_choices`, :func:`check_choices`).

The environments' :class:`~searchgym.envs.EnvSpec` and every trainer's config declare their fields with
these; the CLI builds its options from the same fields (:mod:`searchgym.app.cli._options`), so an option's help is
written once. Torch-free and import-light, so ``envs/`` and ``searchgym --help`` can use it.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import field
from typing import Any, Literal, get_args

import numpy as np

from searchgym.errors import ConfigError

__all__ = [
    "NO_LIMIT",
    "bounds_text",
    "check_bounds",
    "check_choices",
    "flat_options",
    "flat_values",
    "from_flat_value",
    "gather_options",
    "is_section",
    "literal_choices",
    "option",
    "option_name",
    "section",
    "section_type",
]


NO_LIMIT = 2**63 - 1
"""The upper end of an integer option's ``bounds`` that has none (a float option's is ``math.inf``)."""


def option(
    default: Any,
    help: str,
    *flags: str,
    deprecated: tuple[str, ...] = (),
    bounds: tuple[float, float] | None = None,
    name: str | None = None,
) -> Any:
    """A config field with its CLI help (and optional extra flags, e.g. ``--lambda``): every entry point's
    dataclass declares its fields with it, so ``--help`` is written once.

    ``deprecated`` flags still set the field, and say on stderr which flag to use instead. ``bounds`` are the
    field's inclusive range, checked by :func:`check_bounds` and shown in ``--help`` (:func:`bounds_text`):
    integers when both ends are (:data:`NO_LIMIT` for no upper end), else finite numbers (``math.inf``). ``name`` is the option's name on the command line and in flat configs, where it differs from
    the field's (a section's field, e.g. LLDS's ``gate`` is ``--llds``)."""
    metadata: dict[str, Any] = {"help": help, "flags": flags, "deprecated": deprecated}
    if name is not None:
        metadata["name"] = name
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
            raise ConfigError(f"unknown {option_name(f)} {value!r}; choose one of {list(choices)}")


def _unbounded(high: float) -> bool:
    return high >= NO_LIMIT


def bounds_text(bounds: tuple[float, float]) -> str:
    """A range as ``--help`` and the error of :func:`check_bounds` say it: ``>= 1``, or ``>= 1 and <= 1024``."""
    low, high = bounds
    return f">= {low}" if _unbounded(high) else f">= {low} and <= {high}"


def check_bounds(config: Any) -> None:
    """Every field declared with ``bounds`` lies in them (``None`` is allowed where the default is ``None``);
    NumPy numbers become plain ones. Works on frozen dataclasses too.

    Raises:
        ConfigError: a value is of the wrong kind or out of range; the message names the option
            (:func:`option_name`) and gives the range.
    """
    for f in dataclasses.fields(config):
        if "bounds" not in f.metadata:
            continue
        low, high = f.metadata["bounds"]
        name = option_name(f)
        value = getattr(config, f.name)
        optional = f.default is None
        if value is None and optional:
            continue
        none = " or None" if optional else ""
        integer = isinstance(low, int) and isinstance(high, int)
        kind = (int, np.integer) if integer else (int, float, np.integer, np.floating)
        if not isinstance(value, kind) or isinstance(value, bool | np.bool_):
            what = "an integer" if integer else "a number"
            where = f">= {low}" if _unbounded(high) else f"in [{low}, {high}]"
            raise ConfigError(f"{name} must be {what} {where}{none}, got {value!r:.40}")
        if not (low <= value <= high and math.isfinite(value)):
            raise ConfigError(f"{name} must be {bounds_text((low, high))}{none}, got {value}")
        object.__setattr__(config, f.name, int(value) if integer else float(value))


def option_name(f: dataclasses.Field[Any]) -> str:
    """A field's option name: its flag without ``--`` and its key in a flat config (default: the field's
    name; a section's field may take another, e.g. LLDS's ``gate`` is ``llds``)."""
    return str(f.metadata.get("name") or f.name)


def section(default: Any, title: str) -> Any:
    """A config field holding a section: a frozen dataclass of options, ``default`` its value, ``title`` its
    group in ``--help``."""
    return field(default=default, metadata={"section": title})


def is_section(f: dataclasses.Field[Any]) -> bool:
    """Whether a config field holds a section (:func:`section`)."""
    return "section" in f.metadata


def section_type(f: dataclasses.Field[Any]) -> type[Any]:
    """The dataclass a section field holds (the type of its default)."""
    return type(f.default)


def flat_options(cls: type[Any]) -> dict[str, tuple[str | None, dataclasses.Field[Any], Any]]:
    """Every option of a config class by its option name: ``(section, field, type hint)``, ``section`` the
    name of the section field that holds it (``None`` for a field of the class itself).

    Raises:
        ConfigError: two fields share an option name (each flag must set one field).
    """
    out: dict[str, tuple[str | None, dataclasses.Field[Any], Any]] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if is_section(f):
            inner = typing.get_type_hints(section_type(f))
            entries: list[tuple[str | None, dataclasses.Field[Any], Any]] = [
                (f.name, g, inner[g.name]) for g in dataclasses.fields(section_type(f))
            ]
        else:
            entries = [(None, f, hints[f.name])]
        for where, g, hint in entries:
            name = option_name(g)
            if name in out:
                raise ConfigError(f"{cls.__name__}: two fields share the option {name!r}")
            out[name] = (where, g, hint)
    return out


def _optional_choice(hint: Any) -> bool:
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in get_args(hint)
    return optional and bool(literal_choices(hint))


def from_flat_value(hint: Any, value: Any) -> Any:
    """A flat value as the field holds it: ``"none"`` is ``None`` for an optional choice (``--llds none``)."""
    return None if value == "none" and _optional_choice(hint) else value


def flat_values(config: Any) -> dict[str, Any]:
    """A sectioned config as one value per option name, each as the CLI writes it (``None`` of an optional
    choice as ``"none"``): what a run's manifest records and a resume compares."""
    values = {}
    for name, (where, f, hint) in flat_options(type(config)).items():
        value = getattr(getattr(config, where) if where else config, f.name)
        values[name] = "none" if value is None and _optional_choice(hint) else value
    return values


def gather_options(cls: type[Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """The field values of a sectioned config class from ``values``: the one conversion of options given by
    name (the CLI, a study protocol, a flat config of an older checkpoint) into sections.

    ``values`` maps option names (:func:`option_name`) to values; a section's name may instead map to the
    section itself (an instance) or to a mapping of its fields (a sectioned config as stored). A section
    not given starts from its default; fields not given keep their defaults.

    Raises:
        ConfigError: an unknown name (the message lists the valid ones).
    """
    options = flat_options(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    whole = {
        k: v
        for k, v in values.items()
        if k in fields and is_section(fields[k]) and isinstance(v, (section_type(fields[k]), Mapping))
    }
    unknown = sorted(set(values) - set(options) - set(whole))
    if unknown:
        raise ConfigError(f"unknown options {unknown}; valid: {sorted(options)}")
    changes: dict[str, dict[str, Any]] = {name: {} for name, f in fields.items() if is_section(f)}
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in whole:
            continue
        where, f, hint = options[name]
        if where is None:
            out[f.name] = value
        else:
            changes[where][f.name] = from_flat_value(hint, value)
    for name, f in fields.items():
        if is_section(f):
            base = whole.get(name, f.default)
            if isinstance(base, Mapping):
                base = section_type(f)(**{**dict(base), **changes[name]})
            elif changes[name]:
                base = dataclasses.replace(base, **changes[name])
            out[name] = base
        elif name not in out:
            if f.default is not dataclasses.MISSING:
                out[name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[name] = f.default_factory()
    return out
