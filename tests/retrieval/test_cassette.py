"""Retrieval cassettes: record a run's searches, replay them bit-identically with no index."""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path

import gymnasium as gym
import pytest

import searchgym  # noqa: F401 - registers the env ids
from searchgym.agents import HeuristicAgent, evaluate
from searchgym.app.cli import main
from searchgym.data import load_dataset
from searchgym.errors import ConfigError, DataFormatError, RetrieverError
from searchgym.retrieval import BM25Retriever, Cassette, CassetteMissError, Hit, Retriever, make_retriever


class Flaky(Retriever):
    """Different results on every call for the same query (an approximate index behind a server)."""

    def __init__(self) -> None:
        self.inner = make_retriever("bm25", load_dataset().passages)
        self.calls = 0

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.calls += 1
        results = self.inner.search(queries, k + 1)
        return [hits[self.calls % 2 : self.calls % 2 + k] for hits in results]


def run_eval(retriever: object, out: Path, episodes: int = 30) -> list[dict[str, object]]:
    env = gym.make("SearchQA-v0", split="test", retriever=retriever)
    agent = HeuristicAgent(env.unwrapped.tokenizer)  # type: ignore[attr-defined]
    evaluate(env, agent, episodes, seed=7, out=out)
    env.close()
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_replay_is_bit_identical_to_the_recorded_run_with_no_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.json.gz"
    cassette = Cassette(Flaky(), path, mode="record")
    recorded = run_eval(cassette, tmp_path / "recorded.jsonl")
    cassette.close()
    assert cassette.inner is not None and cassette.misses == len(cassette) > 0

    # No index may be built in replay: BM25 refuses to exist.
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("an index was built during replay")

    monkeypatch.setattr(BM25Retriever, "__init__", refuse)
    replayed = run_eval(f"cassette:{path}", tmp_path / "replayed.jsonl")
    assert replayed == recorded  # transcripts, retrieved ids, answers, rewards: everything
    assert any(r["searches"] for r in recorded)


def test_repeated_searches_get_their_first_results_while_recording(tmp_path: Path) -> None:
    cassette = Cassette(Flaky(), tmp_path / "c.json.gz", mode="record")
    first = cassette.search(["velmora founder"], 3)
    again = cassette.search(["velmora founder", "velmora founder"], 3)
    assert again == [first[0], first[0]] and cassette.inner.calls == 1  # type: ignore[union-attr]


def test_a_missing_query_is_a_typed_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "c.json.gz"
    recorder = Cassette(make_retriever("bm25", load_dataset().passages), path, mode="record")
    recorder.search(["zorvath founder"], 3)
    recorder.save()
    replay = Cassette(None, path)
    assert [h.passage_id for h in replay.search(["zorvath founder"], 3)[0]]
    with pytest.raises(CassetteMissError, match="'who founded kestrel'") as caught:
        replay.search(["zorvath founder", "who founded kestrel"], 3)
    assert caught.value.query == "who founded kestrel" and caught.value.k == 3
    assert not isinstance(caught.value, RetrieverError)  # "observe" must not hide a diverged replay
    with pytest.raises(CassetteMissError, match=r"k=\[3\]"):
        replay.search(["zorvath founder"], 5)
    # Through an env with on_retrieval_error="observe": still raised.
    env = gym.make("SearchQA-v0", retriever=f"cassette:{path}", on_retrieval_error="observe")
    env.reset(seed=0)
    with pytest.raises(CassetteMissError, match="nowhere"):
        for t in env.unwrapped.tokenizer.encode("<search> nowhere </search>"):  # type: ignore[attr-defined]
            env.step(t)


def test_record_missing_fills_the_gaps_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "c.json.gz"
    passages = load_dataset().passages
    first = Cassette(make_retriever("bm25", passages), path, mode="record")
    kept = first.search(["zorvath founder"], 3)
    first.close()
    spec = f"cassette:{path};record-missing=bm25"
    filling = make_retriever(spec, passages)
    assert isinstance(filling, Cassette) and filling.mode == "record-missing"
    assert filling.search(["zorvath founder"], 3) == kept and filling.misses == 0
    added = filling.search(["kestrel bay city"], 3)
    filling.close()
    replay = make_retriever(f"cassette:{path}", passages)
    assert replay.search(["zorvath founder", "kestrel bay city"], 3) == [kept[0], added[0]]


def test_the_file_is_compact_and_deterministic(tmp_path: Path) -> None:
    passages = load_dataset().passages
    queries = [f"founder {p.title}" for p in passages[:40]]
    sizes = []
    for name in ("a.json.gz", "b.json.gz"):
        cassette = Cassette(make_retriever("bm25", passages), tmp_path / name, mode="record")
        for q in queries:
            cassette.search([q, "shared query"], 3)
        cassette.save()
        sizes.append((tmp_path / name).stat().st_size)
    assert (tmp_path / "a.json.gz").read_bytes() == (tmp_path / "b.json.gz").read_bytes()
    data = json.loads(gzip.decompress((tmp_path / "a.json.gz").read_bytes()))
    assert data["format"] == "searchgym-cassette" and len(data["searches"]) == 41
    shown = {pid for _, _, hits in data["searches"] for pid, _ in hits}
    assert set(data["passages"]) == shown  # each passage once
    text = sum(len(p.contents) for p in passages if p.id in shown)
    assert sizes[0] < text / 2


def test_bad_cassettes_and_specs_fail_clearly(tmp_path: Path) -> None:
    passages = load_dataset().passages
    with pytest.raises(ConfigError, match="does not exist"):
        make_retriever(f"cassette:{tmp_path / 'none.json.gz'}", passages)
    with pytest.raises(ConfigError, match="needs the retriever"):
        Cassette(None, tmp_path / "x.json.gz", mode="record")
    with pytest.raises(ConfigError, match="mode"):
        Cassette(None, tmp_path / "x.json.gz", mode="rewind")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="bad cassette spec"):
        make_retriever(f"cassette:{tmp_path / 'x.json.gz'};replay=bm25", passages)
    (tmp_path / "plain.json.gz").write_bytes(b"not gzip")
    with pytest.raises(DataFormatError, match=r"plain\.json\.gz"):
        Cassette(None, tmp_path / "plain.json.gz")
    (tmp_path / "other.json.gz").write_bytes(gzip.compress(b'{"format": "other"}'))
    with pytest.raises(DataFormatError, match="not a searchgym cassette"):
        Cassette(None, tmp_path / "other.json.gz")


def test_eval_records_a_cassette_that_replays_the_same_transcripts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cassette, recorded, replayed = tmp_path / "c.json.gz", tmp_path / "rec.jsonl", tmp_path / "rep.jsonl"
    base = ["eval", "--agent", "heuristic", "--episodes", "12", "--no-progress", "--json"]
    assert main([*base, "--out", str(recorded), "--record-retrieval", str(cassette)]) == 0
    assert cassette.is_file()
    assert main([*base, "--out", str(replayed), "--retriever", f"cassette:{cassette}"]) == 0
    assert replayed.read_text() == recorded.read_text()
    capsys.readouterr()


def _cassette_text(
    passages: str = '{"7": ["Title", "text", 1]}', searches: str = '[["q", 3, [["7", 1.5]]]]'
) -> str:
    return f'{{"format": "searchgym-cassette", "version": 1, "passages": {passages}, "searches": {searches}}}'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"format": "searchgym-cassette", "version": 1, "passages": ' + "[" * 200_000, "nested too deeply"),
        (_cassette_text(searches='[["q", ' + "9" * 5000 + ', [["7", 1.5]]]]'), "invalid JSON"),
        (_cassette_text(passages='[["7", "Title", "text", 1]]'), "'passages' must be an object"),
        (_cassette_text(passages='{"7": ["Title", "text", {"a": 1}]}'), "contents"),
        (_cassette_text(passages='{"7": ["Title", "text", 5]}'), "contents"),
        (_cassette_text(passages='{"7": ["Title", "\\ud800", 1]}'), "lone UTF-16 surrogate"),
        (_cassette_text(searches='[["q", 3, [["7", NaN]]]]'), "score"),
        (_cassette_text(passages='{"7": [["a", "list"], "text", 1]}'), "title"),
        (_cassette_text(searches='[["q", true, [["7", 1.5]]]]'), "k"),
        (_cassette_text(searches='[["q", 3, [["7", 1.5]]], ["q", 3, [["7", 2.5]]]]'), "twice"),
    ],
    ids=[
        "nesting",
        "integer-bomb",
        "passages-list",
        "contents-dict",
        "contents-int",
        "surrogate",
        "nan-score",
        "list-title",
        "bool-k",
        "repeated-search",
    ],
)
def test_a_malformed_cassette_is_one_typed_error_naming_the_file(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.json.gz"
    path.write_bytes(gzip.compress(text.encode("utf-8")))
    with pytest.raises(DataFormatError, match=message) as caught:
        Cassette(None, path, "replay")
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)


def test_a_well_formed_cassette_file_replays(tmp_path: Path) -> None:
    path = tmp_path / "good.json.gz"
    path.write_bytes(gzip.compress(_cassette_text().encode("utf-8")))
    [[hit]] = Cassette(None, path, "replay").search(["q"], 3)
    assert (hit.passage_id, hit.title, hit.text, hit.score) == ("7", "Title", "text", 1.5)


def test_a_recorded_cassette_edited_afterwards_fails_its_checksum(tmp_path: Path) -> None:
    """A cassette carries the SHA-256 of its content: a score, title or text edited after the recording (and
    compressed again, so gzip's own CRC holds) is refused instead of replayed."""
    path = tmp_path / "c.json.gz"
    recorder = Cassette(make_retriever("bm25", load_dataset().passages), path, "record")
    recorder.search(["city founded"], 3)
    recorder.save()
    data = json.loads(gzip.decompress(path.read_bytes()))
    assert len(data["sha256"]) == 64
    Cassette(None, path, "replay").search(["city founded"], 3)  # as recorded: it replays
    data["searches"][0][2][0][1] += 1.0  # the first hit's score
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    with pytest.raises(DataFormatError, match="fails its checksum"):
        Cassette(None, path, "replay")
