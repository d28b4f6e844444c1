"""Every file read without trust is bounded in bytes, not only in rows: a JSONL line, a JSONL file, a cassette's
inflated size and a parquet file's decoded size each end in one typed error naming the file and the limit, and
every env size option has an upper bound."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import gymnasium as gym
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import searchgym  # noqa: F401 - registers the env ids
from searchgym.data.flashrag import read_corpus
from searchgym.data.limits import MAX_FILE_MB, MAX_LINE_MB, read_limits
from searchgym.data.searchr1 import read_searchr1
from searchgym.errors import ConfigError, DataFormatError
from searchgym.retrieval import Cassette

MB = 1 << 20


def corpus_line(i: int, text: str) -> str:
    return json.dumps({"id": str(i), "contents": f'"T{i}"\n{text}'}) + "\n"


def test_the_default_limits_are_the_documented_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEARCHGYM_MAX_LINE_MB", raising=False)
    monkeypatch.delenv("SEARCHGYM_MAX_FILE_MB", raising=False)
    limits = read_limits()
    assert (MAX_LINE_MB, MAX_FILE_MB) == (16, 512)
    assert (limits.line_bytes, limits.file_bytes) == (16 * MB, 512 * MB)
    monkeypatch.setenv("SEARCHGYM_MAX_FILE_MB", "2048")
    assert read_limits().file_bytes == 2048 * MB
    for bad in ("0", "-3", "abc", "1e400"):
        monkeypatch.setenv("SEARCHGYM_MAX_FILE_MB", bad)
        with pytest.raises(ConfigError, match="SEARCHGYM_MAX_FILE_MB"):
            read_limits()


def test_a_jsonl_line_over_the_line_limit_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    with path.open("w") as f:
        f.write(corpus_line(0, "fine"))
        f.write(corpus_line(1, "x" * (48 * MB)))  # three times the default 16 MiB
    tracemalloc.start()
    try:
        with pytest.raises(DataFormatError) as caught:
            read_corpus(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert f"{path}:2:" in message and "16 MiB" in message and "SEARCHGYM_MAX_LINE_MB" in message
    assert "\n" not in message
    # At most the limit and its copy, however long the line (reading it whole held three times its size).
    assert peak < 40 * MB, f"the reader held {peak / MB:.0f} MiB for a line it refuses"


def test_a_jsonl_file_over_the_file_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(corpus_line(i, "y" * 1000) for i in range(3000)))  # ~3 MB of short lines
    monkeypatch.setenv("SEARCHGYM_MAX_FILE_MB", "1")
    with pytest.raises(DataFormatError, match=r"corpus\.jsonl.*more than 1 MiB.*SEARCHGYM_MAX_FILE_MB"):
        read_corpus(path)
    monkeypatch.setenv("SEARCHGYM_MAX_FILE_MB", "8")  # raised for a real corpus: it loads
    assert len(read_corpus(path)) == 3000


def write_cassette(path: Path, data: object) -> None:
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
        json.dump(data, f)


def test_a_cassette_that_inflates_past_the_file_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "bomb.json.gz"
    big = "z" * (40 * MB)  # 40 MiB of one letter: a few KB gzipped
    write_cassette(
        path,
        {"format": "searchgym-cassette", "version": 1, "passages": {"0": [big, "t", 1]}, "searches": []},
    )
    assert path.stat().st_size < 200_000
    monkeypatch.setenv("SEARCHGYM_MAX_FILE_MB", "4")
    tracemalloc.start()
    try:
        with pytest.raises(DataFormatError) as caught:
            Cassette(None, path, "replay")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "bomb.json.gz" in str(caught.value) and "SEARCHGYM_MAX_FILE_MB" in str(caught.value)
    assert peak < 12 * MB, f"inflating a refused cassette held {peak / MB:.0f} MiB"


SEARCHR1_ROW = {
    "data_source": "nq",
    "reward_model": {"style": "rule", "ground_truth": {"target": ["x"]}},
}


def test_a_parquet_of_repeated_long_strings_is_refused_before_it_is_materialised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One 3 MiB string, dictionary-encoded, repeated in 12 rows: a small file whose rows decode to 36 MiB."""
    big = "Question: " + "w" * (3 * MB)
    rows = [
        {**SEARCHR1_ROW, "prompt": [{"role": "user", "content": big}], "extra_info": {"index": i}}
        for i in range(12)
    ]
    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, compression="zstd")
    assert path.stat().st_size < 50_000
    monkeypatch.setenv("SEARCHGYM_MAX_FILE_MB", "16")
    with pytest.raises(DataFormatError, match=r"bomb\.parquet.*more than 16 MiB.*SEARCHGYM_MAX_FILE_MB"):
        read_searchr1(path)
    monkeypatch.setenv("SEARCHGYM_MAX_FILE_MB", "64")
    assert len(read_searchr1(path)) == 12


PARQUET_PEAK = """
import os, sys
import pyarrow, pyarrow.compute, pyarrow.parquet  # imported before the baseline: the read's own memory counts
from searchgym.data.searchr1 import read_searchr1
from searchgym.errors import DataFormatError

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

path, limit_mb = sys.argv[1], int(sys.argv[2])
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from the memory held now
before = status("VmRSS")
os.environ["SEARCHGYM_MAX_FILE_MB"] = str(limit_mb)
questions = read_searchr1(path)
peak = status("VmHWM")
os.environ["SEARCHGYM_MAX_FILE_MB"] = str(limit_mb - 2)
try:
    read_searchr1(path)
    refused = ""
except DataFormatError as e:
    refused = str(e)
print(len(questions), peak - before, refused)
"""


def write_just_under(path: Path, kind: str, limit_mb: int) -> None:
    """12 rows that decode to 97% of ``limit_mb``: one value repeated (dictionary-encoded), or 12 distinct ones."""
    size = int(limit_mb * MB * 0.97) // 12
    contents = [("Question: " if kind == "repeated" else f"Question: {i} ") + "w" * size for i in range(12)]
    rows = [
        {**SEARCHR1_ROW, "prompt": [{"role": "user", "content": c}], "extra_info": {"index": i}}
        for i, c in enumerate(contents)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path, compression="zstd")


def parquet_peak(path: Path, limit_mb: int) -> tuple[int, int, str]:
    """Reads ``path`` in a child process under ``limit_mb``: rows, peak bytes over what the child held before
    the read (its interpreter and imports, pyarrow's included), and the refusal under 2 MiB less."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", PARQUET_PEAK, str(path), str(limit_mb)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows, peak, refused = done.stdout.strip().split(" ", 2)
    return int(rows), int(peak), refused


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["repeated", "distinct"])
def test_a_parquet_just_under_the_limit_peaks_within_the_documented_factor(tmp_path: Path, kind: str) -> None:
    """A few-KB file whose 12 rows decode to just under a 16 MiB limit: its peak memory over what the reading
    process held before is within the factor docs/security.md states (at most about 8x the limit), and
    2 MiB less limit refuses it with one line."""
    path = tmp_path / f"{kind}.parquet"
    write_just_under(path, kind, 16)
    assert path.stat().st_size < 20_000
    rows, peak, refused = parquet_peak(path, 16)
    assert rows == 12
    assert peak < 9 * 16 * MB, f"{peak / MB:.0f} MiB for a 16 MiB limit"
    assert "more than 14 MiB" in refused and "SEARCHGYM_MAX_FILE_MB" in refused and "\n" not in refused


def test_a_parquet_whose_footer_declares_more_than_the_limit_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [
        {
            **SEARCHR1_ROW,
            "prompt": [{"role": "user", "content": f"Question: {i} " + "v" * MB}],
            "extra_info": {"index": i},
        }
        for i in range(6)
    ]
    path = tmp_path / "wide.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, compression="zstd")
    monkeypatch.setenv("SEARCHGYM_MAX_FILE_MB", "4")
    with pytest.raises(DataFormatError, match=r"wide\.parquet.*more than 4 MiB.*SEARCHGYM_MAX_FILE_MB"):
        read_searchr1(path)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_context_tokens", 2**62),
        ("max_turn_tokens", 2**40),
        ("max_obs_tokens", 2**40),
        ("max_passage_words", 2**40),
        ("topk", 10**9),
        ("max_turns", 10**9),
    ],
)
def test_every_env_size_option_has_an_upper_bound(option: str, value: int) -> None:
    with pytest.raises(ConfigError, match=rf"{option} must be .*<= \d"):
        gym.make("SearchQA-v0", **{option: value})


def test_the_macro_and_vector_sizes_are_bounded_too() -> None:
    with pytest.raises(ConfigError, match=r"n_queries and n_answers must be .*<= \d"):
        gym.make("SearchQAMacro-v0", n_queries=2**40)
    with pytest.raises(ConfigError, match=r"num_envs .*<= \d"):
        gym.make_vec("SearchQA-v0", num_envs=2**40)
    with pytest.raises(ConfigError, match=r"num_envs x max_context_tokens must be <= "):
        gym.make_vec("SearchQA-v0", num_envs=4096, max_context_tokens=1 << 20)
