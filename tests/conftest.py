"""Shared fixtures. Tests that read ../shared/data skip with a reason when it is absent."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

SHARED_DATA = Path(
    os.environ.get("SEARCHGYM_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)
HOTPOT = SHARED_DATA / "hotpotqa_dev_distractor_1100"
NQ = SHARED_DATA / "nq_open_oracle_2655"
QUICKSTART = SHARED_DATA / "flashrag_quickstart_nq"


def require(path: Path) -> Path:
    """Skips the calling test when a shared data folder is missing (users outside this workspace)."""
    if not (path / "corpus.jsonl").is_file():
        pytest.skip(f"shared data folder {path} is absent (set SEARCHGYM_SHARED_DATA to its parent)")
    return path


@pytest.fixture
def hotpot_dir() -> Path:
    return require(HOTPOT)


@pytest.fixture
def quickstart_dir() -> Path:
    return require(QUICKSTART)


@pytest.fixture(scope="session")
def world() -> Any:
    """The default generated world (seed 0), built once per test session."""
    from searchgym.data import generate_world

    return generate_world(seed=0)


@pytest.fixture(scope="session")
def retriever(world: Any) -> Any:
    """The default BM25 index over :func:`world`'s passages."""
    from searchgym.retrieval import BM25Retriever

    return BM25Retriever(world.passages)
