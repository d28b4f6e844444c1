"""The tool-text token cache (``Tokenizer.encode_parts``): the ids always equal a fresh ``encode`` of the whole
text, the cache is bounded, and a passage rendered differently is a different entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.envs import EnvSpec
from searchgym.envs.episode import _DOCUMENT_CUT, Episode, Event, Turn
from searchgym.protocol import format_documents
from searchgym.retrieval.base import Hit
from searchgym.tokenization import Tokenizer, builtin_tokenizer, load_tokenizer

# Letters, digits, white space, punctuation and non-ASCII text (accents, CJK, combining marks, emoji), so the
# cuts meet every character class GPT-2's pre-tokenizer distinguishes.
ALPHABET = st.sampled_from([*"aZ9 .,'s\"\n\t\r-()<>/é–漢\u0301😀\u00a0\u2003", "'ll", "  ", "\n\n", "Doc"])
WORDS = st.lists(ALPHABET, max_size=12).map("".join)


def fresh(tok: Tokenizer) -> Tokenizer:
    """A private copy of ``tok`` so tests never share (or clear) the process-wide tokenizer's cache."""
    return load_tokenizer(tok._backend) if tok._hf is None else load_tokenizer(tok._hf)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(WORDS, st.sampled_from("aZ9")), min_size=1, max_size=8), WORDS)
def test_parts_give_the_ids_of_the_whole_text(middle: list[tuple[str, str]], last: str) -> None:
    """Every part but the first starts with a space and follows an ASCII letter or digit: a safe cut."""
    tok = fresh(builtin_tokenizer())
    parts = [("" if i == 0 else " ") + word + end for i, (word, end) in enumerate(middle)] + [" " + last]
    text = "".join(parts)
    for _ in range(2):  # cold, then from the cache
        assert tok.encode_parts(parts).tolist() == tok.encode(text)


def test_cuts_after_letters_and_digits_before_spaces_are_exact() -> None:
    tok = fresh(builtin_tokenizer())
    samples = [
        ["word", " next"],
        ["x9", " 12", " é", " 漢字", " 😀"],
        ["trailing space", "  \nDoc"],
        ["quote'", "s"],  # not a cut: the second part does not start with a space
        ["tab\tDoc", " 2(Title: x) y.\n\n"],
        ["end", " .</information>\n\n"],
        ["combining", " \u0301a"],
        ["nbsp", " \u00a0x"],
    ]
    for parts in samples:
        assert tok.encode_parts(parts).tolist() == tok.encode("".join(parts)), parts


def hits_of(passages: list[Any]) -> list[Hit]:
    return [Hit(p.id, p.title, p.text, 0.0, p.raw) for p in passages]


def check_deliveries(tok: Tokenizer, passages: list[Any], max_passage_words: int | None = None) -> None:
    """Every block of three consecutive passages, delivered through an Episode, holds the ids of encoding the
    block whole."""
    from searchgym.data.types import Question

    config = EnvSpec(max_context_tokens=16384, max_passage_words=max_passage_words)
    episode = Episode(tok, config)
    question = Question(id="q", question="who?", golden_answers=["x"])
    for i in range(0, len(passages) - 2, 3):
        hits = hits_of(passages[i : i + 3])
        episode.start(question)
        episode.pending_query = "who"  # as after a turn that asked for a search
        episode.turns = [Turn(episode.length, episode.length, "search", "who", "</search>")]
        before = episode.length
        assert episode.deliver(hits) == Event.TURN_END
        expected = tok.encode(format_documents([h.contents for h in hits], max_passage_words))
        assert episode.tokens[before : episode.length].tolist() == expected


def test_world_passages_are_token_exact(world: Any) -> None:
    check_deliveries(fresh(builtin_tokenizer()), world.passages[:600])


def test_hotpotqa_passages_are_token_exact(hotpot_dir: Path) -> None:
    from searchgym.data import load_dataset

    passages = load_dataset(str(hotpot_dir)).passages
    tok = fresh(builtin_tokenizer())
    check_deliveries(tok, passages[:3000])
    check_deliveries(tok, passages[:600], max_passage_words=20)
    check_deliveries(tok, passages[::-1][:600])  # the same passages at other ranks


def test_transformers_wrapped_tokenizer_is_token_exact(world: Any) -> None:
    pytest.importorskip("transformers")
    check_deliveries(fresh(load_tokenizer(builtin_tokenizer().to_transformers())), world.passages[:150])


def test_other_pre_tokenizers_cache_whole_texts() -> None:
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, pre_tokenizers, trainers

    backend = Backend(models.BPE(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.train_from_iterator(
        ["Doc 1(Title: a) word next", "Doc 2(Title: b) end"] * 10,
        trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]"], show_progress=False),
    )
    tok = load_tokenizer(backend)
    parts = ["Doc", " 1(Title: a) word\nDoc", " 2(Title: b) end"]
    assert tok.encode_parts(parts).tolist() == tok.encode("".join(parts))
    assert list(tok._cache) == ["".join(parts)]  # one entry: the whole text


def test_text_with_an_added_token_is_encoded_whole() -> None:
    tok = fresh(builtin_tokenizer())
    parts = ["a <|endoftext|>b", " c"]
    assert tok.encode_parts(parts).tolist() == tok.encode("".join(parts))
    assert list(tok._cache) == ["".join(parts)]


def test_cache_hits_are_the_fresh_ids_and_read_only() -> None:
    tok = fresh(builtin_tokenizer())
    parts = [
        "\n\n<information>Doc",
        ' 1(Title: "Paris") capital of France\nDoc',
        " 2(Title: x) y</information>",
    ]
    first = tok.encode_parts(parts)
    assert len(tok._cache) == 3
    second = tok.encode_parts(parts)
    assert second.tolist() == first.tolist() == tok.encode("".join(parts))
    cached = tok._cache[parts[1]]
    assert tok.encode_parts([parts[1]]) is cached  # a single part is served from the cache itself
    with pytest.raises(ValueError):
        cached[0] = 0


def test_cache_is_bounded_least_recently_used_first() -> None:
    tok = fresh(builtin_tokenizer())
    tok.cache_size = 3
    for word in ("alpha", "beta", "gamma"):
        tok.encode_parts([word])
    tok.encode_parts(["alpha"])  # alpha is now the most recent
    tok.encode_parts(["delta"])
    assert list(tok._cache) == ["gamma", "alpha", "delta"]
    for i in range(50):
        tok.encode_parts([f"w{i}"])
    assert len(tok._cache) == 3
    tok.clear_cache()
    assert len(tok._cache) == 0


def test_a_passage_rendered_differently_is_a_different_entry() -> None:
    contents = ['"Paris"\nParis is the capital and largest city of France.', '"Lyon"\nLyon is a city.']
    tok = fresh(builtin_tokenizer())
    at_rank_1 = _DOCUMENT_CUT.split(format_documents(contents))
    at_rank_2 = _DOCUMENT_CUT.split(format_documents(contents[::-1]))
    cut_words = _DOCUMENT_CUT.split(format_documents(contents, max_passage_words=3))
    keys = [set(parts) for parts in (at_rank_1, at_rank_2, cut_words)]
    paris = [next(p for p in k if "Paris" in p) for k in keys]
    assert len(set(paris)) == 3  # rank 1 (followed by Doc), rank 2 (last), cut to three words
    for parts in (at_rank_1, at_rank_2, cut_words):
        assert tok.encode_parts(parts).tolist() == tok.encode("".join(parts))
    assert np.all([p in tok._cache for p in paris])


def test_prompts_are_token_exact(world: Any) -> None:
    from searchgym.protocol import format_prompt

    tok = fresh(builtin_tokenizer())
    episode = Episode(tok, EnvSpec())
    questions = [*world.questions("test")[:200], *world.questions("train")[:200]]
    for question in questions:
        episode.start(question)
        assert episode.tokens[: episode.length].tolist() == tok.encode(format_prompt(question.question))
    assert len(tok._cache) == 1 + len({q.question for q in questions})  # the fixed head is one entry
