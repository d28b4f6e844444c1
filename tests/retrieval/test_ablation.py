"""Retriever ablations: empty, random and shuffled results, each a function of the query alone, and their
specs and bad names."""

from __future__ import annotations

from typing import Any

import pytest

from searchgym.errors import ConfigError
from searchgym.retrieval import make_retriever
from searchgym.retrieval.ablation import AblatedRetriever, ablation_spec, parse_ablation_spec, parse_ablations


def questions(world: Any) -> list[str]:
    return [q.question for q in world.questions("test")]


def test_empty_gives_nothing(world: Any, retriever: Any) -> None:
    ablated = AblatedRetriever("empty", retriever, world.passages)
    assert ablated.search(["anything", "else"], 3) == [[], []]


def test_random_draws_distinct_corpus_passages_fixed_by_the_query(world: Any, retriever: Any) -> None:
    ablated = AblatedRetriever("random", retriever, world.passages)
    first, again, other = ablated.search(["a query", "a query", "another"], 3)
    assert [h.passage_id for h in first] == [h.passage_id for h in again]
    assert len({h.passage_id for h in first}) == 3 and first != other
    assert all(h.passage_id in world.passage_index for h in first)


def test_shuffled_gives_another_questions_passages(world: Any, retriever: Any) -> None:
    texts = questions(world)
    ablated = AblatedRetriever("shuffled", retriever, world.passages, lambda: texts)
    for query in texts[:10]:
        own = {h.passage_id for h in retriever.search([query], 3)[0]}
        (hits,) = ablated.search([query], 3)
        assert len(hits) == 3 and not own & {h.passage_id for h in hits}
        assert hits == ablated.search([query], 3)[0]  # the same query, the same other question


def test_specs_build_ablations_through_make_retriever(world: Any) -> None:
    spec = ablation_spec("shuffled", "bm25")
    assert spec == "ablate:shuffled;bm25" and parse_ablation_spec(spec) == ("shuffled", "bm25")
    built = make_retriever(spec, world.passages, questions=lambda: questions(world))
    assert isinstance(built, AblatedRetriever) and built.kind == "shuffled"
    assert len(built.search(["Who founded it?"], 2)[0]) == 2


def test_ablation_names_are_checked(world: Any, retriever: Any) -> None:
    assert parse_ablations("shuffled, empty") == ["empty", "shuffled"]
    with pytest.raises(ConfigError, match="unknown ablation 'blank'; choose from empty, random, shuffled"):
        parse_ablations("empty,blank")
    with pytest.raises(ConfigError, match="unknown ablation"):
        parse_ablation_spec("ablate:nothing;bm25")
    with pytest.raises(ConfigError, match="needs the dataset's questions"):
        AblatedRetriever("shuffled", retriever, world.passages).search(["q"], 1)
