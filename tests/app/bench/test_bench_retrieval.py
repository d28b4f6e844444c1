"""``searchgym bench retrieval``: every back end reports figures or why it was skipped, and the ratios exist.

Tiny corpora and one timing round: these tests check the report, never a time.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from searchgym.app.bench import retrieval_backends
from searchgym.app.bench.retrieval import RetrievalBenchConfig, run_retrieval_benchmark, zipf_corpus
from searchgym.app.cli import main
from searchgym.errors import ConfigError
from searchgym.retrieval import STOP_WORDS
from searchgym.retrieval import bm25 as bm25_module

pytestmark = pytest.mark.slow  # every backend built and timed: the long part of the suite

FIGURES = ("build_s", "index_mb", "p50_ms", "p90_ms", "batch_ms")
BACKENDS = {
    "bm25",
    "bm25_numpy",
    "bm25s_numpy",
    "bm25s_numba",
    "rank_bm25",
    "dense",
    "dense_faiss",
    "dense_encoder",
}
HEADLINE = ("speedup_batch64_vs_bm25s_numba", "speedup_p50_vs_bm25s_numba")


def tiny(**overrides: Any) -> RetrievalBenchConfig:
    settings: dict[str, Any] = {
        "sizes": (400,),
        "corpus": "zipf",
        "repeats": 1,
        "queries": 16,
        "batch": 8,
        "reference_queries": 4,
        "agreement_queries": 16,
        "dense_dim": 16,
        "encoder_max": 0,
    }
    return RetrievalBenchConfig(**(settings | overrides))


def ran(figures: dict[str, Any]) -> bool:
    if "skipped" in figures:
        assert isinstance(figures["skipped"], str) and figures["skipped"]
        return False
    for key in FIGURES:
        if figures[key] is not None:
            assert math.isfinite(figures[key]) and figures[key] >= 0, key
    return True


def test_every_backend_runs_or_says_why(tmp_path: Path) -> None:
    pytest.importorskip("bm25s")
    pytest.importorskip("numba")
    pytest.importorskip("faiss")
    cfg = tiny(sizes=(300, 500), data_dir=str(tmp_path))  # no shared data there: synthetic everywhere
    result = run_retrieval_benchmark(cfg, with_dense=True)
    assert [s["passages"] for s in result["sizes"]] == [300, 500]
    for size in result["sizes"]:
        assert set(size["backends"]) == BACKENDS
        assert size["corpus"]["kind"] == "zipf"
        for name in ("bm25", "bm25_numpy", "bm25s_numpy", "bm25s_numba", "rank_bm25", "dense", "dense_faiss"):
            assert ran(size["backends"][name]), name
        assert size["backends"]["bm25"]["engine"] == "numba"
        assert size["backends"]["bm25_numpy"]["engine"] == "numpy"
        assert "encoder_max" in size["backends"]["dense_encoder"]["skipped"]
    # The top level holds the largest size's figures and the headline ratios, from the same run.
    top = result["backends"]
    assert result["corpus"]["passages"] == 500
    for key in HEADLINE:
        assert result[key] > 0, key
    assert (
        result["speedup_batch64_vs_bm25s_numba"] == top["bm25s_numba"]["batch_ms"] / top["bm25"]["batch_ms"]
    )
    assert result["speedup_p50_vs_bm25s_numba"] == top["bm25s_numba"]["p50_ms"] / top["bm25"]["p50_ms"]
    assert result["numba_warmup_s"] == result["sizes"][0]["backends"]["bm25s_numba"]["warmup_s"] > 0
    assert "warmup_s" not in top["bm25s_numpy"] and "warmup_s" not in top["bm25_numpy"]
    # Our kernel's warm-up, timed in fresh processes: with numba's cache empty, then filled.
    assert result["bm25_compile_s"] > 0 and result["bm25_warmup_s"] > 0
    assert top["bm25"]["warmup_s"] == result["bm25_warmup_s"]
    assert result["bm25_kernel_warmup"] == {
        "compile_s": result["bm25_compile_s"],
        "warmup_s": result["bm25_warmup_s"],
    }
    ours, theirs = top["bm25"]["batch_ms"] / 1e3, top["bm25s_numba"]["batch_ms"] / 1e3
    first = (result["numba_warmup_s"] + theirs) / (result["bm25_warmup_s"] + ours)
    assert result["speedup_first_batch64_vs_bm25s_numba"] == pytest.approx(first, rel=1e-12)
    if theirs > ours:
        expected = result["bm25_warmup_s"] / (theirs - ours)
        assert result["bm25_warmup_batches"] == pytest.approx(expected, rel=1e-12)
    else:
        assert result["bm25_warmup_batches"] is None
    assert result["speedup_batch64_numpy_engine_vs_bm25s_numba"] == (
        top["bm25s_numba"]["batch_ms"] / top["bm25_numpy"]["batch_ms"]
    )
    assert result["agreement"]["corpus"] == "zipf"
    assert result["top3_agreement_vs_rank_bm25"] == 1.0
    assert json.loads(json.dumps(result)) == result


@pytest.mark.parametrize(
    ("module", "skipped"),
    [
        ("bm25s", {"bm25s_numpy", "bm25s_numba"}),
        ("numba", {"bm25s_numba"}),
        ("faiss", {"dense_faiss"}),  # the default flat dense search is searchgym's own: no faiss needed
        ("rank_bm25", {"rank_bm25"}),
    ],
)
def test_a_missing_package_skips_its_backends_with_a_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, module: str, skipped: set[str]
) -> None:
    real = retrieval_backends.missing

    def missing(name: str) -> str | None:
        return f"{name} is not installed (pip install 'searchgym[bench]')" if name == module else real(name)

    monkeypatch.setattr(retrieval_backends, "missing", missing)
    result = run_retrieval_benchmark(tiny(data_dir=str(tmp_path)), with_dense=True)
    for name in skipped:
        assert f"{module} is not installed" in result["backends"][name]["skipped"], name
    for key in HEADLINE if "bm25s_numba" in skipped else ():
        assert key in result and result[key] is None
    if module == "rank_bm25":
        assert result["top3_agreement_vs_rank_bm25"] is None
        assert module in result["agreement"]["skipped"]
    assert ran(result["backends"]["bm25"])


def test_without_numba_bm25_runs_numpy_and_has_no_warmup(tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as patch:  # as if numba were not installed
        patch.setattr(bm25_module, "_kernel", None)
        patch.setattr(bm25_module, "_kernel_failure", "numba is not installed")
        result = run_retrieval_benchmark(tiny(data_dir=str(tmp_path)), with_bm25s=False, with_reference=False)
    assert result["backends"]["bm25"]["engine"] == result["backends"]["bm25_numpy"]["engine"] == "numpy"
    assert "warmup_s" not in result["backends"]["bm25"]
    assert result["bm25_warmup_s"] is None and result["bm25_compile_s"] is None
    assert "numba" in result["bm25_kernel_warmup"]["skipped"]
    assert result["speedup_first_batch64_vs_bm25s_numba"] is None


def test_the_dense_rows_time_the_same_search() -> None:
    """``dense`` (searchgym's flat scan) and ``dense_faiss`` answer the same queries with the same passages."""
    pytest.importorskip("faiss")
    ours = retrieval_backends.build_dense(500, 16, 8, 3, seed=1)
    theirs = retrieval_backends.build_dense(500, 16, 8, 3, seed=1, engine="faiss")
    assert not isinstance(ours, str) and not isinstance(theirs, str)
    ids = [np.asarray(i) for i, _ in ours.search(list(ours.queries))]
    _, faiss_ids = theirs.search(list(theirs.queries))
    assert np.array_equal(np.stack(ids), faiss_ids)


def test_suite_call_keeps_working() -> None:
    """``searchgym bench all`` calls the benchmark with this signature and reads these keys."""
    result = run_retrieval_benchmark(
        RetrievalBenchConfig(passages=300, repeats=1, queries=16, batch=8),
        with_bm25s=False,
        with_reference=False,
    )
    assert result["corpus"]["passages"] == 300
    assert result["backends"]["bm25"]["p50_ms"] > 0 and result["backends"]["bm25"]["batch_ms"] > 0
    assert "skipped" in result["backends"]["dense"] and "agreement" not in result


def test_agreement_is_measured_on_the_shared_data(hotpot_dir: Path) -> None:
    pytest.importorskip("rank_bm25")
    cfg = tiny(data_dir=str(hotpot_dir.parent), sizes=(1000,), corpus="auto", agreement_queries=24)
    result = run_retrieval_benchmark(cfg, with_bm25s=False)
    assert result["corpus"]["kind"] == "hotpotqa"
    assert result["agreement"] == {
        "corpus": "hotpotqa",
        "passages": 10_787,
        "queries": 24,
        "top3_agreement": 1.0,
    }


def test_zipf_corpus_is_seeded_and_shaped() -> None:
    passages, queries = zipf_corpus(200, 30, seed=5, mean_words=20)
    again = zipf_corpus(200, 30, seed=5, mean_words=20)
    assert (passages, queries) == again and zipf_corpus(200, 30, seed=6, mean_words=20) != again
    assert [p.id for p in passages] == [str(i) for i in range(200)]
    assert all(10 <= len(f"{p.title} {p.text}".split()) <= 30 for p in passages)
    assert all(3 <= len(q.split()) <= 8 for q in queries)
    counts = Counter(" ".join(p.text for p in passages).split())
    assert all(word in STOP_WORDS for word, _ in counts.most_common(5))  # stop words take the top ranks


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="batch"):
        RetrievalBenchConfig(queries=8, batch=64)
    with pytest.raises(ConfigError, match="analysis"):
        RetrievalBenchConfig(analysis="fancy")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="corpus"):
        RetrievalBenchConfig(corpus="wiki")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="sizes"):
        RetrievalBenchConfig(sizes=(1000, 0))


def test_cli_prints_json_and_a_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ["bench", "retrieval", "--sizes", "300", "--queries", "16", "--batch", "8", "--repeats", "1"]
    args += ["--reference-queries", "4", "--corpus", "zipf", "--data", str(tmp_path), "--dense-dim", "8"]
    assert main([*args, "--no-bm25s", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["backends"]) == BACKENDS
    assert "--no-bm25s" in result["backends"]["bm25s_numba"]["skipped"]
    assert result["speedup_batch64_vs_bm25s_numba"] is None
    assert main([*args, "--no-bm25s", "--no-dense", "--no-reference"]) == 0
    out = capsys.readouterr().out
    assert "300 passages (zipf" in out and "bm25s_numba: skipped" in out
    if result["bm25_warmup_s"] is not None:  # numba installed: the kernel's warm-up is in the text too
        assert "bm25_warmup_s (our kernel's load in a fresh process" in out
    with pytest.raises(SystemExit):
        main(["bench", "retrieval", "--sizes", "10,x"])
