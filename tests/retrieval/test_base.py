"""``searchgym/retrieval/base.py``: what a hit carries."""

from __future__ import annotations

from searchgym.retrieval import Hit


def test_hit_contents_default_to_the_flashrag_form() -> None:
    assert Hit("1", "T", "x", 0.0).contents == '"T"\nx'
    assert Hit("1", "T", "x", 0.0, "T\nx").contents == "T\nx"
