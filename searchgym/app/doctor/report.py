"""What ``searchgym doctor`` and ``searchgym conform`` report: one :class:`Check` per line, its mark, and the
report as text or JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Literal

__all__ = ["MARKS", "Check", "Status", "exit_code", "fail", "format_check", "ok", "report_json"]

Status = Literal["ok", "fail", "warn", "skip"]
MARKS: dict[str, str] = {"ok": "ok", "fail": "FAIL", "warn": "warn", "skip": "skip"}


@dataclass(frozen=True)
class Check:
    """The outcome of one check.

    Attributes:
        name: What was checked (``"python"``, ``"torch"``, ``"extra trl"`` …).
        status: ``"ok"``; ``"fail"``; ``"warn"`` (works, with a caveat); ``"skip"`` (not asked for, or an
            optional part that is not installed).
        required: A failure makes ``searchgym doctor`` exit 1; an optional check never does.
        detail: What was found.
        fix: What to do about a failure, a warning or a missing optional part (``None``: nothing to do).
    """

    name: str
    status: Status
    required: bool
    detail: str
    fix: str | None = None

    @property
    def failed(self) -> bool:
        """A required check that failed."""
        return self.required and self.status == "fail"


def exit_code(checks: list[Check]) -> int:
    """1 when a required check failed, else 0."""
    return int(any(c.failed for c in checks))


def format_check(check: Check) -> str:
    """One report line: the status mark, the check's name, what was found and what to do."""
    line = f"{MARKS[check.status]:<4}  {check.name:<18} {check.detail}"
    if check.fix:
        line += f"; {'to enable' if check.status == 'skip' else 'fix'}: {check.fix}"
    return line


def report_json(checks: list[Check]) -> str:
    """The report as one JSON object: ``ok`` (no required check failed) and the list of ``checks``."""
    return json.dumps({"ok": exit_code(checks) == 0, "checks": [asdict(c) for c in checks]}, indent=2)


def ok(name: str, detail: str) -> Check:
    """A required check that passed."""
    return Check(name, "ok", True, detail)


def fail(name: str, detail: str, fix: str | None = None) -> Check:
    """A required check that failed."""
    return Check(name, "fail", True, detail, fix)
