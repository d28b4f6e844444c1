"""Fuzzing every file loader (issues 12 and 22): typed searchgym errors or correct loads; never a raw
exception, a hang or a crash, and a silently different result only where no checksum can exist.

Each file kind is fuzzed in a child process (``fuzz_files_worker.py``), so a segfault fails the test
instead of killing pytest. The default run tries a handful of reproducible cases per kind; the ``fuzz``
marker selects the long run (400 random cases per kind): ``pytest -m fuzz -s`` prints each kind's counts
(the figures docs/security.md quotes).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("hypothesis")

WORKER = Path(__file__).with_name("fuzz_files_worker.py")
KINDS = [
    "checkpoint",
    "index",
    "dense",
    "jsonl",
    "parquet",
    "demos",
    "metrics",
    "cassette",
    "partial",
    "pairs",
]
NEEDS = {"checkpoint": "torch", "metrics": "torch", "parquet": "pyarrow", "dense": "faiss"}


def fuzz(kind: str, cases: int, tmp_path: Path, *extra: str) -> dict[str, object]:
    if kind in NEEDS:
        pytest.importorskip(NEEDS[kind])
    proc = subprocess.run(
        [sys.executable, str(WORKER), kind, str(cases), *extra],
        cwd=tmp_path,  # outside the repository root, whose folders would shadow the installed package
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode >= 0, f"the {kind} loader crashed the process (signal {-proc.returncode})"
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    check(summary)
    return summary


def check(summary: dict[str, Any]) -> None:
    """No raw exception, no hang, and silently different results only in families with no checksum."""
    outcomes = summary["outcomes"]
    assert outcomes["raw"] == 0 and outcomes["hang"] == 0, "\n".join(summary["examples"])
    silent = {name for name, counts in summary["families"].items() if counts.get("silently wrong")}
    unexplained = silent - set(summary["no_checksum"])
    assert not unexplained, f"silently wrong results where a checksum exists: {unexplained}; {summary}"


def test_the_check_catches_raw_errors_and_unexplained_silent_results() -> None:
    """Guards :func:`check` itself: the outcomes it must refuse."""
    clean = {
        "outcomes": {"typed error": 3, "same results": 2, "silently wrong": 1, "raw": 0, "hang": 0},
        "families": {"jsonl/bytes": {"silently wrong": 1}, "index/npz bytes": {"typed error": 3}},
        "no_checksum": {"jsonl/bytes": "the user's data"},
        "examples": [],
    }
    check(clean)
    for outcome in ("raw", "hang"):
        with pytest.raises(AssertionError):
            check({**clean, "outcomes": {**clean["outcomes"], outcome: 1}})
    with pytest.raises(AssertionError, match="where a checksum exists"):
        check({**clean, "families": {**clean["families"], "index/npz bytes": {"silently wrong": 1}}})


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_handful_of_mutated_files_per_kind(kind: str, tmp_path: Path) -> None:
    summary = fuzz(kind, 12, tmp_path, "--derandomize")
    assert int(summary["cases"]) >= 8


@pytest.mark.fuzz
@pytest.mark.parametrize("kind", KINDS)
def test_hundreds_of_mutated_files_per_kind(kind: str, tmp_path: Path) -> None:
    summary = fuzz(kind, 400, tmp_path)
    assert int(summary["cases"]) >= 300, summary
    print(json.dumps({k: summary[k] for k in ("kind", "cases", "outcomes", "families")}))
