"""The dense retriever: the encoder, the resumable index build, search rules, and every refusal of bad input."""

from __future__ import annotations

import itertools
import json
import mmap
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from searchgym.data import Passage, generate_world
from searchgym.errors import ConfigError, DataFormatError, MissingDependencyError, install_command
from searchgym.retrieval import BM25Retriever, Hit, HybridRetriever, Retriever, make_retriever
from searchgym.retrieval import dense as dense_module
from searchgym.retrieval.dense import (
    DenseRetriever,
    Encoder,
    build_dense_index,
    flat_top_k,
    gold_recall,
    load_encoder,
    read_manifest,
    tiny_encoder,
)

from .conftest import bm25_index

pytest.importorskip("faiss", reason="the dense extra (faiss-cpu) is not installed")
pytest.importorskip("transformers", reason="the dense extra (transformers) is not installed")


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return tiny_encoder()


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    return generate_world(seed=0).passages[:120]


@pytest.fixture(scope="module")
def flat_dir(tmp_path_factory: pytest.TempPathFactory, passages: list[Passage], encoder: Encoder) -> Path:
    """A finished flat index over :func:`passages`, shared read-only by the tests."""
    return build_dense_index(passages, encoder, tmp_path_factory.mktemp("flat"), progress=False)


def brute_force(retriever: DenseRetriever, query: str, k: int) -> list[int]:
    """The top ``k`` positions by exact inner product, ties by lower position."""
    q = retriever.encoder.encode_queries([query])[0]
    scores = np.asarray(retriever.embeddings, dtype=np.float64) @ q.astype(np.float64)
    return list(np.lexsort((np.arange(scores.shape[0]), -scores))[:k])


def copy_index(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


# -- the encoder -------------------------------------------------------------------------------------------


def test_embeddings_are_unit_float32_and_reproducible(encoder: Encoder, passages: list[Passage]) -> None:
    texts = [p.text for p in passages[:10]]
    e = encoder.encode(texts)
    assert e.dtype == np.float32 and e.shape == (10, encoder.dim) == (10, 64)
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(tiny_encoder().encode(texts), e, atol=1e-6)  # same seed, same weights
    one_by_one = np.stack([encoder.encode([t])[0] for t in texts])
    np.testing.assert_allclose(one_by_one, e, atol=1e-5)  # padding in a batch changes nothing
    assert not np.allclose(tiny_encoder(seed=1).encode(texts), e, atol=1e-3)


def test_prefixes_and_pooling(encoder: Encoder, passages: list[Passage]) -> None:
    np.testing.assert_array_equal(encoder.encode_queries(["x y"]), encoder.encode(["query: x y"]))
    p = passages[0]
    np.testing.assert_array_equal(encoder.encode_passages([p]), encoder.encode([f"passage: {p.contents}"]))
    plain = tiny_encoder(query_prefix="", passage_prefix="")
    np.testing.assert_array_equal(plain.encode_queries(["x y"]), encoder.encode(["x y"]))
    cls = tiny_encoder(pooling="cls")
    assert not np.allclose(cls.encode(["a long text here"]), encoder.encode(["a long text here"]), atol=1e-3)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pooling": "max"}, r"unknown pooling 'max'; choose one of \['mean', 'cls'\]"),
        ({"max_length": 0}, "max_length must be a positive integer"),
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"device": "nonsense"}, "cannot use device 'nonsense'"),
    ],
)
def test_bad_encoder_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tiny_encoder(**options)


def test_a_cuda_device_without_a_gpu_is_a_clear_error() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match=r"cannot use device 'cuda' .* or use --device cpu"):
        tiny_encoder(device="cuda")
    with pytest.raises(ConfigError, match="cannot use device 'cuda:0'"):
        load_encoder("/nonexistent", device="cuda:0")


def test_an_encoder_named_at_load_takes_the_recorded_settings(
    tmp_path: Path, passages: list[Passage]
) -> None:
    plain = tiny_encoder(query_prefix="", passage_prefix="", pooling="cls")
    out = build_dense_index(passages[:30], plain, tmp_path, progress=False)
    loaded = DenseRetriever.load(out, passages[:30], encoder="tiny")  # a name: the index's settings apply
    assert (loaded.encoder.query_prefix, loaded.encoder.pooling) == ("", "cls")
    with pytest.raises(ConfigError, match="pooling 'cls' vs 'mean'"):
        DenseRetriever.load(out, passages[:30], encoder=tiny_encoder())  # an Encoder is taken as it is


def test_a_saved_checkpoint_loads_by_path_and_embeds_the_same(
    tmp_path: Path, encoder: Encoder, passages: list[Passage]
) -> None:
    """What a user's local e5 folder looks like: save_pretrained of a model and its tokenizer."""
    folder = tmp_path / "my-encoder"
    encoder.model.save_pretrained(folder)
    encoder.tokenizer.save_pretrained(folder)
    loaded = load_encoder(str(folder))
    assert loaded.name == str(folder.resolve()) and loaded.dim == encoder.dim
    texts = [p.text for p in passages[:5]]
    np.testing.assert_allclose(loaded.encode(texts), encoder.encode(texts), atol=1e-5)
    # An index built from the folder finds its encoder again by the recorded path ...
    out = build_dense_index(passages, loaded, tmp_path / "index", progress=False)
    assert read_manifest(out)["encoder"]["name"] == str(folder.resolve())
    retriever = DenseRetriever.load(out, passages)
    assert retriever.encoder.name == str(folder.resolve())
    # ... accepts the same weights under another name (the tiny encoder) ...
    DenseRetriever.load(out, passages, encoder=encoder)
    # ... and says what to do once the folder is gone.
    folder.rename(tmp_path / "moved")
    with pytest.raises(ConfigError, match="which is gone; pass encoder=PATH"):
        DenseRetriever.load(out, passages)
    DenseRetriever.load(out, passages, encoder=str(tmp_path / "moved"))


def test_a_bert_checkpoint_with_a_wordpiece_tokenizer_indexes_and_searches(
    tmp_path: Path, passages: list[Passage]
) -> None:
    """e5's layout: a BertModel and a BertTokenizerFast ([CLS] ... [SEP], token type ids) in one folder."""
    import transformers

    words = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        *sorted({w.lower() for p in passages for w in p.text.split()}),
    ]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt"))
    config = transformers.BertConfig(
        vocab_size=len(words),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    folder = tmp_path / "e5-like"
    transformers.BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    encoder = load_encoder(str(folder), pooling="cls", batch_size=8)
    assert encoder.dim == 32
    out = build_dense_index(passages[:40], encoder, tmp_path / "idx", progress=False)
    retriever = DenseRetriever.load(out, passages[:40])  # the folder and the CLS pooling come from dense.json
    assert retriever.encoder.pooling == "cls" and retriever.encoder.name == str(folder.resolve())
    hits = retriever.search([passages[3].text], 3)[0]
    q = retriever.encoder.encode_queries([passages[3].text])[0].astype(np.float64)
    exact = np.sort(np.asarray(retriever.embeddings, dtype=np.float64) @ q)[::-1][:3]
    # A random 1-layer model puts many passages within float32 rounding of each other: compare scores.
    np.testing.assert_allclose([h.score for h in hits], exact, atol=1e-5)


def test_an_encoder_that_is_not_there_says_how_to_get_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="huggingface-cli download intfloat/e5-base-v2"):
        load_encoder("intfloat/e5-base-v2")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot load the encoder"):
        load_encoder(str(tmp_path))


# -- searching ---------------------------------------------------------------------------------------------


def test_search_is_exact_inner_product_with_hits_from_the_corpus(
    flat_dir: Path, passages: list[Passage]
) -> None:
    retriever = DenseRetriever.load(flat_dir, passages)
    queries = ["who founded the guild?", "a river in the north", "Lyku Works"]
    results = retriever.search(queries, 5)
    for query, hits in zip(queries, results, strict=True):
        assert [
            passages.index(next(p for p in passages if p.id == h.passage_id)) for h in hits
        ] == brute_force(retriever, query, 5)
        assert all(a.score >= b.score for a, b in itertools.pairwise(hits))
        top = passages[[p.id for p in passages].index(hits[0].passage_id)]
        assert (hits[0].title, hits[0].text, hits[0].contents) == (top.title, top.text, top.contents)
    assert retriever.name == "dense" and retriever.dim == 64
    assert retriever.nbytes == len(passages) * 64 * 4
    assert len(retriever.search(["x"], 1000)[0]) == len(passages)  # k beyond the corpus: all of it
    assert retriever.search(["x", "y"], 0) == [[], []]
    assert retriever.search([], 3) == []
    with pytest.raises(TypeError, match="not one string"):
        retriever.search("x", 3)


def test_embeddings_are_memory_mapped(flat_dir: Path, passages: list[Passage]) -> None:
    retriever = DenseRetriever.load(flat_dir, passages)
    base: Any = retriever.embeddings
    while base is not None and not isinstance(base, mmap.mmap):
        base = base.base
    assert isinstance(base, mmap.mmap)


def test_ties_go_to_the_earlier_passage_even_past_the_fetch_margin(encoder: Encoder) -> None:
    # 30 identical passages (the same vector), then others: every tie must resolve by corpus position.
    corpus = [Passage(str(i), "same", "identical text") for i in range(30)]
    corpus += [Passage(str(30 + i), f"t{i}", f"other words {i}") for i in range(10)]
    embeddings = encoder.encode_passages(corpus)
    reversed_corpus = corpus[::-1]
    for docs, emb in ((corpus, embeddings), (reversed_corpus, embeddings[::-1].copy())):
        retriever = DenseRetriever(docs, encoder, emb)
        hits = retriever.search(["identical text"], 12)[0]
        same = [h.passage_id for h in hits if h.title == "same"]
        expected = [p.id for p in docs if p.title == "same"][: len(same)]
        assert same == expected and len(same) >= 10


def test_flat_top_k_is_exact_across_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    import faiss

    rng = np.random.default_rng(0)
    emb = rng.standard_normal((5000, 16), dtype=np.float32)
    emb[100:140] = emb[7]  # 41 equal vectors, spread over blocks below
    queries = np.concatenate([emb[7:8], rng.standard_normal((9, 16), dtype=np.float32)])
    index = faiss.IndexFlatIP(16)
    index.add(emb)
    monkeypatch.setattr(dense_module, "_FLAT_BLOCK_ENTRIES", 10 * 1024)  # 1024 rows per block of 10 queries
    for k in (1, 5, 60):
        found = flat_top_k(queries, emb, k)
        exact = queries.astype(np.float64) @ emb.T.astype(np.float64)
        for b, (positions, scores) in enumerate(found):
            assert len(positions) == k and np.all(np.diff(scores) <= 0)
            np.testing.assert_allclose(scores, np.sort(exact[b])[::-1][:k], rtol=1e-5)
        # The tied copies of vector 7 come in corpus order: 7, then 100, 101, ...
        assert list(found[0][0][: min(k, 41)]) == [7, *range(100, 140)][: min(k, 41)]
        _, ref = index.search(queries[1:], k)
        assert [list(p) for p, _ in found[1:]] == [list(r) for r in ref]  # faiss agrees (no ties there)
    assert [len(p) for p, _ in flat_top_k(queries[:2], emb[:3], 3)] == [3, 3]  # k = N


@pytest.mark.parametrize("index_type", ["ivf", "hnsw"])
def test_approximate_indexes_agree_with_flat_on_a_small_corpus(
    tmp_path: Path, flat_dir: Path, passages: list[Passage], encoder: Encoder, index_type: str
) -> None:
    out = build_dense_index(passages, encoder, tmp_path, index_type=index_type, progress=False)
    meta = read_manifest(out)
    assert meta["index_type"] == index_type and (out / "index.faiss").is_file()
    approx = DenseRetriever.load(out, passages, encoder=encoder)
    exact = DenseRetriever.load(flat_dir, passages, encoder=encoder)
    queries = [p.title for p in passages[:20]]
    assert [[h.passage_id for h in hs] for hs in approx.search(queries, 3)] == [
        [h.passage_id for h in hs] for hs in exact.search(queries, 3)
    ]
    assert approx.nbytes > exact.nbytes


def test_make_retriever_and_the_env_take_a_dense_spec(tmp_path: Path, encoder: Encoder) -> None:
    import gymnasium as gym

    import searchgym  # noqa: F401 - registers the env ids
    from searchgym.data import load_dataset
    from searchgym.envs import SearchQAVectorEnv
    from searchgym.tokenization import builtin_tokenizer

    world = load_dataset()
    out = build_dense_index(world.passages, encoder, tmp_path / "idx", progress=False)
    assert isinstance(make_retriever(f"dense:{out}", world.passages), DenseRetriever)
    with pytest.raises(ConfigError, match="names no index folder"):
        make_retriever("dense:", world.passages)
    env = gym.make("SearchQA-v0", retriever=f"dense:{out}")
    assert isinstance(env.unwrapped.retriever, DenseRetriever)
    env.close()
    # The vector env sends the searches of one step as one batch: one encoder call for 8 queries.
    envs = SearchQAVectorEnv(num_envs=8, retriever=f"dense:{out}")
    calls: list[int] = []
    inner = envs.retriever.encoder.encode_queries
    envs.retriever.encoder.encode_queries = lambda qs: calls.append(len(qs)) or inner(qs)  # type: ignore[method-assign]
    envs.reset(seed=0, options={"group_size": 4})
    for t in builtin_tokenizer().encode("<search> Lyku Works </search>"):
        envs.step(np.full(8, t))
    assert calls == [8]
    envs.close()


# -- building and resuming ---------------------------------------------------------------------------------


class Interrupt(Exception):
    pass


def counting(encoder: Encoder, monkeypatch: pytest.MonkeyPatch, fail_after: int | None = None) -> list[int]:
    """Counts the passages :meth:`Encoder.encode_passages` encodes; raises after ``fail_after`` calls."""
    counts: list[int] = []
    inner = Encoder.encode_passages

    def encode_passages(self: Encoder, batch: Sequence[Passage], *, progress: bool = False) -> np.ndarray:
        if fail_after is not None and len(counts) == fail_after:
            raise Interrupt
        counts.append(len(batch))
        return inner(self, batch, progress=progress)

    monkeypatch.setattr(Encoder, "encode_passages", encode_passages)
    return counts


def test_an_interrupted_build_is_never_loaded_and_resumes_where_it_stopped(
    tmp_path: Path, flat_dir: Path, passages: list[Passage], encoder: Encoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "idx"
    with monkeypatch.context() as m:
        counting(encoder, m, fail_after=2)
        with pytest.raises(Interrupt):
            build_dense_index(passages, encoder, out, chunk_size=50, progress=False)
    assert not (out / "dense.json").exists()
    with pytest.raises(ConfigError, match=r"half-built dense index \(100 of 120 passages encoded"):
        DenseRetriever.load(out, passages)
    with pytest.raises(ConfigError, match="half-built"):
        make_retriever(f"dense:{out}", passages)
    counts = counting(encoder, monkeypatch)
    build_dense_index(passages, encoder, out, chunk_size=50, progress=False)
    assert counts == [20]  # only what was missing
    assert not (out / "dense.building.json").exists() and not (out / "embeddings.partial.npy").exists()
    # The same as an uninterrupted build (up to float rounding: other chunks batch other texts together).
    np.testing.assert_allclose(
        np.load(out / "embeddings.npy"), np.load(flat_dir / "embeddings.npy"), atol=1e-6
    )
    build_dense_index(passages, encoder, out, progress=False)
    assert counts == [20]  # finished and identical: nothing to do
    build_dense_index(passages, encoder, out, index_type="hnsw", progress=False)
    assert counts == [20] and read_manifest(out)["index_type"] == "hnsw"  # embeddings reused
    (out / "index.faiss").unlink()  # a lost faiss file is built again, from the same embeddings
    build_dense_index(passages, encoder, out, index_type="hnsw", progress=False)
    assert counts == [20] and DenseRetriever.load(out, passages, encoder=encoder).index_type == "hnsw"


def test_a_build_refuses_a_folder_of_another_encoder_or_corpus(
    tmp_path: Path, flat_dir: Path, passages: list[Passage], encoder: Encoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = copy_index(flat_dir, tmp_path / "idx")
    other = tiny_encoder(seed=1)
    with pytest.raises(ConfigError, match=r"built from another encoder .* pass overwrite=True"):
        build_dense_index(passages, other, out, progress=False)
    with pytest.raises(ConfigError, match="another corpus"):
        build_dense_index(passages[:50], encoder, out, progress=False)
    with pytest.raises(ConfigError, match="passage_prefix"):
        build_dense_index(passages, tiny_encoder(passage_prefix=""), out, progress=False)
    build_dense_index(passages, other, out, progress=False, overwrite=True)
    DenseRetriever.load(out, passages, encoder=other)
    # A half-built folder of another encoder is refused too.
    half = tmp_path / "half"
    with monkeypatch.context() as m:
        counting(encoder, m, fail_after=1)
        with pytest.raises(Interrupt):
            build_dense_index(passages, encoder, half, chunk_size=50, progress=False)
    with pytest.raises(ConfigError, match="half-built dense index of another encoder"):
        build_dense_index(passages, other, half, chunk_size=50, progress=False)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"index_type": "annoy"}, r"unknown index type 'annoy'; choose one of \['flat', 'ivf', 'hnsw'\]"),
        ({"chunk_size": 0}, "chunk_size must be a positive integer"),
        ({"batch_size": -1}, "batch_size must be a positive integer"),
    ],
)
def test_bad_build_options_are_refused(
    tmp_path: Path, passages: list[Passage], encoder: Encoder, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        build_dense_index(passages, encoder, tmp_path, progress=False, **options)
    with pytest.raises(ConfigError, match="no passages"):
        build_dense_index([], encoder, tmp_path, progress=False)


# -- loading: every refusal --------------------------------------------------------------------------------


def test_load_refuses_another_encoder_dimension_or_corpus(flat_dir: Path, passages: list[Passage]) -> None:
    with pytest.raises(ConfigError, match=r"built with another encoder .*embed text differently"):
        DenseRetriever.load(flat_dir, passages, encoder=tiny_encoder(seed=1))
    with pytest.raises(ConfigError, match="pooling 'mean' vs 'cls'"):
        DenseRetriever.load(flat_dir, passages, encoder=tiny_encoder(pooling="cls"))
    with pytest.raises(
        ConfigError, match=r"dimension mismatch: .* 64-dimensional vectors but encoder 'tiny' produces 32"
    ):
        DenseRetriever.load(flat_dir, passages, encoder=tiny_encoder(hidden=32))
    with pytest.raises(ConfigError, match=r"stale dense index .* rebuild it"):
        DenseRetriever.load(flat_dir, passages[:-1], encoder=None)
    with pytest.raises(ConfigError, match="dimension mismatch"):
        DenseRetriever(passages, tiny_encoder(hidden=32), np.zeros((len(passages), 64), dtype=np.float32))


def test_load_refuses_missing_truncated_and_corrupt_files(
    tmp_path: Path, flat_dir: Path, passages: list[Passage], encoder: Encoder
) -> None:
    with pytest.raises(ConfigError, match=r"holds no dense index .* `searchgym index dense"):
        DenseRetriever.load(tmp_path, passages)
    out = copy_index(flat_dir, tmp_path / "truncated")
    data = (out / "embeddings.npy").read_bytes()
    (out / "embeddings.npy").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataFormatError, match=r"truncated or corrupt embeddings file .* rebuild"):
        DenseRetriever.load(out, passages, encoder=encoder)
    (out / "embeddings.npy").write_bytes(b"garbage!" * (len(data) // 8) + b"g" * (len(data) % 8))
    with pytest.raises(DataFormatError, match="corrupt embeddings file"):
        DenseRetriever.load(out, passages, encoder=encoder)
    (out / "embeddings.npy").unlink()
    with pytest.raises(DataFormatError, match="embeddings file is missing"):
        DenseRetriever.load(out, passages, encoder=encoder)
    (out / "dense.json").write_text("{not json")
    with pytest.raises(DataFormatError, match="corrupt dense index metadata"):
        DenseRetriever.load(out, passages, encoder=encoder)
    meta = read_manifest(flat_dir)
    (out / "dense.json").write_text(json.dumps({**meta, "format": 99}))
    with pytest.raises(ConfigError, match="format 99, this version reads 2; rebuild it"):
        DenseRetriever.load(out, passages, encoder=encoder)


def test_load_refuses_a_truncated_or_corrupt_faiss_index(
    tmp_path: Path, passages: list[Passage], encoder: Encoder
) -> None:
    out = build_dense_index(passages, encoder, tmp_path / "hnsw", index_type="hnsw", progress=False)
    data = (out / "index.faiss").read_bytes()
    (out / "index.faiss").write_bytes(data[:-100])
    with pytest.raises(DataFormatError, match=r"does not match the size and hash dense\.json records"):
        DenseRetriever.load(out, passages, encoder=encoder)
    (out / "index.faiss").write_bytes(b"\0" * len(data))
    with pytest.raises(DataFormatError, match=r"does not match the size and hash dense\.json records"):
        DenseRetriever.load(out, passages, encoder=encoder)


def test_missing_faiss_or_torch_names_the_extra(
    tmp_path: Path, flat_dir: Path, passages: list[Passage], encoder: Encoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    hnsw = build_dense_index(passages, encoder, tmp_path, index_type="hnsw", progress=False)
    zeros = np.zeros((len(passages), 64), dtype=np.float32)
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "faiss", None)  # import faiss now raises ImportError
        for call in (
            lambda: DenseRetriever.load(hnsw, passages),
            lambda: make_retriever(f"dense:{hnsw}", passages),
            lambda: DenseRetriever(passages, encoder, zeros, index_type="ivf"),
            lambda: build_dense_index(passages, encoder, tmp_path, index_type="ivf", progress=False),
        ):
            with pytest.raises(MissingDependencyError, match=re.escape(install_command("dense"))):
                call()
        # The exact (flat) search is BLAS matrix products: it runs without faiss.
        assert len(DenseRetriever.load(flat_dir, passages, encoder=encoder).search(["q"], 3)[0]) == 3
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "transformers", None)
        with pytest.raises(MissingDependencyError, match=re.escape(install_command("dense"))):
            load_encoder("tiny")


# -- hybrid ----------------------------------------------------------------------------------------------


class Fixed(Retriever):
    """Answers every query with the same ranking of passage positions; counts its calls."""

    def __init__(self, corpus: list[Passage], ranking: list[int]) -> None:
        self.corpus, self.ranking = corpus, ranking
        self.calls: list[int] = []

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.calls.append(len(queries))
        return [[Hit.of(self.corpus[i], 1.0) for i in self.ranking[:k]] for _ in queries]


def test_hybrid_fuses_rankings_by_reciprocal_rank() -> None:
    corpus = [Passage(str(i), f"t{i}", "x") for i in range(6)]
    a, b = Fixed(corpus, [3, 1, 0]), Fixed(corpus, [1, 4, 3, 5])
    hybrid = HybridRetriever([a, b], corpus, depth=4, k0=60)
    hits = hybrid.search(["q1", "q2"], 4)
    assert a.calls == b.calls == [2]  # one batched call per part
    # 1: 1/62 + 1/61; 3: 1/61 + 1/63; 4: 1/62; 0: 1/63; 5: 1/64.
    assert [h.passage_id for h in hits[0]] == ["1", "3", "4", "0"] == [h.passage_id for h in hits[1]]
    assert hits[0][0].score == pytest.approx(1 / 62 + 1 / 61)
    # Equal fused scores: the earlier passage first.
    tie = HybridRetriever([Fixed(corpus, [5, 2]), Fixed(corpus, [2, 5])], corpus)
    assert [h.passage_id for h in tie.search(["q"], 2)[0]] == ["2", "5"]
    assert hybrid.search([], 3) == [] and hybrid.search(["q"], 0) == [[]]
    with pytest.raises(ConfigError, match="not in the hybrid retriever's corpus"):
        HybridRetriever([a], corpus[:2]).search(["q"], 3)
    for kwargs, message in (({"depth": 0}, "depth must be"), ({"k0": -1}, "k0 must be")):
        with pytest.raises(ConfigError, match=message):
            HybridRetriever([a], corpus, **kwargs)
    with pytest.raises(ConfigError, match="at least one retriever"):
        HybridRetriever([], corpus)


def test_hybrid_spec_fuses_bm25_and_the_dense_index(flat_dir: Path, passages: list[Passage]) -> None:
    hybrid = make_retriever(f"hybrid:{flat_dir}", passages)
    assert isinstance(hybrid, HybridRetriever) and hybrid.name == "hybrid"
    assert [type(r) for r in hybrid.retrievers] == [BM25Retriever, DenseRetriever]
    query = passages[7].title
    fused: dict[str, float] = {}
    for part in hybrid.retrievers:
        for rank, hit in enumerate(part.search([query], 50)[0], start=1):
            fused[hit.passage_id] = fused.get(hit.passage_id, 0.0) + 1 / (60 + rank)
    position = {p.id: i for i, p in enumerate(passages)}
    expected = sorted(fused, key=lambda pid: (-fused[pid], position[pid]))[:3]
    assert [h.passage_id for h in hybrid.search([query], 3)[0]] == expected
    assert hybrid.nbytes > DenseRetriever.load(flat_dir, passages).nbytes
    with pytest.raises(ConfigError, match="names no index folder; use hybrid:INDEX_DIR"):
        make_retriever("hybrid:", passages)


# -- recall ------------------------------------------------------------------------------------------------


def test_gold_recall_counts_questions_with_a_gold_passage_in_the_top_k() -> None:
    world = generate_world(seed=0)
    questions = world.questions("test")[:50]
    bm25 = BM25Retriever(world.passages)
    recall = gold_recall(bm25, questions, 3, batch_size=7)
    hits = bm25.search([q.question for q in questions], 3)
    found = [
        bool({h.passage_id for h in hs} & set(q.supporting_ids))
        for q, hs in zip(questions, hits, strict=True)
    ]
    every = [
        set(q.supporting_ids) <= {h.passage_id for h in hs} for q, hs in zip(questions, hits, strict=True)
    ]
    assert (recall.k, recall.questions) == (3, 50)
    assert recall.any_gold == pytest.approx(np.mean(found)) and recall.all_gold == pytest.approx(
        np.mean(every)
    )
    bare = [type(q)(q.id, q.question, q.golden_answers) for q in questions]
    with pytest.raises(ConfigError, match="no question carries gold passage ids"):
        gold_recall(bm25, bare)


def test_the_module_does_not_import_torch_or_faiss_at_import_time() -> None:
    import subprocess

    code = (
        "import sys, searchgym.retrieval.dense, searchgym.retrieval; "
        "print(sorted(m for m in ('torch', 'faiss', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", dense_module.__name__


# -- crafted and damaged index files ---------------------------------------------------------------------------

BOMB = "9" * 5000  # an integer of more than 4,300 digits: Python's int() refuses it with a ValueError


@pytest.fixture(scope="module")
def dense_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], list[Passage]]:
    """Flat, IVF and HNSW indexes of 200 passages, shared read-only (tests edit copies)."""
    passages = [
        Passage(str(i), f"title {i}", f"alpha beta gamma {i} delta {i % 3} w{i % 7}") for i in range(200)
    ]
    root = tmp_path_factory.mktemp("dense")
    encoder = tiny_encoder()
    dirs = {
        kind: build_dense_index(passages, encoder, root / kind, index_type=kind, progress=False)
        for kind in ("flat", "ivf", "hnsw")
    }
    return dirs, passages


def reseal(manifest: Path, **changes: Any) -> None:
    """The manifest with ``changes`` and fresh hashes of its files: what a crafted index carries."""
    from searchgym.integrity import seal

    meta = json.loads(manifest.read_text())
    files = {name: manifest.parent / name for name in meta.get("files", {})}
    manifest.write_text(json.dumps(seal({**meta, **changes}, files)))


def test_an_integer_bomb_in_each_json_file_is_a_typed_error(
    tmp_path: Path, dense_dirs: tuple[dict[str, Path], list[Passage]]
) -> None:
    from searchgym.data import load_flashrag

    folder, passages = bm25_index(tmp_path)
    meta = (folder / "bm25.json").read_text()
    (folder / "bm25.json").write_text(meta.replace('"passages": 40', f'"passages": {BOMB}'))
    with pytest.raises(DataFormatError, match=r"bm25\.json.*Exceeds the limit"):
        BM25Retriever.load(folder, passages)
    dirs, dense_passages = dense_dirs
    out = copy_index(dirs["flat"], tmp_path / "dense")
    manifest = (out / "dense.json").read_text()
    (out / "dense.json").write_text(manifest.replace('"count": 200', f'"count": {BOMB}'))
    with pytest.raises(DataFormatError, match=r"dense\.json.*Exceeds the limit"):
        DenseRetriever.load(out, dense_passages)
    data = tmp_path / "data"
    data.mkdir()
    good_corpus = '{"id": "0", "contents": "\\"T\\"\\ntext"}\n'
    good_split = '{"id": "q0", "question": "q?", "golden_answers": ["a"]}\n'
    for name, line in (
        ("corpus.jsonl", f'{{"id": "1", "contents": "x", "n": {BOMB}}}\n'),
        ("test.jsonl", f'{{"id": {BOMB}}}\n'),
    ):
        (data / "corpus.jsonl").write_text(good_corpus + (line if name == "corpus.jsonl" else ""))
        (data / "test.jsonl").write_text(good_split + (line if name == "test.jsonl" else ""))
        with pytest.raises(DataFormatError, match=rf"{name}:2: invalid JSON \(Exceeds the limit"):
            load_flashrag(data, splits=("test",))


def test_dense_manifest_field_changes_are_typed_errors(
    tmp_path: Path, dense_dirs: tuple[dict[str, Path], list[Passage]]
) -> None:
    dirs, passages = dense_dirs
    # Changed by hand: the manifest's own checksum refuses it.
    out = copy_index(dirs["hnsw"], tmp_path / "edited")
    text = (out / "dense.json").read_text()
    (out / "dense.json").write_text(text.replace('"index_type": "hnsw"', '"index_type": "ivf"'))
    with pytest.raises(DataFormatError, match="fails its checksum"):
        DenseRetriever.load(out, passages)
    # Changed and re-sealed (a crafted index): each field is checked for what it is.
    cases = [
        (
            "hnsw",
            {"index_type": "ivf"},
            r"index_params \['M', 'ef_construction', 'ef_search'\] are not those of a ivf",
        ),
        ("hnsw", {"index_params": {"M": 32, "ef_construction": 80, "ef_search": 1.5}}, "'ef_search' is 1.5"),
        (
            "hnsw",
            {"index_type": "ivf", "index_params": {"nlist": 4, "nprobe": 2}},
            "holds a IndexHNSWFlat, not the ivf",
        ),
        ("flat", {"index_type": "nope"}, "unknown index type 'nope'"),
        ("flat", {"dim": True}, "dim must be a positive integer"),
        ("flat", {"encoder": []}, "encoder must be an object"),
    ]
    for i, (kind, change, message) in enumerate(cases):
        out = copy_index(dirs[kind], tmp_path / f"crafted{i}")
        reseal(out / "dense.json", **change)
        with pytest.raises(DataFormatError, match=message):
            DenseRetriever.load(out, passages)


@pytest.mark.parametrize("bad", [10**6, -2])  # faiss's "none" is -1 only: -2 is damage too
def test_faiss_ids_outside_the_corpus_are_a_typed_error(
    bad: int, dense_dirs: tuple[dict[str, Path], list[Passage]]
) -> None:
    import faiss

    dirs, passages = dense_dirs
    retriever = DenseRetriever.load(dirs["ivf"], passages)
    # A corrupted IVF index whose lists hold ids outside the corpus (what a damaged file returns).
    ids = faiss.extract_index_ivf(retriever.index).invlists
    list_no = next(i for i in range(ids.nlist) if ids.list_size(i))
    faiss.rev_swig_ptr(ids.get_ids(list_no), ids.list_size(list_no))[0] = bad
    retriever.index.nprobe = ids.nlist
    with pytest.raises(
        DataFormatError, match=rf"index\.faiss.*returned passage id {bad}, but the corpus holds 200"
    ):
        retriever.search([p.text for p in passages[:50]], 200)


def test_a_npy_header_numpy_cannot_tokenize_is_a_typed_error(
    tmp_path: Path, dense_dirs: tuple[dict[str, Path], list[Passage]]
) -> None:
    """A damaged ``embeddings.npy`` header that NumPy's header parser cannot tokenize (``tokenize.TokenError``):
    a ``DataFormatError``."""
    dirs, passages = dense_dirs
    out = copy_index(dirs["flat"], tmp_path / "dense")
    data = bytearray((out / "embeddings.npy").read_bytes())
    data[data.index(b"}")] = ord(" ")  # the header dict never closes
    (out / "embeddings.npy").write_bytes(bytes(data))
    with pytest.raises(DataFormatError, match="corrupt embeddings file"):
        DenseRetriever.load(out, passages)


def test_dense_files_are_checked_by_hash_and_embeddings_for_non_finite_values(
    tmp_path: Path, dense_dirs: tuple[dict[str, Path], list[Passage]]
) -> None:
    dirs, passages = dense_dirs
    for kind, name in (("flat", "embeddings.npy"), ("hnsw", "index.faiss")):
        out = copy_index(dirs[kind], tmp_path / f"flip-{kind}")
        data = bytearray((out / name).read_bytes())
        data[len(data) - 9] ^= 0x10  # same size: a size check alone would pass it
        (out / name).write_bytes(bytes(data))
        with pytest.raises(
            DataFormatError, match=rf"{name}: does not match the size and hash dense\.json records"
        ):
            DenseRetriever.load(out, passages)
    out = copy_index(dirs["flat"], tmp_path / "nan")
    embeddings = np.load(out / "embeddings.npy")
    embeddings[123, 7] = np.nan
    np.save(out / "embeddings.npy", embeddings)
    reseal(out / "dense.json")  # a crafted index: the hash fits, the values do not
    with pytest.raises(DataFormatError, match=r"embeddings\.npy: holds a non-finite value"):
        DenseRetriever.load(out, passages)


def dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(proc.stdout)


def test_leftover_temp_files_of_dead_writers_are_removed(
    tmp_path: Path, dense_dirs: tuple[dict[str, Path], list[Passage]]
) -> None:
    pid = dead_pid()
    folder, passages = bm25_index(tmp_path)
    stale = [f".bm25.json.{pid}", f".bm25.npz.{pid}.npz", f".bm25.json.{pid}.1a2b3c4d.tmp"]
    live = f".bm25.json.{os.getppid()}.1a2b3c4d.tmp"  # a live process's write is kept
    for name in (*stale, live, "notes.txt"):
        (folder / name).write_text("x")
    BM25Retriever(passages).save(folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted([live, "bm25.json", "bm25.npz", "notes.txt"])
    dirs, dense_passages = dense_dirs
    out = copy_index(dirs["flat"], tmp_path / "dense")
    for name in (f".dense.building.json.{pid}.tmp", f".index.faiss.{pid}.tmp", f".dense.json.{pid}.cafe.tmp"):
        (out / name).write_text("x")
    build_dense_index(dense_passages, tiny_encoder(), out, progress=False)
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
