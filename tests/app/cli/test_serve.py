"""``searchgym serve`` (with the blocking server replaced): a folder with an index, a corpus file, bad paths, the
slow-client options, the corpus contents served byte for byte, and a port already taken."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from searchgym import server as server_module
from searchgym.app.cli import main
from searchgym.server import ServerThread

from ...conftest import searchr1_client, server_client


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, str, int]]:
    """Captures what ``searchgym serve`` would serve instead of blocking."""
    calls: list[tuple[Any, str, int]] = []
    monkeypatch.setattr(
        server_module,
        "run_server",
        lambda app, host, port, log_level, on_ready: calls.append((app, host, port)),
    )
    return calls


def write_corpus(folder: Path, texts: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": str(i), "contents": f'"T{i}"\n{t}'}) for i, t in enumerate(texts)]
    (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_serve_a_folder_with_an_index(
    tmp_path: Path, served: list[tuple[Any, str, int]], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_corpus(tmp_path / "data", ["red apples", "green pears", "red cars"])
    args = ["serve", "--corpus", str(folder), "--port", "8123", "--index", str(tmp_path / "idx")]
    assert main(args) == 0  # builds and saves the index
    assert (tmp_path / "idx" / "bm25.json").is_file()
    assert main(args) == 0  # loads it
    app, host, port = served[-1]
    assert (host, port) == ("127.0.0.1", 8123)
    with ServerThread(app) as srv, server_client(srv.url) as http:
        r = http.post("/retrieve", json={"queries": ["red"], "topk": 2, "return_scores": True})
    assert [e["document"]["id"] for e in r.json()["result"][0]] == ["0", "2"]
    # The corpus changed: the saved index is stale and refused.
    write_corpus(tmp_path / "data", ["red apples", "green pears"])
    assert main(args) == 2
    assert "stale BM25 index" in capsys.readouterr().err
    assert main([*args[:-2]]) == 0  # without --index the corpus is indexed afresh


def test_serve_a_corpus_file_and_bad_paths(tmp_path: Path, served: list[tuple[Any, str, int]]) -> None:
    folder = write_corpus(tmp_path, ["a b", "c"])
    assert main(["serve", "--corpus", str(folder / "corpus.jsonl"), "--retriever", "rank_bm25"]) == 0
    assert main(["serve", "--corpus", str(tmp_path / "missing")]) == 2  # a clear error, no traceback


def test_serve_options_for_slow_clients(tmp_path: Path, served: list[tuple[Any, str, int]]) -> None:
    folder = write_corpus(tmp_path, ["a b", "c"])
    assert main(["serve", "--corpus", str(folder)]) == 0
    defaults = served[-1][0].state.limits
    assert (defaults.read_timeout, defaults.write_timeout, defaults.max_connections) == (10.0, 30.0, 1024)
    args = ["--read-timeout", "2.5", "--write-timeout", "60", "--max-connections", "64"]
    assert main(["serve", "--corpus", str(folder), *args]) == 0
    limits = served[-1][0].state.limits
    assert (limits.read_timeout, limits.write_timeout, limits.max_connections) == (2.5, 60.0, 64)
    assert main(["serve", "--corpus", str(folder), "--read-timeout", "0"]) == 2  # a ConfigError, one line


def write_raw_corpus(folder: Path, contents: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    """A corpus whose records' ``contents`` are the strings given, as they are."""
    lines = [json.dumps({"id": str(i), "contents": c}) for i, c in enumerate(contents)]
    (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def test_contents_come_back_byte_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    contents = [
        "Bare Title\nunquoted title lines, as 121 of FlashRAG's quick-start records",
        '"Quoted"\nends in white space  ',
        '  "Padded" \nthe title line has spaces',
        'DPR ""doubled"" quotes\nand a second\nline',
        "no newline at all",
    ]
    folder = write_raw_corpus(tmp_path / "c", contents)
    apps: list[Any] = []
    monkeypatch.setattr(server_module, "run_server", lambda app, **kwargs: apps.append(app))
    assert main(["serve", "--corpus", str(folder)]) == 0
    with ServerThread(apps[0]) as srv:
        result = searchr1_client(srv.url, ["unquoted", "white space", "padded", "doubled", "newline"], topk=5)
    served_contents = {e["document"]["id"]: e["document"]["contents"] for hits in result for e in hits}
    assert served_contents == {str(i): c for i, c in enumerate(contents)}


def test_serve_prints_serving_only_after_the_bind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_raw_corpus(tmp_path / "c", ['"T"\nsome text'])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["serve", "--corpus", str(folder), "--port", str(port)]) == 2
    captured = capsys.readouterr()
    assert "serving" not in captured.out
    assert f"cannot listen on 127.0.0.1:{port}" in captured.err


def test_serve_index_writes_only_into_an_empty_folder_without_overwrite(
    tmp_path: Path, served: list[tuple[Any, str, int]], capsys: pytest.CaptureFixture[str]
) -> None:
    """``serve --index DIR`` and ``index bm25 --out DIR`` follow one rule: a folder that holds other files is
    written into only with --overwrite."""
    folder = write_corpus(tmp_path / "data", ["red apples", "green pears", "red cars"])
    busy = tmp_path / "etc"
    busy.mkdir()
    (busy / "passwd").write_text("root:x:0:0\n")
    args = ["serve", "--corpus", str(folder), "--index", str(busy)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "already holds files (passwd)" in err and "--overwrite" in err
    assert sorted(p.name for p in busy.iterdir()) == ["passwd"]
    assert main(["index", "bm25", "--corpus", str(folder), "--out", str(busy)]) == 2
    assert "already holds files (passwd)" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    assert (busy / "bm25.json").is_file() and (busy / "passwd").read_text() == "root:x:0:0\n"


def test_a_stale_index_is_never_advised_to_be_deleted(
    tmp_path: Path, served: list[tuple[Any, str, int]], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_corpus(tmp_path / "data", ["red apples", "green pears", "red cars"])
    index = tmp_path / "idx"
    assert main(["serve", "--corpus", str(folder), "--index", str(index)]) == 0
    (index / "notes.txt").write_text("mine\n")
    write_corpus(tmp_path / "data", ["red apples", "green pears"])
    capsys.readouterr()
    assert main(["serve", "--corpus", str(folder), "--index", str(index)]) == 2
    err = capsys.readouterr().err
    assert "stale BM25 index" in err and "delete" not in err and "--overwrite" in err
    assert main(["serve", "--corpus", str(folder), "--index", str(index), "--overwrite"]) == 0  # rebuilt
    assert (index / "notes.txt").read_text() == "mine\n"
    assert main(["serve", "--corpus", str(folder), "--index", str(index)]) == 0  # and loads
