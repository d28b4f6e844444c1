"""``searchgym data get`` against a local HTTP server that lays files out as Hugging Face does: small files
with their git blob SHA-1 as ``ETag``, large ones behind a redirect that publishes their SHA-256 as
``X-Linked-Etag`` — serving small fixture files, dropping connections and publishing wrong hashes on demand."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from searchgym.app.cli import main
from searchgym.data import load_dataset
from searchgym.data.download import CORPUS_REPO, FLASHRAG_REPO, INDEX_REPO, RECORD, catalog, fetch_file, get
from searchgym.errors import ConfigError, DataFormatError, DownloadError

CORPUS_LINES = [
    {"id": "0", "contents": '"Alpha"\nAlpha is the first letter of the Greek alphabet.'},
    {"id": "1", "contents": '"Beta"\nBeta is the second letter of the Greek alphabet.'},
    {"id": "2", "contents": '"Gamma"\nGamma is the third letter.'},
]
QUESTIONS = [
    {"id": f"test_{i}", "question": q, "golden_answers": [a], "metadata": {}}
    for i, (q, a) in enumerate([("Which letter is first?", "Alpha"), ("Which letter is second?", "Beta")])
]


def jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


@dataclass
class Host:
    """What the fixture server serves and how it misbehaves."""

    files: dict[str, bytes]  # repository path ("REPO/PATH") -> content
    lfs: set[str] = field(default_factory=set)  # served through a redirect that publishes the SHA-256
    drop_once: set[str] = field(default_factory=set)  # the first GET sends half of the body, then hangs up
    wrong_hash: set[str] = field(default_factory=set)  # a published hash that does not match
    no_hash: set[str] = field(default_factory=set)  # served with no hash at all, as a plain mirror serves
    ignore_range: bool = False
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)
    url: str = ""


def handler_for(host: Host) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            prefix = "/datasets/"
            if self.path.startswith("/storage/"):
                return self.send_body(self.path.removeprefix("/storage/"))
            if not self.path.startswith(prefix) or "/resolve/main/" not in self.path:
                return self.send_error(404)
            repo, _, path = self.path.removeprefix(prefix).partition("/resolve/main/")
            key = f"{repo}/{path}"
            if key not in host.files:
                return self.send_error(404)
            if (
                key in host.lfs and key not in host.no_hash
            ):  # as Hugging Face: a redirect that names the content's SHA-256 and size
                data = host.files[key]
                digest = hashlib.sha256(data + (b"x" if key in host.wrong_hash else b"")).hexdigest()
                self.send_response(302)
                self.send_header("Location", f"{host.url}/storage/{key}")
                self.send_header("X-Linked-Etag", f'"{digest}"')
                self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            return self.send_body(key, etag=True)

        def send_body(self, key: str, etag: bool = False) -> None:
            data = host.files[key]
            requested = self.headers.get("Range")
            host.requests.append((key, requested))
            start = 0
            if requested and not host.ignore_range:
                start = int(requested.removeprefix("bytes=").rstrip("-"))
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            if etag and key not in host.no_hash:
                published = git_sha1(data + (b"x" if key in host.wrong_hash else b""))
                self.send_header("ETag", f'"{published}"')
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if key in host.drop_once:
                host.drop_once.discard(key)
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)  # hang up mid-body
                return
            self.wfile.write(body)

    return Handler


@contextlib.contextmanager
def serving(host: Host) -> Iterator[Host]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(host))
    host.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield host
    finally:
        server.shutdown()
        server.server_close()


def fixture_files() -> dict[str, bytes]:
    corpus = jsonl(CORPUS_LINES)
    return {
        f"{FLASHRAG_REPO}/nq/test.jsonl": jsonl(QUESTIONS),
        f"{FLASHRAG_REPO}/nq/dev.jsonl": jsonl(QUESTIONS[:1]),
        f"{FLASHRAG_REPO}/nq/train.jsonl": jsonl(QUESTIONS[1:]),
        f"{FLASHRAG_REPO}/bamboogle/test.jsonl": jsonl(QUESTIONS),
        f"{CORPUS_REPO}/wiki-18.jsonl.gz": gzip.compress(corpus, mtime=0),
        f"{INDEX_REPO}/part_aa": b"index-part-one;" * 50,
        f"{INDEX_REPO}/part_ab": b"index-part-two;" * 50,
    }


@pytest.fixture
def host() -> Iterator[Host]:
    files = fixture_files()
    lfs = {k for k in files if not k.endswith(".jsonl")} | {f"{FLASHRAG_REPO}/nq/train.jsonl"}
    with serving(Host(files, lfs=lfs)) as running:
        yield running


def fetch(host: Host, names: list[str], out: Path, **options: object) -> dict:
    return get(names, out, base_url=host.url, retry_wait=0, timeout=10, progress=False, **options)  # type: ignore[arg-type]


def test_fetches_flashrag_folders_that_the_loaders_and_eval_read(
    host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = fetch(host, ["nq", "bamboogle", "wiki-18"], tmp_path / "data")
    out = tmp_path / "data"
    assert summary["folders"] == ["nq", "bamboogle"] and summary["no_corpus"] == []
    assert sorted(p.name for p in (out / "nq").iterdir()) == [
        "corpus.jsonl",
        "dev.jsonl",
        "test.jsonl",
        "train.jsonl",
    ]
    assert (out / "nq/corpus.jsonl").is_symlink() and not (out / "wiki-18/wiki-18.jsonl.gz").exists()
    assert (out / "wiki-18/corpus.jsonl").read_bytes() == jsonl(CORPUS_LINES)
    dataset = load_dataset(out / "nq")
    assert [q.id for q in dataset.questions("test")] == ["test_0", "test_1"]
    assert [p.title for p in dataset.passages] == ["Alpha", "Beta", "Gamma"]
    # Every file was checked against the hash the host published: git SHA-1 or SHA-256.
    record = json.loads((out / RECORD).read_text())
    assert record["nq/test.jsonl"]["checked"] == "git-sha1"
    assert record["nq/train.jsonl"]["checked"] == record["wiki-18/wiki-18.jsonl.gz"]["checked"] == "sha256"
    assert not list(out.rglob("*.partial"))
    # What eval, benchmark and training read: the folder, as written.
    assert (
        main(
            [
                "eval",
                "--agent",
                "oracle",
                "--dataset",
                str(out / "nq"),
                "--split",
                "test",
                "--json",
                "--no-progress",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["em"] == 1.0


def test_a_second_run_fetches_nothing_and_a_later_corpus_is_linked(host: Host, tmp_path: Path) -> None:
    out = tmp_path / "data"
    first = fetch(host, ["nq"], out)
    assert first["no_corpus"] == ["nq"] and len(first["fetched"]) == 3
    served = len(host.requests)
    again = fetch(host, ["nq"], out)
    assert again["fetched"] == [] and sorted(again["kept"]) == [
        "nq/dev.jsonl",
        "nq/test.jsonl",
        "nq/train.jsonl",
    ]
    assert len(host.requests) == served
    fetch(host, ["wiki-18"], out)
    assert load_dataset(out / "nq").passages[0].title == "Alpha"


def test_a_dropped_connection_is_resumed_with_a_range_request(host: Host, tmp_path: Path) -> None:
    key = f"{CORPUS_REPO}/wiki-18.jsonl.gz"
    host.drop_once.add(key)
    notes: list[str] = []
    target = tmp_path / "corpus.gz"
    url = f"{host.url}/datasets/{CORPUS_REPO}/resolve/main/wiki-18.jsonl.gz"
    done = fetch_file(url, target, retry_wait=0, progress=False, note=notes.append)
    assert target.read_bytes() == host.files[key] and done["checked"] == "sha256"
    ranges = [r for k, r in host.requests if k == key]
    assert ranges[0] is None and ranges[1] == f"bytes={len(host.files[key]) // 2}-"
    assert len(notes) == 1 and "resuming" in notes[0]


def test_a_killed_run_is_continued_where_it_stopped(host: Host, tmp_path: Path) -> None:
    key = f"{FLASHRAG_REPO}/nq/test.jsonl"
    out = tmp_path / "data"
    (out / "nq").mkdir(parents=True)
    (out / "nq/test.jsonl.partial").write_bytes(host.files[key][:10])  # what a killed run left
    fetch(host, ["nq"], out)
    assert (out / "nq/test.jsonl").read_bytes() == host.files[key]
    assert (key, "bytes=10-") in host.requests


def test_a_host_that_ignores_range_sends_the_whole_file_again(host: Host, tmp_path: Path) -> None:
    key = f"{FLASHRAG_REPO}/nq/test.jsonl"
    host.ignore_range = True
    target = tmp_path / "test.jsonl"
    target.with_name("test.jsonl.partial").write_bytes(b"garbage that is not the start of the file")
    fetch_file(f"{host.url}/datasets/{key.replace('/nq/', '/resolve/main/nq/')}", target, progress=False)
    assert target.read_bytes() == host.files[key]


@pytest.mark.parametrize("name", ["nq/test.jsonl", "nq/train.jsonl"])  # git SHA-1, then SHA-256
def test_a_bad_checksum_is_refused_and_the_download_deleted(
    host: Host, tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    host.wrong_hash.add(f"{FLASHRAG_REPO}/{name}")
    out = tmp_path / "data"
    code = main(
        ["data", "get", "nq", "--out", str(out), "--base-url", host.url, "--retry-wait", "0", "--no-progress"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "refused" in err[0] and "where the host published" in err[0]
    assert not (out / name).exists() and not (out / f"{name}.partial").exists()


def test_errors_are_one_line(host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"did you mean 'hotpotqa'"):
        fetch(host, ["hotpot"], tmp_path)
    with pytest.raises(ConfigError, match="name what to fetch"):
        fetch(host, [], tmp_path)
    with pytest.raises(DownloadError, match="HTTP 404"):  # the fixture host has no popqa
        fetch(host, ["popqa"], tmp_path)
    # A host that never answers fails at once (no retries, no waiting).
    with pytest.raises(DownloadError, match="cannot reach the host"):
        get(["nq"], tmp_path, base_url="http://127.0.0.1:9", retries=5, retry_wait=30, progress=False)
    assert main(["data", "get", "nq"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "searchgym: error: --out is required: the folder to write (e.g. --out data)"
    )


def test_a_failed_fetch_leaves_no_empty_partial_file(host: Host, tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match="HTTP 404"):  # the fixture host has no popqa
        fetch(host, ["popqa"], tmp_path)
    with pytest.raises(DownloadError, match="cannot reach the host"):
        get(["nq"], tmp_path, base_url="http://127.0.0.1:9", retries=0, progress=False)
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("*.partial")] == []
    # What a dropped connection wrote is kept, for the next run to continue.
    key = f"{CORPUS_REPO}/wiki-18.jsonl.gz"
    host.drop_once.add(key)
    url = f"{host.url}/datasets/{CORPUS_REPO}/resolve/main/wiki-18.jsonl.gz"
    with pytest.raises(DownloadError, match="retries spent"):
        fetch_file(url, tmp_path / "corpus.gz", retries=0, progress=False)
    assert (tmp_path / "corpus.gz.partial").stat().st_size > 0


def test_retries_run_out_with_what_was_kept(host: Host, tmp_path: Path) -> None:
    key = f"{CORPUS_REPO}/wiki-18.jsonl.gz"
    target = tmp_path / "corpus.gz"
    url = f"{host.url}/datasets/{CORPUS_REPO}/resolve/main/wiki-18.jsonl.gz"
    host.drop_once.add(key)
    with pytest.raises(DownloadError, match=r"0 retries spent; \d+ bytes kept in .*corpus.gz.partial"):
        fetch_file(url, target, retries=0, progress=False)
    fetch_file(url, target, progress=False)  # the same command again continues
    assert target.read_bytes() == host.files[key]


def test_the_e5_index_is_assembled_from_its_parts(host: Host, tmp_path: Path) -> None:
    fetch(host, ["wiki-18-e5"], tmp_path)
    index = tmp_path / "wiki-18/e5_Flat.index"
    assert index.read_bytes() == host.files[f"{INDEX_REPO}/part_aa"] + host.files[f"{INDEX_REPO}/part_ab"]
    assert not (tmp_path / "wiki-18/part_aa").exists()


def test_the_catalog_names_public_locations() -> None:
    names = catalog()
    assert {"nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"} <= set(names)
    url = names["nq"][2].url("https://huggingface.co", "main")
    assert url == "https://huggingface.co/datasets/RUC-NLPIR/FlashRAG_datasets/resolve/main/nq/test.jsonl"
    assert (
        names["wiki-18"][0]
        .url("https://hf-mirror.com/", "v1")
        .endswith("wiki-18-corpus/resolve/v1/wiki-18.jsonl.gz")
    )


def test_a_malformed_download_does_not_pass_for_data(host: Host, tmp_path: Path) -> None:
    host.files[f"{CORPUS_REPO}/wiki-18.jsonl.gz"] = b"not gzip at all"
    with pytest.raises(DataFormatError, match="cannot decompress"):
        fetch(host, ["wiki-18"], tmp_path)
    assert not (tmp_path / "wiki-18/corpus.jsonl").exists()


def _no_file_under(folder: Path) -> bool:
    return not any(p.is_file() for p in folder.rglob("*")) if folder.exists() else True


def test_a_file_from_a_mirror_that_publishes_no_hash_is_refused_unless_accepted(
    host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host.no_hash.update(k for k in host.files if "/nq/" in k)
    out = tmp_path / "data"
    argv = [
        "data",
        "get",
        "nq",
        "--out",
        str(out),
        "--base-url",
        host.url,
        "--retry-wait",
        "0",
        "--no-progress",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert (
        "publishes no hash for this file and searchgym pins none" in err[0]
        and "--accept-unverified" in err[0]
    )
    assert _no_file_under(out)  # refused before the body was read: nothing written, no partial file
    assert main([*argv, "--accept-unverified"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("taken unverified (--accept-unverified): sha256 ") == 3
    record = json.loads((out / RECORD).read_text())
    assert {record[f"nq/{s}.jsonl"]["checked"] for s in ("train", "dev", "test")} == {None}
    assert (out / "nq/test.jsonl").read_bytes() == host.files[f"{FLASHRAG_REPO}/nq/test.jsonl"]


def test_a_pinned_digest_decides_whatever_the_mirror_publishes(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from searchgym.data import download

    key = f"{FLASHRAG_REPO}/bamboogle/test.jsonl"
    real = host.files[key]
    monkeypatch.setattr(download, "PINNED_SHA256", {key: hashlib.sha256(real).hexdigest()})
    # A mirror serving another file under that name, with a hash of its own that matches what it serves.
    host.files[key] = real.replace(b"Alpha", b"Omega")
    out = tmp_path / "data"
    argv = ["data", "get", "bamboogle", "--out", str(out), "--base-url", host.url, "--retry-wait", "0",
            "--no-progress", "--accept-unverified"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "where searchgym pins " + hashlib.sha256(real).hexdigest() in err[0], err
    assert _no_file_under(out)  # the download was deleted
    # The true file, from a mirror that publishes no hash at all: the pin verifies it.
    host.files[key] = real
    host.no_hash.add(key)
    assert main(argv[:-1]) == 0
    record = json.loads((out / RECORD).read_text())
    assert record["bamboogle/test.jsonl"]["checked"] == "pinned"
    assert (out / "bamboogle/test.jsonl").read_bytes() == real
