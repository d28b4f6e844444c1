"""The training commands' options, built from the config dataclasses' fields (help, type, choices and
default written once, in the field), in the sections of ``--help``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from collections.abc import Iterable
from typing import Any, Literal, TypeVar, get_args, get_origin

from searchgym.agents.training.config import TrainConfig
from searchgym.options import bounds_text, flat_options, is_section, option_name, section_type

__all__ = ["add_config_arguments", "add_field_arguments", "config_from_args"]

C = TypeVar("C", bound=TrainConfig)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class Deprecated(argparse.Action):
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


def _option_kind(hint: Any) -> dict[str, Any]:
    """The ``add_argument`` keywords of a field's annotation: ``bool`` becomes ``--x / --no-x``, a ``Literal``
    its ``choices``, ``X | None`` (or a union with objects only code can pass, e.g. ``str | Retriever``) the
    first of ``str``, ``int``, ``float`` it allows, ``Any`` a string."""
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        hint = next((a for a in args if a in (str, int, float)), None) or next(
            (a for a in args if get_origin(a) is Literal), args[0]
        )
        origin = get_origin(hint)
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin is Literal:
        return {"choices": list(get_args(hint))}
    return {"type": hint if hint in (str, int, float) else str}


def add_field_arguments(
    group: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type[Any],
    defaults: Any = None,
    *,
    unset: Iterable[str] = (),
    names: Iterable[str] | None = None,
) -> None:
    """Adds one option per field of the dataclass ``cls`` (or of ``names`` only), with the field's help,
    its declared bounds (:func:`searchgym.options.bounds_text`), type and choices (:func:`_option_kind`).

    The default is the field's, or ``defaults``' value of it (an instance of ``cls``); the fields named in
    ``unset`` default to ``None`` (not given) and their help names the default instead, so the caller can
    tell whether they were given."""
    hints = typing.get_type_hints(cls)
    wanted = set(names) if names is not None else None
    for f in dataclasses.fields(cls):
        name = option_name(f)
        if wanted is not None and name not in wanted:
            continue
        default = getattr(defaults, f.name) if defaults is not None else f.default
        kwargs: dict[str, Any] = {
            "help": f.metadata.get("help", ""),
            "dest": name,
            **_option_kind(hints[f.name]),
        }
        if "bounds" in f.metadata:  # the range check_bounds holds the field to, as its error says it
            kwargs["help"] += f" ({bounds_text(f.metadata['bounds'])})"
        if "choices" in kwargs and type(None) in get_args(hints[f.name]):
            # an optional choice: "none" stands for None (gather_options reads it so)
            kwargs["choices"] = ["none", *kwargs["choices"]]
            default = "none" if default is None else default
        if name in unset:
            shown = "none" if default is None else default
            kwargs["help"] += f" (default: {shown})" if "default:" not in kwargs["help"] else ""
            kwargs["default"] = None
        else:
            kwargs["default"] = default
        flags = [_flag(name), *f.metadata.get("flags", ())]
        group.add_argument(*flags, **kwargs)
        for old in f.metadata.get("deprecated", ()):
            extra = {"type": kwargs["type"]} if "type" in kwargs else {}
            group.add_argument(
                old, dest=name, action=Deprecated, help=argparse.SUPPRESS, new=flags[0], **extra
            )


def add_config_arguments(parser: argparse.ArgumentParser, cls: type[TrainConfig]) -> None:
    """Adds one option per option of ``cls`` (:func:`add_field_arguments`), one ``--help`` group per
    section (its title; sections of one title share a group), minus those ``cls.CLI_OMITS`` leaves out.
    Defaults are the section defaults of ``cls``, so ``--help`` shows them."""
    omit = set(getattr(cls, "CLI_OMITS", ()))
    parts: dict[str, list[tuple[type[Any], Any, list[str]]]] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if is_section(f):
            names = [
                option_name(g) for g in dataclasses.fields(section_type(f)) if option_name(g) not in omit
            ]
            parts.setdefault(f.metadata["section"], []).append((section_type(f), f.default, names))
        elif f.name not in omit:
            parts.setdefault("other options", []).append((cls, None, [f.name]))
    for title, owners in parts.items():
        group = parser.add_argument_group(title)
        for owner, defaults, names in owners:
            add_field_arguments(group, owner, defaults, names=names)


def config_from_args(cls: type[C], args: argparse.Namespace, **overrides: Any) -> C:
    """Builds (and so validates) ``cls`` from parsed options; ``overrides`` win."""
    values = {name: getattr(args, name) for name in flat_options(cls) if hasattr(args, name)}
    return cls(**{**values, **overrides})
