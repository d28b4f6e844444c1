"""Fuzzing every file loader (issue 12): only typed searchgym errors or correct loads, never a crash.

Each file kind is fuzzed in a child process (``fuzz_files_worker.py``), so a segfault fails the test
instead of killing pytest. The default run tries a handful of reproducible cases per kind; the ``fuzz``
marker selects the long run (400 random cases per kind): ``pytest -m fuzz``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("hypothesis")

WORKER = Path(__file__).with_name("fuzz_files_worker.py")
KINDS = ["checkpoint", "index", "jsonl", "parquet", "demos", "metrics"]
NEEDS = {"checkpoint": "torch", "metrics": "torch", "parquet": "pyarrow"}


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
    summary: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return summary


@pytest.mark.parametrize("kind", KINDS)
def test_a_handful_of_mutated_files_per_kind(kind: str, tmp_path: Path) -> None:
    summary = fuzz(kind, 12, tmp_path, "--derandomize")
    assert int(summary["cases"]) >= 8  # type: ignore[call-overload]


@pytest.mark.fuzz
@pytest.mark.parametrize("kind", KINDS)
def test_hundreds_of_mutated_files_per_kind(kind: str, tmp_path: Path) -> None:
    summary = fuzz(kind, 400, tmp_path)
    assert int(summary["cases"]) >= 300, summary  # type: ignore[call-overload]
    print(json.dumps(summary))
