"""Corpora for the retrieval benchmark: generated worlds side by side, and a seeded synthetic corpus whose
words follow Zipf's law (any size, no data needed)."""

from __future__ import annotations

import numpy as np

from searchgym.data import Passage, generate_world
from searchgym.retrieval.base import STOP_WORDS

__all__ = ["bench_corpus", "zipf_corpus"]


def bench_corpus(n_passages: int, n_queries: int, seed: int = 0) -> tuple[list[Passage], list[str]]:
    """``n_passages`` passages from consecutive generated worlds and ``n_queries`` of their test questions."""
    passages: list[Passage] = []
    questions: list[str] = []
    world_seed = 0
    while len(passages) < n_passages:
        world = generate_world(seed=world_seed)
        passages += [Passage(f"{world_seed}:{p.id}", p.title, p.text) for p in world.passages]
        questions += [q.question for q in world.questions("test")]
        world_seed += 1
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(questions), size=min(n_queries, len(questions)), replace=False)
    return passages[:n_passages], [questions[i] for i in picks]


_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def _zipf_words(n: int) -> list[str]:
    """``n`` distinct words: the stop words first (the most frequent ranks), then made-up words.

    Made-up words are syllables spelling the rank in base 70, ending in ``n`` so that no stemmer folds two
    of them together.
    """
    words = sorted(STOP_WORDS)
    rank = 0
    while len(words) < n:
        parts, rest = [], rank
        while True:
            parts.append(_SYLLABLES[rest % len(_SYLLABLES)])
            rest //= len(_SYLLABLES)
            if rest == 0:
                break
        words.append("".join(parts) + "n")
        rank += 1
    return words[:n]


def zipf_corpus(
    n_passages: int,
    n_queries: int,
    seed: int = 0,
    *,
    mean_words: int = 50,
    exponent: float = 1.0,
    vocab: int | None = None,
) -> tuple[list[Passage], list[str]]:
    """A seeded synthetic corpus whose word frequencies follow Zipf's law, and queries drawn from it.

    Word ranks are drawn with probability proportional to ``1 / rank ** exponent`` from a vocabulary that
    grows with the square root of the corpus's token count (Heaps' law; 50,000 words at least), the stop
    words taking the top ranks as in English text. Passages have 50% to 150% of ``mean_words`` words; the
    first two form the title. Each query is 3 to 8 words drawn from one random passage, so it has an
    answer and carries common words in their natural share.

    Returns:
        ``(passages, queries)``; passage ids are ``"0"``, ``"1"``, ….
    """
    rng = np.random.default_rng(seed)
    lengths = rng.integers(mean_words // 2, mean_words * 3 // 2 + 1, size=n_passages)
    total = int(lengths.sum())
    size = vocab or max(50_000, int(200 * total**0.5))
    words = np.array(_zipf_words(size), dtype=object)
    cdf = np.cumsum(1.0 / np.arange(1, size + 1) ** exponent)
    ranks = np.searchsorted(cdf, rng.random(total) * cdf[-1]).clip(max=size - 1)
    bounds = np.concatenate(([0], np.cumsum(lengths)))
    passages = []
    for i in range(n_passages):
        text = words[ranks[bounds[i] : bounds[i + 1]]]
        passages.append(Passage(str(i), " ".join(text[:2]), " ".join(text[2:])))
    queries = []
    for doc in rng.choice(n_passages, size=n_queries, replace=n_queries > n_passages):
        text = words[ranks[bounds[doc] : bounds[doc + 1]]]
        picks = rng.choice(text.shape[0], size=min(int(rng.integers(3, 9)), text.shape[0]), replace=False)
        queries.append(" ".join(text[np.sort(picks)]))
    return passages, queries
