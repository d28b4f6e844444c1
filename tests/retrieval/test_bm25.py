"""The sparse-matrix BM25: exactness against rank-bm25, tie rules, analysis, persistence, recall."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchgym.data import Dataset, Passage, generate_world, load_flashrag
from searchgym.errors import ConfigError, DataFormatError
from searchgym.retrieval import (
    BACKENDS,
    STOP_WORDS,
    Analyzer,
    BM25Retriever,
    RankBM25Retriever,
    analyze,
    make_retriever,
)
from searchgym.retrieval import bm25 as bm25_module
from searchgym.retrieval.base import s_stem
from searchgym.retrieval.bm25 import corpus_hash, top_k_sparse
from searchgym.retrieval.http import HttpRetriever
from searchgym.retrieval.rank_bm25 import top_k_indices

from .conftest import bm25_index

#: Query engines (same results): numpy always, the compiled kernel where numba is installed.
ENGINES = ["numpy"] + (["numba"] if bm25_module.numba_kernel() is not None else [])


def okapi(passages: list[Passage], **kwargs: Any) -> BM25Retriever:
    """Ours in the configuration of :class:`RankBM25Retriever` (its analysis, k1 1.5, b 0.75)."""
    return BM25Retriever(passages, k1=1.5, b=0.75, idf="okapi", analyzer=Analyzer(), **kwargs)


def corpus(*texts: str) -> list[Passage]:
    return [Passage(str(i), f"t{i}", text) for i, text in enumerate(texts)]


@lru_cache(maxsize=1)
def worlds_10k() -> tuple[list[Passage], list[str]]:
    """12 generated worlds: 10,080 passages (ids made unique), and questions of every world as queries."""
    passages: list[Passage] = []
    queries: list[str] = []
    for seed in range(12):
        world = generate_world(seed=seed)
        passages += [Passage(f"{seed}:{p.id}", p.title, p.text) for p in world.passages]
        queries += [q.question for q in world.splits["test"][:6]]
    return passages, queries


# -- exactness against the reference ------------------------------------------------------------------------


def test_okapi_matches_rank_bm25_on_10k_passages() -> None:
    passages, queries = worlds_10k()
    assert len(passages) >= 10_000
    ours, ref = okapi(passages), RankBM25Retriever(passages)
    batched = ours.top_k(queries, 3)
    same = 0
    for query, (top3, _) in zip(queries, batched, strict=True):
        expected = ref.scores(query)  # rank-bm25 scores a query in ~0.1 s here: one call per query
        np.testing.assert_allclose(ours.scores(query), expected, rtol=1e-6, atol=1e-12)
        same += top3.tolist() == top_k_indices(expected, 3).tolist()
    assert same / len(queries) >= 0.99, f"top-3 identical on only {same}/{len(queries)} queries"
    # The batch path gives the same rankings as one query at a time.
    assert ours.search(queries[:20], 3) == [ours.search([q], 3)[0] for q in queries[:20]]


def test_okapi_epsilon_floor_for_terms_in_most_passages() -> None:
    # "common" is in 3 of 4 passages: its raw idf log(1.5) - log(3.5) < 0 is floored to eps * average idf.
    passages = corpus("common apple", "common pear", "common plum", "fig")
    ours, ref = okapi(passages), RankBM25Retriever(passages)
    for query in ["common", "common apple", "fig common common", "unknown", ""]:
        np.testing.assert_allclose(ours.scores(query), ref.scores(query), rtol=1e-12, atol=0)
    raw = {"common": math.log(1.5) - math.log(3.5), "apple": math.log(3.5) - math.log(1.5)}
    raw |= {"pear": raw["apple"], "plum": raw["apple"], "fig": raw["apple"]}
    # titles t0..t3 are terms too (df 1 each)
    raw |= {f"t{i}": raw["apple"] for i in range(4)}
    floor = 0.25 * sum(raw.values()) / len(raw)
    doc_len, avgdl = 3, 2.75  # "t0 common apple"
    tf_part = 1 * 2.5 / (1 + 1.5 * (1 - 0.75 + 0.75 * doc_len / avgdl))
    assert ours.scores("common")[0] == pytest.approx(floor * tf_part, rel=1e-12)


def test_lucene_idf_by_hand() -> None:
    passages = corpus("a b", "b c", "c d d")
    bm = BM25Retriever(passages, k1=1.2, b=0.75, analyzer=Analyzer())
    n, avgdl = 3, (3 + 3 + 4) / 3
    idf_d = math.log(1 + (n - 1 + 0.5) / (1 + 0.5))
    dl = 4
    expected = idf_d * 2 * 2.2 / (2 + 1.2 * (1 - 0.75 + 0.75 * dl / avgdl))
    assert bm.scores("d")[2] == pytest.approx(expected, rel=1e-12)
    assert bm.scores("d")[:2].tolist() == [0.0, 0.0]


def test_repeated_query_terms_count_as_often_as_they_occur() -> None:
    passages = corpus("red fox", "blue fox", "red red hen")
    bm = BM25Retriever(passages, analyzer=Analyzer())
    np.testing.assert_allclose(bm.scores("red red"), 2 * bm.scores("red"))


@settings(max_examples=40, deadline=None)
@given(
    docs=st.lists(st.lists(st.sampled_from("abcdef"), min_size=0, max_size=6), min_size=1, max_size=12),
    query=st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f", "g", "doc"]), min_size=0, max_size=4),
    k=st.integers(1, 14),
)
@pytest.mark.parametrize("engine", ENGINES)
def test_rankings_equal_reference_on_random_corpora(
    engine: str, docs: list[list[str]], query: list[str], k: int
) -> None:
    # Every passage holds the title term "doc": a term in all passages has a negative raw okapi idf.
    passages = [Passage(str(i), "doc", " ".join(d)) for i, d in enumerate(docs)]
    ours, ref = okapi(passages, engine=engine), RankBM25Retriever(passages)
    text = " ".join(query)
    expected = ref.scores(text)
    np.testing.assert_allclose(ours.scores(text), expected, rtol=1e-9, atol=1e-12)
    # Same tie rule as top_k_indices over the dense scores, including zero and negative scores.
    got = [int(p) for p in ours.top_k([text], k)[0][0]]
    assert got == top_k_indices(ours.scores(text), k).tolist()


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(st.lists(st.sampled_from("aaabbcdefgh"), min_size=0, max_size=8), min_size=1, max_size=40),
    query=st.lists(st.sampled_from("abcdefghz"), min_size=0, max_size=6),
    k=st.integers(1, 6),
)
@pytest.mark.parametrize("engine", ENGINES)
def test_common_term_pruning_is_exact(engine: str, docs: list[list[str]], query: list[str], k: int) -> None:
    """With the bound checked before every posting list (numpy; the kernel checks before any list as long
    as the candidates), pruned rankings equal full scoring's (tie-aware)."""
    passages = [Passage(str(i), "", " ".join(d)) for i, d in enumerate(docs)]
    bm = BM25Retriever(passages, analyzer=Analyzer(), engine=engine)  # type: ignore[arg-type]
    text = " ".join(query)
    dense = bm.scores(text)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bm25_module, "_CHECK_MIN", 0)
        got = bm.top_k([text, "a", text], k)  # also batched with other queries
    expected = top_k_indices(dense, k)
    for positions, scores in (got[0], got[2]):
        # Equal reference scores rank by rank: differences, if any, are choices among exact ties.
        np.testing.assert_allclose(dense[positions], dense[expected], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(scores, dense[positions], rtol=1e-9, atol=1e-12)
    assert got[1][0].tolist() == top_k_indices(bm.scores("a"), k).tolist()


@pytest.mark.parametrize("engine", ENGINES)
def test_pruning_on_a_large_corpus_matches_full_scoring(engine: str) -> None:
    passages, queries = worlds_10k()
    bm = BM25Retriever(passages, analyzer=Analyzer(), engine=engine)  # type: ignore[arg-type]  # stop words kept: "in", "was" are common terms
    assert (bm._df > len(passages) // 16).sum() > 0
    for query, (positions, _) in zip(queries, bm.top_k(queries, 5), strict=True):
        assert positions.tolist() == top_k_indices(bm.scores(query), 5).tolist()


# -- ties and edge cases -----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_ties_are_broken_by_corpus_position(engine: str) -> None:
    passages = corpus("x y", "q", "x y", "x y", "q q")
    passages = [Passage(p.id, "same", p.text) for p in passages]  # equal titles: pure ties
    bm = BM25Retriever(passages, analyzer=Analyzer(), engine=engine)  # type: ignore[arg-type]
    assert [h.passage_id for h in bm.search(["x"], 3)[0]] == ["0", "2", "3"]
    # Fewer matches than k: the rest are zero-score passages in corpus order.
    assert [h.passage_id for h in bm.search(["q q q"], 3)[0]] == ["4", "1", "0"]
    assert [h.passage_id for h in bm.search(["nothing"], 2)[0]] == ["0", "1"]
    assert [h.score for h in bm.search(["nothing"], 2)[0]] == [0.0, 0.0]


@pytest.mark.parametrize("engine", ENGINES)
def test_k_larger_than_corpus_and_empty_batches(engine: str) -> None:
    bm = BM25Retriever(corpus("a", "b"), engine=engine)  # type: ignore[arg-type]
    assert len(bm.search(["a"], 10)[0]) == 2
    assert bm.search([], 3) == []
    assert bm.search(["a"], 0) == [[]]
    with pytest.raises(TypeError):
        bm.search("a", 3)  # type: ignore[arg-type]


def test_top_k_sparse_matches_dense_rule() -> None:
    rng = np.random.default_rng(0)
    for size in [30] * 50 + [5000, 20_000]:  # long rows take the sampled lower-bound path
        dense = rng.integers(0, 4, size=size).astype(np.float64)  # many ties
        positions = rng.permutation(size)
        for k in (7, 1251, 2600, size):  # large k: more than the sample holds
            kept, scores = top_k_sparse(dense[positions], positions, k)
            assert kept.tolist() == top_k_indices(dense, k).tolist()
            assert scores.tolist() == dense[kept].tolist()


def test_invalid_parameters_are_config_errors() -> None:
    for kwargs in ({"k1": -1}, {"b": 1.5}, {"idf": "bm15"}, {"epsilon": -0.1}):
        with pytest.raises(ConfigError):
            BM25Retriever(corpus("a"), **kwargs)  # type: ignore[arg-type]


# -- analysis ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "stem"),
    [
        ("cities", "city"),
        ("works", "work"),
        ("horses", "horse"),
        ("glass", "glass"),
        ("census", "census"),
        ("goes", "goe"),
        ("is", "is"),
        ("series", "sery"),
        ("news", "new"),
        ("bus", "bus"),
        ("as", "as"),
    ],
)
def test_s_stemmer(word: str, stem: str) -> None:
    assert s_stem(word) == stem


def test_analyzer() -> None:
    text = "The Cities of Gukustin, and 2 Works!"
    assert Analyzer()(text) == analyze(text) == ["the", "cities", "of", "gukustin", "and", "2", "works"]
    assert Analyzer(stopwords=STOP_WORDS, stem=True)(text) == ["city", "gukustin", "2", "work"]
    assert Analyzer(lowercase=False)("Ab cD") == ["Ab", "cD"]
    an = Analyzer(stopwords=frozenset({"x"}), stem=True)
    assert Analyzer.from_dict(json.loads(json.dumps(an.to_dict()))) == an
    with pytest.raises(ConfigError):
        Analyzer.from_dict({"lowercase": True})


def test_default_analysis_applies_to_queries_too() -> None:
    bm = BM25Retriever(corpus("the cities of the north", "a city in the south"))
    # "Cities" and "city" meet after stemming; stop words alone match nothing.
    assert bm.scores("CITY")[0] == bm.scores("cities")[0] > 0
    assert bm.scores("the of a in").tolist() == [0.0, 0.0]


# -- persistence -------------------------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path: Path) -> None:
    passages, queries = worlds_10k()
    passages = passages[:2000]
    bm = BM25Retriever(passages, k1=1.1, b=0.6, idf="okapi")
    bm.save(tmp_path / "index")
    loaded = BM25Retriever.load(tmp_path / "index", passages)
    assert loaded.params == bm.params and loaded.analyzer == bm.analyzer
    assert loaded.search(queries[:40], 5) == bm.search(queries[:40], 5)
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == ["bm25.json", "bm25.npz"]


def test_stale_index_is_detected(tmp_path: Path) -> None:
    passages = corpus("alpha beta", "gamma")
    BM25Retriever(passages).save(tmp_path)
    changed = [*passages[:1], Passage("1", "t1", "gamma delta")]
    with pytest.raises(ConfigError, match="stale BM25 index"):
        BM25Retriever.load(tmp_path, changed)
    assert corpus_hash(changed) != corpus_hash(passages)
    # A swap of fields between passages changes the hash too (fields are length-prefixed).
    assert corpus_hash([Passage("a", "b", "")]) != corpus_hash([Passage("a", "", "b")])


def test_missing_corrupt_or_foreign_index(tmp_path: Path) -> None:
    passages = corpus("alpha", "beta")
    with pytest.raises(ConfigError, match="holds no BM25 index"):
        BM25Retriever.load(tmp_path, passages)
    BM25Retriever(passages).save(tmp_path)
    meta = json.loads((tmp_path / "bm25.json").read_text())
    (tmp_path / "bm25.json").write_text(json.dumps({**meta, "format": 99}))
    with pytest.raises(ConfigError, match="format 99"):
        BM25Retriever.load(tmp_path, passages)
    (tmp_path / "bm25.json").write_text("{not json")
    with pytest.raises(DataFormatError, match="corrupt"):
        BM25Retriever.load(tmp_path, passages)
    (tmp_path / "bm25.json").write_text(json.dumps(meta))
    (tmp_path / "bm25.npz").write_bytes(b"garbage")
    with pytest.raises(DataFormatError, match="corrupt"):
        BM25Retriever.load(tmp_path, passages)


def test_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    BM25Retriever(corpus("a", "b"), progress=True)
    assert "indexing BM25" in capsys.readouterr().err
    BM25Retriever(corpus("a", "b"))  # small corpora stay quiet by default
    assert capsys.readouterr().err == ""


# -- backends by name --------------------------------------------------------------------------------------


def test_make_retriever_names() -> None:
    passages = corpus("a b", "c")
    assert BACKENDS[0] == "bm25"
    assert isinstance(make_retriever(None, passages), BM25Retriever)
    assert isinstance(make_retriever("bm25", passages), BM25Retriever)
    assert isinstance(make_retriever("rank_bm25", passages), RankBM25Retriever)
    http = make_retriever("http://127.0.0.1:9/retrieve", passages)
    assert isinstance(http, HttpRetriever)
    http.close()
    bm = BM25Retriever(passages)
    assert make_retriever(bm, passages) is bm
    with pytest.raises(ConfigError, match="unknown retriever"):
        make_retriever("bm26", passages)


# -- the real-data check -----------------------------------------------------------------------------------


def test_hotpotqa_top3_recall_with_default_parameters(hotpot_dir: Path) -> None:
    """A gold passage is in the top 3 for >= 0.90 of the questions (the reference plain BM25: 0.915)."""
    dataset: Dataset = load_flashrag(hotpot_dir)
    questions = dataset.questions("test")
    retriever = make_retriever("bm25", dataset.passages)
    assert isinstance(retriever, BM25Retriever)
    hits = retriever.search([q.question for q in questions], 3)
    found = [
        bool({h.passage_id for h in hs} & set(q.supporting_ids))
        for q, hs in zip(questions, hits, strict=True)
    ]
    recall = float(np.mean(found))
    assert recall >= 0.90, f"top-3 recall {recall:.3f}"


# -- crafted and damaged index files ---------------------------------------------------------------------------


def saved_index(tmp_path: Path) -> tuple[Path, list[Passage]]:
    passages = [Passage(str(i), f"title {i}", f"alpha beta gamma {i} delta {i % 3}") for i in range(30)]
    folder = BM25Retriever(passages).save(tmp_path / "index")
    return folder, passages


def rewrite_arrays(folder: Path, **arrays: np.ndarray) -> None:
    """Rewrites arrays as an attacker would: the manifest re-sealed, so the checks behind the hash run."""
    with np.load(folder / "bm25.npz") as f:
        current = {k: f[k] for k in f.files}
    np.savez(folder / "bm25.npz", **{**current, **arrays})
    reseal(folder)


def reseal(folder: Path, **changes: Any) -> None:
    """``bm25.json`` with ``changes`` and fresh hashes (what a crafted index carries)."""
    from searchgym.integrity import seal

    meta = json.loads((folder / "bm25.json").read_text())
    (folder / "bm25.json").write_text(
        json.dumps(seal({**meta, **changes}, {"bm25.npz": folder / "bm25.npz"}))
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda a: {
                "indices": np.where(a["indices"] == 0, 10**6, a["indices"]).astype(a["indices"].dtype)
            },
            "outside",
        ),
        (lambda a: {"indices": -a["indices"] - 1}, "outside"),
        (lambda a: {"indptr": a["indptr"][::-1].copy()}, "indptr"),
        (lambda a: {"indptr": a["indptr"][:-1]}, "indptr"),
        (lambda a: {"indices": a["indices"][::-1].copy()}, "not sorted"),
        (lambda a: {"data": a["data"].astype(np.float32)}, "float64"),
        (lambda a: {"indices": a["indices"].astype(np.float64)}, "int32 or int64"),
        (lambda a: {"data": a["data"].reshape(1, -1)}, "1-D"),
        (lambda a: {"data": a["data"][:-1]}, "weights for"),
        (lambda a: {"data": np.full_like(a["data"], np.nan)}, "not finite"),
        (lambda a: {"data": np.array([object()], dtype=object)}, "float64"),
    ],
    ids=[
        "index too large",
        "negative index",
        "indptr decreasing",
        "indptr short",
        "unsorted",
        "data dtype",
        "indices dtype",
        "2-D",
        "short data",
        "nan",
        "object",
    ],
)
def test_crafted_bm25_arrays_are_refused(tmp_path: Path, change: Any, message: str) -> None:
    folder, passages = saved_index(tmp_path)
    with np.load(folder / "bm25.npz") as f:
        arrays = {k: f[k] for k in f.files}
    rewrite_arrays(folder, **change(arrays))
    with pytest.raises(DataFormatError, match=message) as err:
        BM25Retriever.load(folder, passages)
    assert "bm25.npz" in str(err.value)


def test_truncated_or_bit_flipped_bm25_index_is_a_typed_error(tmp_path: Path) -> None:
    folder, passages = saved_index(tmp_path)
    npz = folder / "bm25.npz"
    whole = npz.read_bytes()
    weights = BM25Retriever.load(folder, passages).weights.data.tobytes()
    npz.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataFormatError, match=r"bm25\.npz"):
        BM25Retriever.load(folder, passages)
    flipped = bytearray(whole)
    flipped[whole.index(weights) + 5] ^= 1  # one bit of one weight
    npz.write_bytes(bytes(flipped))
    with pytest.raises(DataFormatError, match=r"bm25\.npz"):
        BM25Retriever.load(folder, passages)
    npz.write_bytes(whole)
    meta = json.loads((folder / "bm25.json").read_text())
    reseal(folder, shape=[meta["shape"][0] + 1, meta["shape"][1]])
    with pytest.raises(DataFormatError, match="shape"):
        BM25Retriever.load(folder, passages)


def test_a_crafted_index_cannot_crash_the_process(tmp_path: Path) -> None:
    """Indices at the int32 maximum, in a child process (a segfault fails the test, not the run): a typed error."""
    folder, passages = saved_index(tmp_path)
    with np.load(folder / "bm25.npz") as f:
        indices = f["indices"].copy()
    indices[:] = 2**31 - 1
    rewrite_arrays(folder, indices=indices)
    script = (
        "from searchgym.data import Passage\nfrom searchgym.retrieval import BM25Retriever\n"
        "from searchgym.errors import DataFormatError\n"
        f"p = [Passage(str(i), f'title {{i}}', f'alpha beta gamma {{i}} delta {{i % 3}}') for i in range(30)]\n"
        f"try:\n    r = BM25Retriever.load({str(folder)!r}, p)\n    print(r.search(['alpha beta'] * 50, 3))\n"
        "except DataFormatError:\n    print('typed error')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "typed error" in proc.stdout, proc.stderr[-2000:]


def test_one_flipped_bit_in_bm25_json_is_refused(tmp_path: Path) -> None:
    folder, passages = bm25_index(tmp_path)
    text = (folder / "bm25.json").read_text()
    i = text.index('"k1": 0.9') + len('"k1": 0.')
    flipped = text[:i] + chr(ord(text[i]) ^ 1) + text[i + 1 :]  # 0.9 -> 0.8: still valid JSON, other scores
    (folder / "bm25.json").write_text(flipped)
    assert json.loads(flipped)["params"]["k1"] == 0.8
    with pytest.raises(DataFormatError, match=r"bm25\.json: fails its checksum"):
        BM25Retriever.load(folder, passages)


def test_a_npy_header_numpy_cannot_tokenize_is_a_typed_error(tmp_path: Path) -> None:
    """A damaged ``.npy`` header in ``bm25.npz`` that NumPy's header parser cannot tokenize
    (``tokenize.TokenError``), in a re-sealed index: a ``DataFormatError``."""
    folder, passages = bm25_index(tmp_path)
    with zipfile.ZipFile(folder / "bm25.npz") as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    damaged = bytearray(members["data.npy"])
    damaged[damaged.index(b"}")] = ord(" ")
    members["data.npy"] = bytes(damaged)
    with zipfile.ZipFile(folder / "bm25.npz", "w", zipfile.ZIP_STORED) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    reseal(folder)  # crafted: the hash matches, the header check must still hold
    with pytest.raises(DataFormatError, match="corrupt BM25 index arrays"):
        BM25Retriever.load(folder, passages)


def test_a_bm25_write_killed_between_its_renames_is_refused_not_mixed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import searchgym.retrieval.bm25_index as index_files

    folder, passages = bm25_index(tmp_path, k1=0.9)
    before = BM25Retriever.load(folder, passages).search(["alpha beta 3"], 3)
    real_replace = os.replace
    calls: list[str] = []

    def killed_after_the_first(src: Any, dst: Any) -> None:
        calls.append(str(dst))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies here: new bm25.npz in place, bm25.json still the old one
        real_replace(src, dst)

    monkeypatch.setattr(index_files.os, "replace", killed_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        BM25Retriever(passages, k1=2.0).save(folder)
    monkeypatch.undo()
    assert calls[0].endswith("bm25.npz")
    with pytest.raises(DataFormatError, match=r"bm25\.npz: does not match .* different builds"):
        BM25Retriever.load(folder, passages)
    BM25Retriever(passages, k1=0.9).save(folder)  # rebuilding repairs it
    assert BM25Retriever.load(folder, passages).search(["alpha beta 3"], 3) == before
