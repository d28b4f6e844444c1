"""The parameters of a study's definition and criterion kinds: how each protocol value is checked and
converted (:class:`Param`), with one converter per sort of value. Every converter takes the value and where
it was read (for the error), and raises :class:`~searchgym.errors.ConfigError` naming both."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from searchgym.errors import ConfigError

__all__ = [
    "COMPARISON",
    "EVENT_BOUND",
    "REQUIRED",
    "RULE",
    "Param",
    "as_count",
    "as_flag",
    "as_names",
    "as_real",
    "as_text",
    "at_step",
    "bound",
    "choice",
    "rules",
    "window",
    "windows",
]

REQUIRED = object()
"""The default of a parameter a protocol must give."""


@dataclass(frozen=True)
class Param:
    """One parameter of a kind: how a protocol value is checked and converted, its default (or required)."""

    convert: Callable[[Any, str], Any]
    default: Any = REQUIRED
    help: str = ""


def as_text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def as_real(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    return float(value)


def as_count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}: expected an integer >= 0, got {value!r}")
    return value


def as_flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    return value


def as_names(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: expected a name or a list of names, got {value!r}")
    return tuple(value)


def choice(*choices: str) -> Callable[[Any, str], str]:
    def convert(value: Any, where: str) -> str:
        if value not in choices:
            raise ConfigError(f"{where}: expected one of {list(choices)}, got {value!r}")
        return str(value)

    return convert


def window(value: Any, where: str) -> tuple[int, int] | str:
    """Steps ``[first, last]`` (both included) or ``"second_half"`` (steps after half the run)."""
    if value == "second_half":
        return "second_half"
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and 0 <= value[0] <= value[1]
    ):
        return (value[0], value[1])
    raise ConfigError(f'{where}: expected [first, last] steps or "second_half", got {value!r}')


EVENT_BOUND = re.compile(r"event(?:\s*([+-])\s*(\d+))?")


def bound(value: Any, where: str) -> int | tuple[str, int]:
    """A window bound: a step, or ``"event"``, ``"event-15"``, ``"event+14"`` (relative to the event)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = EVENT_BOUND.fullmatch(value.strip()) if isinstance(value, str) else None
    if m is None:
        raise ConfigError(f'{where}: expected a step or "event", "event-N", "event+N", got {value!r}')
    offset = int(m.group(2) or 0) * (-1 if m.group(1) == "-" else 1)
    return ("event", offset)


def windows(value: Any, where: str) -> tuple[tuple[Any, Any], ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: expected a list of [first, last] windows, got {value!r}")
    out = []
    for i, w in enumerate(value):
        if not isinstance(w, list) or len(w) != 2:
            raise ConfigError(f"{where}[{i}]: expected [first, last], got {w!r}")
        out.append((bound(w[0], f"{where}[{i}]"), bound(w[1], f"{where}[{i}]")))
    return tuple(out)


COMPARISON = {">": float.__gt__, "<": float.__lt__, ">=": float.__ge__, "<=": float.__le__}
RULE = re.compile(r"\s*(?P<metric>[^:]+?)\s*:\s*(?P<chain>W\d+(?:\s*(?:>=|<=|>|<)\s*W\d+)+)\s*")


def rules(value: Any, where: str) -> tuple[tuple[str, tuple[tuple[int, str, int], ...]], ...]:
    """Chained comparisons of window means, ``"lld/delta_adv_pos: W1 > W2 > W3"`` (W1 = the first window)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ConfigError(f'{where}: expected rules such as "train/grad_norm: W3 > W2", got {value!r}')
    out = []
    for rule in value:
        m = RULE.fullmatch(rule) if isinstance(rule, str) else None
        if m is None:
            raise ConfigError(f'{where}: cannot read the rule {rule!r}; write "METRIC: W1 > W2 > W3"')
        parts = re.split(r"\s*(>=|<=|>|<)\s*", m.group("chain"))
        idx = [int(p[1:]) - 1 for p in parts[0::2]]
        out.append((m.group("metric"), tuple(zip(idx[:-1], parts[1::2], idx[1:], strict=True))))
    return tuple(out)


def at_step(value: Any, where: str) -> int | str:
    if value == "end" or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    raise ConfigError(f'{where}: expected "end" or a step, got {value!r}')
