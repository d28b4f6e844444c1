"""BM25 at scale: the pruned term-at-a-time query path returns exactly the full scoring's top k.

The oracle is the full scoring every earlier version ranked by: :meth:`BM25Retriever.scores` (the sparse
product of the query's term counts with the weight matrix, unchanged) ranked by
:func:`~searchgym.retrieval.rank_bm25.top_k_indices` (descending score, ties by lower position). The
positions must be identical and the scores equal to the last bit, ties included. Every check runs both
engines: numpy and, when numba is installed, the compiled kernel.
"""

from __future__ import annotations

import mmap
import pickle
import re
import sys
import threading
import warnings
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.app.bench.retrieval import zipf_corpus
from searchgym.data import Passage
from searchgym.errors import ConfigError, DataFormatError, MissingDependencyError, install_command
from searchgym.retrieval import Analyzer, BM25Retriever
from searchgym.retrieval import bm25 as bm25_module
from searchgym.retrieval.rank_bm25 import top_k_indices

#: The engines every check runs: numpy always, the compiled kernel where numba is installed.
ENGINES = ["numpy"] + (["numba"] if bm25_module.numba_kernel() is not None else [])


def assert_full_ranking(bm: BM25Retriever, queries: list[str], k: int) -> None:
    """``top_k`` equals the full scores' ranking, positions and score bits, for every query of a batch,
    with each engine."""
    engine = bm.engine
    try:
        for bm.engine in ENGINES:
            for query, (positions, scores) in zip(queries, bm.top_k(queries, k), strict=True):
                dense = bm.scores(query)
                expected = top_k_indices(dense, k)
                assert positions.tolist() == expected.tolist(), (bm.engine, query)
                assert scores.tolist() == dense[expected].tolist(), (bm.engine, query)
                assert positions.dtype == np.int64 and scores.dtype == np.float64
    finally:
        bm.engine = engine


@pytest.fixture
def check_every_list() -> Iterator[None]:
    """The bound is checked before any posting list longer than those added: checks run on tiny corpora."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bm25_module, "_CHECK_MIN", 0)
        yield


@settings(max_examples=120, deadline=None)
@given(
    docs=st.lists(st.lists(st.sampled_from("aaaabbbccdefgh"), max_size=8), min_size=1, max_size=60),
    queries=st.lists(st.lists(st.sampled_from("aabcdefghz"), max_size=7), min_size=1, max_size=4),
    k=st.integers(1, 9),
    idf=st.sampled_from(["lucene", "okapi"]),
    prune=st.booleans(),
)
def test_top_k_is_the_full_ranking_bit_for_bit(
    docs: list[list[str]], queries: list[list[str]], k: int, idf: str, prune: bool
) -> None:
    # Few letters over many short passages: exact ties everywhere, repeated query terms, passages with no
    # term, queries with no known term, k above the corpus size; with and without the pruning checks.
    passages = [Passage(str(i), "", " ".join(d)) for i, d in enumerate(docs)]
    bm = BM25Retriever(passages, k1=1.2, b=0.75, idf=idf, analyzer=Analyzer())  # type: ignore[arg-type]
    with pytest.MonkeyPatch.context() as patch:
        if prune:
            patch.setattr(bm25_module, "_CHECK_MIN", 0)
        assert_full_ranking(bm, [" ".join(q) for q in queries], k)


@lru_cache(maxsize=1)
def zipf_20k() -> tuple[list[Passage], list[str]]:
    return zipf_corpus(20_000, 300, seed=3, mean_words=30)


@pytest.mark.parametrize("idf", ["lucene", "okapi"])
def test_synthetic_corpus_with_stop_words_matches_full_scoring(idf: str) -> None:
    passages, queries = zipf_20k()
    bm = BM25Retriever(passages, k1=1.5, b=0.75, idf=idf, analyzer=Analyzer())  # type: ignore[arg-type]
    assert (bm._df > len(passages) // 16).sum() > 10  # stop words kept: long posting lists to prune
    assert_full_ranking(bm, queries, 3)
    assert_full_ranking(bm, queries[:50], 10)


def test_default_analysis_and_parameters_match_full_scoring(check_every_list: None) -> None:
    passages, queries = zipf_20k()
    bm = BM25Retriever(passages[:5000])
    assert_full_ranking(bm, queries, 5)


def test_only_candidates_that_can_reach_the_top_are_scored_exactly() -> None:
    """A rare term settles the top k: the common terms are looked up for a few candidates, not scored."""
    passages = [
        Passage(str(i), "", "the of and " + ("needle" if i % 997 == 0 else "hay")) for i in range(20_000)
    ]
    bm = BM25Retriever(passages, analyzer=Analyzer(), engine="numpy")  # the spy sees the numpy path
    seen: list[int] = []
    exact = bm._exact_scores

    def spy(terms: np.ndarray, positions: np.ndarray) -> np.ndarray:
        seen.append(positions.shape[0])
        return exact(terms, positions)

    bm._exact_scores = spy  # type: ignore[method-assign]
    assert bm.top_k(["the needle of and"], 3)[0][0].tolist() == [0, 997, 1994]
    assert seen[0] <= 21  # the passages holding "needle", out of 20,000 holding "the"


def test_negative_okapi_weights_fall_back_to_full_scoring() -> None:
    # "x" and "y" are in every passage: their raw idf is negative and so is the average, hence the floor.
    passages = [Passage(str(i), "", "x y" + (" z" if i == 1 else "")) for i in range(3)]
    bm = BM25Retriever(passages, k1=1.5, b=0.75, idf="okapi", analyzer=Analyzer())
    assert not bm._nonnegative
    assert_full_ranking(bm, ["x", "z", "x z y", "w", ""], 2)


@pytest.mark.parametrize("engine", ENGINES)
def test_batches_threads_and_pickles_agree(engine: str) -> None:
    passages, queries = zipf_20k()
    bm = BM25Retriever(passages[:8000], analyzer=Analyzer(), engine=engine)  # type: ignore[arg-type]
    expected = [[(h.passage_id, h.score) for h in hits] for hits in bm.search(queries, 5)]
    singles = [[(h.passage_id, h.score) for h in bm.search([q], 5)[0]] for q in queries[:40]]
    assert singles == expected[:40]
    results: dict[int, list[list[tuple[str, float]]]] = {}

    def worker(i: int) -> None:  # each thread has its own scratch arrays
        results[i] = [[(h.passage_id, h.score) for h in hits] for hits in bm.search(queries, 5)]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[i] == expected for i in range(3))
    copy = pickle.loads(pickle.dumps(bm))
    assert [[(h.passage_id, h.score) for h in hits] for hits in copy.search(queries, 5)] == expected


def test_loaded_index_ranks_as_the_built_one(tmp_path: Path) -> None:
    passages, queries = zipf_20k()
    bm = BM25Retriever(passages[:3000], analyzer=Analyzer())
    loaded = BM25Retriever.load(bm.save(tmp_path / "index"), passages[:3000])
    assert loaded.search(queries, 4) == bm.search(queries, 4)
    assert_full_ranking(loaded, queries[:60], 4)


def mapped_file(array: np.ndarray) -> bool:
    """Whether ``array``'s memory is a map of a file (somewhere down its chain of bases)."""
    base: object = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = getattr(base, "base", None) if isinstance(base, np.ndarray) else getattr(base, "obj", None)
    return False


def test_memory_mapped_load_ranks_alike_and_checks_alike(tmp_path: Path) -> None:
    passages, queries = zipf_20k()
    passages = passages[:3000]
    folder = BM25Retriever(passages, analyzer=Analyzer()).save(tmp_path / "index")
    copied = BM25Retriever.load(folder, passages)
    mapped = BM25Retriever.load(folder, passages, mmap=True)
    for array in (mapped.weights.data, mapped.weights.indices, mapped.weights.indptr):
        assert mapped_file(array) and not array.flags.writeable
    assert not mapped_file(copied.weights.data)
    for engine in ENGINES:  # the compiled kernel takes the read-only maps as they are
        mapped.engine = copied.engine = engine  # type: ignore[assignment]
        assert mapped.search(queries, 5) == copied.search(queries, 5)
    # The file's checks run in this mode too: one flipped bit of one weight is refused.
    npz = folder / "bm25.npz"
    whole = npz.read_bytes()
    flipped = bytearray(whole)
    flipped[whole.index(copied.weights.data.tobytes()[:64]) + 5] ^= 1
    npz.write_bytes(bytes(flipped))
    with pytest.raises(DataFormatError, match=r"bm25\.npz"):
        BM25Retriever.load(folder, passages, mmap=True)
    npz.write_bytes(whole[: len(whole) - 100])
    with pytest.raises(DataFormatError, match=r"bm25\.npz"):
        BM25Retriever.load(folder, passages, mmap=True)


def test_engine_choice_is_checked() -> None:
    passages = [Passage("0", "", "a b")]
    with pytest.raises(ConfigError, match="engine must be one of"):
        BM25Retriever(passages, engine="fortran")  # type: ignore[arg-type]
    assert BM25Retriever(passages, engine="numpy").engine == "numpy"
    old = pickle.loads(pickle.dumps(BM25Retriever(passages)))
    del old.__dict__["engine"]  # an instance pickled before engines existed
    assert pickle.loads(pickle.dumps(old)).engine == "auto"


@pytest.fixture
def fresh_kernel_state() -> Iterator[pytest.MonkeyPatch]:
    """Forgets whether the kernel was loaded (restored afterwards), so a test can make its loading fail."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bm25_module, "_kernel", None)
        patch.setattr(bm25_module, "_kernel_failure", None)
        yield patch


def test_without_numba_the_numpy_path_runs(fresh_kernel_state: pytest.MonkeyPatch) -> None:
    fresh_kernel_state.setattr("importlib.util.find_spec", lambda name, *a: None)
    passages, queries = zipf_20k()
    with pytest.raises(MissingDependencyError, match=re.escape(install_command("bench"))):
        BM25Retriever(passages[:50], engine="numba")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numba missing is not worth a warning
        bm = BM25Retriever(passages[:2000], analyzer=Analyzer())
        assert bm25_module.numba_kernel() is None
        assert_full_ranking(bm, queries[:40], 3)


def test_a_kernel_that_fails_to_load_warns_and_falls_back(fresh_kernel_state: pytest.MonkeyPatch) -> None:
    pytest.importorskip("numba")
    # As when numba finds no writable cache folder: importing the kernel module raises.
    fresh_kernel_state.setitem(sys.modules, "searchgym.retrieval._bm25_kernels", None)
    passages, queries = zipf_20k()
    bm = BM25Retriever(passages[:2000], analyzer=Analyzer())
    with pytest.warns(RuntimeWarning, match="NUMBA_CACHE_DIR"):
        expected = bm.top_k(queries[:40], 3)
    assert bm25_module.numba_kernel() is None  # tried once: no second warning
    with pytest.raises(ConfigError, match="could not be loaded"):
        BM25Retriever(passages[:50], engine="numba")
    bm.engine = "numpy"
    assert [(p.tolist(), s.tolist()) for p, s in bm.top_k(queries[:40], 3)] == [
        (p.tolist(), s.tolist()) for p, s in expected
    ]


def test_compiled_kernel_edge_cases() -> None:
    """Empty queries, unknown terms, k above the corpus, negative Okapi weights, repeated terms: the kernel
    agrees with full scoring (ENGINES includes it where numba is installed)."""
    pytest.importorskip("numba")
    passages = [Passage(str(i), "", "x y" + (" z" if i == 1 else "")) for i in range(3)]
    okapi = BM25Retriever(passages, k1=1.5, b=0.75, idf="okapi", analyzer=Analyzer())
    assert not okapi._nonnegative
    assert_full_ranking(okapi, ["x", "z", "x z y", "w", "", "z z x"], 2)
    assert_full_ranking(okapi, ["x z"], 7)
    few = [Passage(str(i), "", ["a b", "c", "a a", "", "b"][i % 5]) for i in range(12)]
    lucene = BM25Retriever(few, analyzer=Analyzer(), engine="numba")
    assert_full_ranking(lucene, ["a", "b c", "q", "", "a a b", "c c c c"], 4)
    assert_full_ranking(lucene, ["a", "c"], 12)
    [(positions, scores)] = lucene.top_k(["a"], 0)
    assert positions.shape == scores.shape == (0,)
    assert lucene.top_k([], 3) == []
