"""What the retrieval tests share: a small saved BM25 index."""

from __future__ import annotations

from pathlib import Path

from searchgym.data import Passage
from searchgym.retrieval import BM25Retriever


def bm25_index(tmp_path: Path, k1: float = 0.9, name: str = "index") -> tuple[Path, list[Passage]]:
    """A BM25 index of 40 passages saved in ``tmp_path / name``, and its passages."""
    passages = [
        Passage(str(i), f"title {i}", f"alpha beta gamma {i} delta {i % 3} w{i % 7}") for i in range(40)
    ]
    return BM25Retriever(passages, k1=k1).save(tmp_path / name), passages
