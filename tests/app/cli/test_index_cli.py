"""``searchgym index dense|bm25``, and ``dense:INDEX_DIR`` in ``--retriever`` of eval and serve."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from searchgym import server as server_module
from searchgym.app.cli import main
from searchgym.data import generate_world
from searchgym.data.flashrag import read_corpus
from searchgym.retrieval import BM25Retriever
from searchgym.retrieval.dense import DenseRetriever, read_manifest

from ...conftest import server_client

pytest.importorskip("faiss", reason="the dense extra (faiss-cpu) is not installed")
pytest.importorskip("transformers", reason="the dense extra (transformers) is not installed")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A FlashRAG folder of 60 generated passages and the questions whose gold passages are among them."""
    world = generate_world(seed=0)
    root = tmp_path_factory.mktemp("data")
    passages = world.passages[:60]
    ids = {p.id for p in passages}
    with (root / "corpus.jsonl").open("w") as f:
        for p in passages:
            f.write(json.dumps({"id": p.id, "contents": p.contents}) + "\n")
    with (root / "test.jsonl").open("w") as f:
        for q in world.questions("test"):
            if set(q.supporting_ids) <= ids:
                meta = {"supporting_passage_ids": list(q.supporting_ids)}
                record = {"id": q.id, "question": q.question, "golden_answers": list(q.golden_answers)}
                f.write(json.dumps({**record, "metadata": meta}) + "\n")
    return root


def index_dense(folder: Path, out: Path, *extra: str) -> int:
    return main(["index", "dense", "--corpus", str(folder), "--encoder", "tiny", "--out", str(out), *extra])


def test_the_tiny_encoder_says_it_is_random(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert index_dense(folder, tmp_path / "idx", "--no-progress", "--json") == 0
    err = capsys.readouterr().err
    assert "note: --encoder tiny has random weights: it checks the plumbing, not retrieval" in err
    assert "docs/retrieval.md" in err


def test_index_dense_builds_reuses_and_reports_recall(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "idx"
    args = ["--no-progress", "--json", "--recall-split", "test", "--batch-size", "16", "--chunk-size", "25"]
    assert index_dense(folder, out, *args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["index"] == "dense" and summary["passages"] == 60 and summary["dim"] == 64
    assert summary["index_type"] == "flat" and summary["encoder"] == "tiny"
    assert summary["recall"]["k"] == 3 and summary["recall"]["questions"] > 0
    assert 0 <= summary["recall"]["any_gold"] <= 1
    meta = read_manifest(out)
    assert meta["encoder"]["query_prefix"] == "query: " and meta["encoder"]["pooling"] == "mean"
    # The same command again: nothing to do, the same figures.
    assert index_dense(folder, out, *args) == 0
    assert json.loads(capsys.readouterr().out)["recall"] == summary["recall"]
    # Another index type reuses the embeddings; other settings are refused without --overwrite.
    assert index_dense(folder, out, "--no-progress", "--index-type", "hnsw") == 0
    assert read_manifest(out)["index_type"] == "hnsw"
    capsys.readouterr()
    assert index_dense(folder, out, "--no-progress", "--no-prefixes", "--pooling", "cls") == 2
    assert "pass overwrite=True (--overwrite)" in capsys.readouterr().err
    assert index_dense(folder, out, "--no-progress", "--no-prefixes", "--pooling", "cls", "--overwrite") == 0
    meta = read_manifest(out)
    assert (meta["encoder"]["query_prefix"], meta["encoder"]["pooling"]) == ("", "cls")
    # The index fits the corpus as every other command reads it: the folder and its corpus.jsonl.
    DenseRetriever.load(out, read_corpus(folder / "corpus.jsonl"))


def test_a_dense_index_serves_eval_and_serve(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "idx"
    assert index_dense(folder, out, "--no-progress") == 0
    capsys.readouterr()
    common = ["--dataset", str(folder), "--retriever", f"dense:{out}", "--no-progress", "--json"]
    assert main(["eval", "--agent", "heuristic", "--episodes", "2", *common]) == 0
    assert "searches" in json.loads(capsys.readouterr().out)
    served: list[Any] = []
    monkeypatch.setattr(server_module, "run_server", lambda app, **kw: served.append(app))
    assert main(["serve", "--corpus", str(folder), "--retriever", f"dense:{out}", "--device", "cpu"]) == 0
    assert len(served) == 1 and "loaded the dense index" in capsys.readouterr().out
    from searchgym.server import ServerThread

    with ServerThread(served[0]) as srv, server_client(srv.url) as http:
        r = http.post("/retrieve", json={"queries": ["a", "b c"], "topk": 2, "return_scores": True})
        health = http.get("/health").json()
    assert [len(hits) for hits in r.json()["result"]] == [2, 2] and health["retriever"] == "dense"
    assert main(["serve", "--corpus", str(folder), "--retriever", f"hybrid:{out}"]) == 0
    assert "loaded the dense index" in capsys.readouterr().out
    with ServerThread(served[-1]) as srv, server_client(srv.url) as http:
        assert http.get("/health").json()["retriever"] == "hybrid"
    assert main(["serve", "--corpus", str(folder), "--retriever", "dense:"]) == 2
    assert "names no index folder" in capsys.readouterr().err
    assert (
        main(["serve", "--corpus", str(folder), "--retriever", f"dense:{out}", "--index", str(tmp_path)]) == 2
    )
    assert "--index applies to the bm25 retriever only" in capsys.readouterr().err


def test_index_dense_errors_say_what_to_do(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["index", "dense", "--corpus", str(folder), "--encoder", "no/such", "--out", str(tmp_path)]) == 2
    )
    assert "huggingface-cli download" in capsys.readouterr().err
    assert index_dense(tmp_path / "missing", tmp_path / "idx") == 2
    assert "neither 'world' nor an existing FlashRAG folder" in capsys.readouterr().err
    assert index_dense(tmp_path, tmp_path / "idx") == 2  # a folder without corpus.jsonl
    assert "no corpus.jsonl" in capsys.readouterr().err
    lone = folder / "corpus.jsonl"
    assert index_dense(lone, tmp_path / "idx", "--no-progress", "--recall-split", "test") == 2
    assert "--recall-split needs a dataset folder" in capsys.readouterr().err
    assert (
        main(["eval", "--agent", "random", "--retriever", f"dense:{tmp_path / 'none'}", "--episodes", "1"])
        == 2
    )
    assert "holds no dense index" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        index_dense(folder, tmp_path / "idx", "--pooling", "max")


def test_index_bm25_saves_what_serve_and_load_read(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bm25"
    args = ["index", "bm25", "--corpus", str(folder), "--out", str(out), "--no-progress"]
    assert main([*args, "--json", "--recall-split", "test"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["index"] == "bm25" and summary["passages"] == 60
    assert summary["recall"]["any_gold"] > 0.5  # BM25 finds generated entities by name
    passages = read_corpus(folder / "corpus.jsonl")
    BM25Retriever.load(out, passages)
    assert main(args) == 2  # the folder holds an index: replaced only when asked
    assert "--overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    assert "recall" not in capsys.readouterr().out
    assert main(["index", "bm25", "--corpus", "world", "--out", str(tmp_path / "w"), "--no-progress"]) == 0
    assert BM25Retriever.load(tmp_path / "w", generate_world(seed=0).passages).nbytes > 0


def test_index_bm25_over_another_index_is_refused_without_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": str(i), "contents": f'"T{i}"\nword{i} text'}) + "\n" for i in range(5))
    )
    out = tmp_path / "index"
    assert main(["index", "bm25", "--corpus", "world", "--out", str(out), "--no-progress"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main(["index", "bm25", "--corpus", str(corpus), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "already holds files" in err and "bm25.json" in err and "--overwrite" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the world's index is untouched
    assert (
        main(["index", "bm25", "--corpus", str(corpus), "--out", str(out), "--overwrite", "--no-progress"])
        == 0
    )
    assert len(BM25Retriever.load(out, read_corpus(corpus)).passages) == 5
