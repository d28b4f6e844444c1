"""``searchgym benchmark`` on the shared FlashRAG samples: the table, JSON and plot; a killed run resumes
without replaying finished pairs; options that pick retrievers and groups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from searchgym.app.cli import main

from ...conftest import HOTPOT, NQ, QUICKSTART, SHARED_DATA, require

# An agent that plays as the heuristic does, logs every episode it starts, and SIGKILLs its own process at
# the episode named in KILL_AT ("DATASET_SIZE:INDEX"), as a machine that goes down mid-run would.
COUNTING_AGENT = textwrap.dedent(
    """
    import os, signal
    from searchgym.agents.heuristic import HeuristicAgent

    class Counting(HeuristicAgent):
        def __init__(self, env):
            super().__init__(env.unwrapped.tokenizer)
            self.questions = len(env.unwrapped.questions)
            self.episode = -1

        def reset(self, info, seed=None):
            super().reset(info, seed=seed)
            self.episode += 1
            with open(os.environ["PLAYS"], "a") as f:
                f.write(f"{self.questions}:{self.episode}\\n")
            if os.environ.get("KILL_AT") == f"{self.questions}:{self.episode}":
                os.kill(os.getpid(), signal.SIGKILL)
    """
)


def benchmark(
    tmp_path: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "searchgym.app.cli", "benchmark", "--no-progress", *extra],
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_two_agents_on_the_shared_data_write_the_table_json_and_plot(tmp_path: Path) -> None:
    require(HOTPOT), require(NQ), require(QUICKSTART)
    datasets = [str(p) for p in sorted(SHARED_DATA.iterdir())]  # as the shell expands ../shared/data/*
    done = benchmark(
        tmp_path, "--agent", "oracle", "--agent", "heuristic", "--datasets", *datasets, "--episodes", "40",
        "--out", "B",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "README.md is a file, not a FlashRAG folder; left out" in done.stderr
    out = tmp_path / "B"
    report = json.loads((out / "benchmark.json").read_text())
    assert report["agents"] == ["oracle", "heuristic"]
    names = [d["name"] for d in report["datasets"]]
    assert names == ["flashrag_quickstart_nq", "hotpotqa_dev_distractor_1100", "nq_open_oracle_2655"]
    assert [d["group"] for d in report["datasets"]] == ["general", "multi-hop", "general"]
    assert [d["questions"] for d in report["datasets"]] == [17, 40, 40]
    rows = {(r["agent"], r["dataset"]): r for r in report["results"]}
    for name in names:  # the oracle answers from the gold passages; the heuristic answers a passage's word
        assert rows["oracle", name]["em"]["mean"] == 1.0
        assert rows["heuristic", name]["em"]["mean"] < 0.5
        assert rows["heuristic", name]["answered"]["mean"] == 1.0
    paired = {r["dataset"]: r for r in report["paired"]}
    assert set(paired) == {*names, "all"}
    hot = paired["hotpotqa_dev_distractor_1100"]
    right = round(rows["heuristic", "hotpotqa_dev_distractor_1100"]["em"]["mean"] * 40)
    assert (hot["only_agent"], hot["only_baseline"]) == (0, 40 - right)
    assert hot["em_diff"]["high"] < 0 and hot["mcnemar_p"] < 1e-6
    # Why the heuristic fails, by the gold passages where a dataset names them, else by the answer string.
    failures = {(r["agent"], r["dataset"]): r for r in report["failures"]}
    assert failures["oracle", "hotpotqa_dev_distractor_1100"]["correct"] == 40
    missed = failures["heuristic", "hotpotqa_dev_distractor_1100"]
    assert missed["rules"] == {"gold_passages": 40, "answer_string": 0}
    assert set(missed["kinds"]) == {"bridge", "comparison"}  # HotpotQA's own question types
    assert missed["not_retrieved"] + missed["misread"] == 40 - right and missed["no_answer"] == 0
    assert failures["heuristic", "flashrag_quickstart_nq"]["rules"] == {
        "gold_passages": 0,
        "answer_string": 17,
    }
    flips = {r["dataset"]: r for r in report["flips"]}
    assert flips["hotpotqa_dev_distractor_1100"]["gained"] == {
        "no_answer": 0,
        "not_retrieved": 0,
        "misread": 0,
    }
    lost = flips["hotpotqa_dev_distractor_1100"]["lost"]
    assert (lost["not_retrieved"], lost["misread"]) == (missed["not_retrieved"], missed["misread"])
    assert {d["name"]: d["card"]["topk"] for d in report["datasets"]} == dict.fromkeys(names, 3)
    table = (out / "benchmark.md").read_text()
    assert table == done.stdout
    assert "| oracle | 1.000 [0.816, 1.000] |" in table  # Wilson at 17 of 17: n / (n + 1.96²)
    assert (out / "benchmark.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The pairs' episodes are eval --out records, one line per question.
    pair_files = sorted((out / "pairs").glob("*/*.jsonl"))
    assert len(pair_files) == 6
    assert all(len(p.read_text().splitlines()) in (17, 40) for p in pair_files)


@pytest.mark.slow
def test_a_killed_benchmark_resumes_without_replaying_finished_pairs(tmp_path: Path) -> None:
    quick, hot = require(QUICKSTART), require(HOTPOT)
    (tmp_path / "counting.py").write_text(COUNTING_AGENT)
    plays = tmp_path / "plays.txt"
    args = ["--agent", "heuristic", "--agent", "counting:Counting", "--datasets", str(quick), str(hot)]
    args += ["--episodes", "30", "--out", "B"]
    # Killed in the counting agent's second pair (hotpotqa, 30 questions), at its episode 12.
    killed = benchmark(tmp_path, *args, env={"PLAYS": str(plays), "KILL_AT": "1100:12"})
    assert killed.returncode == -9
    first = plays.read_text().splitlines()
    assert first == [f"17:{i}" for i in range(17)] + [f"1100:{i}" for i in range(13)]
    assert not (tmp_path / "B" / "benchmark.json").exists()
    pair_times = {p: p.stat().st_mtime_ns for p in (tmp_path / "B" / "pairs").glob("*/*.jsonl")}
    assert len(pair_times) == 3  # heuristic's two pairs and counting's first: finished; the fourth is partial

    plays.unlink()
    resumed = benchmark(tmp_path, *args, env={"PLAYS": str(plays)})
    assert resumed.returncode == 0, resumed.stderr
    # Only the interrupted pair's remaining episodes were played (its 12 finished ones were kept).
    assert plays.read_text().splitlines() == [f"1100:{i}" for i in range(18)]
    assert all(p.stat().st_mtime_ns == t for p, t in pair_times.items())
    resumed_report = json.loads((tmp_path / "B" / "benchmark.json").read_text())

    # An uninterrupted run in another folder gives the same report.
    whole = benchmark(tmp_path, *args[:-1], "C", env={"PLAYS": str(tmp_path / "plays2.txt")})
    assert whole.returncode == 0, whole.stderr
    assert json.loads((tmp_path / "C" / "benchmark.json").read_text()) == resumed_report
    assert (tmp_path / "B" / "benchmark.md").read_text() == (tmp_path / "C" / "benchmark.md").read_text()


def test_changed_settings_replay_a_cached_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    quick = require(QUICKSTART)
    out = tmp_path / "B"
    base = ["benchmark", "--no-progress", "--agent", "heuristic", "--datasets", str(quick), "--out", str(out)]
    assert main([*base, "--episodes", "5"]) == 0
    pair = next((out / "pairs").glob("*/*.jsonl"))
    before = pair.stat().st_mtime_ns
    capsys.readouterr()
    assert main([*base, "--episodes", "5"]) == 0  # same settings: read back, not played
    assert pair.stat().st_mtime_ns == before
    assert main([*base, "--episodes", "7", "--json"]) == 0
    captured = capsys.readouterr()
    assert "was played with other settings or data; playing it again" in captured.err
    report = json.loads(captured.out.strip().splitlines()[-1])
    assert report["results"][0]["episodes"] == 7
    assert len(pair.read_text().splitlines()) == 7


def test_retrievers_and_groups_per_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    quick, hot = require(QUICKSTART), require(HOTPOT)
    args = [
        "benchmark",
        "--no-progress",
        "--json",
        "--agent",
        "heuristic",
        "--datasets",
        str(quick),
        str(hot),
    ]
    args += ["--episodes", "3", "--retriever", "rank_bm25", "--retriever", f"{hot.name}=bm25"]
    args += ["--group", f"{quick.name}=other"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    by_name = {d["name"]: d for d in report["datasets"]}
    assert by_name[quick.name]["retriever"] == "rank_bm25" and by_name[hot.name]["retriever"] == "bm25"
    assert by_name[quick.name]["group"] == "other"
    assert {r["group"] for r in report["averages"]} == {"multi-hop", "all"}
    sizes = {
        "topk": 3,
        "max_turns": 4,
        "max_turn_tokens": None,
        "max_context_tokens": None,
    }  # None: the env's
    assert report["settings"]["agent_env"] == {"heuristic": sizes}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--agent", "heuristic"], "each agent once"),
        (["--group", "nowhere=general"], "--group nowhere=general"),
        (["--retriever", "nowhere=bm25"], "'nowhere' is not one of the datasets"),
    ],
)
def test_bad_options_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    quick = require(QUICKSTART)
    assert main(["benchmark", "--agent", "heuristic", "--datasets", str(quick), *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_file_alone_is_no_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "README.md").write_text("not data")
    assert main(["benchmark", "--agent", "heuristic", "--datasets", str(tmp_path / "README.md")]) == 2
    assert "--datasets names no folder" in capsys.readouterr().err


def test_a_record_is_gone_while_its_pair_is_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay removes the pair's record before it plays, so a run killed after the new file lands but before
    its record is written leaves no record that would vouch for the wrong episodes."""
    import searchgym.agents as agents

    quick = require(QUICKSTART)
    out = tmp_path / "B"
    base = ["benchmark", "--no-progress", "--agent", "heuristic", "--datasets", str(quick), "--out", str(out)]
    assert main([*base, "--episodes", "2"]) == 0
    record = next((out / "pairs").glob("*/*.jsonl.run.json"))

    def killed(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(agents, "evaluate", killed)
    assert main([*base, "--episodes", "5"]) == 130  # Ctrl-C, as the killed run
    assert not record.exists()
    monkeypatch.undo()
    assert main([*base, "--episodes", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"][0]["episodes"] == 2


def test_a_cached_pair_with_the_wrong_count_or_changed_questions_is_played_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quick = require(QUICKSTART)
    data = tmp_path / "nq_copy"
    data.mkdir()
    for name in ("corpus.jsonl", "test.jsonl"):
        (data / name).write_bytes((quick / name).read_bytes())
    out = tmp_path / "B"
    base = [
        "benchmark",
        "--no-progress",
        "--json",
        "--agent",
        "heuristic",
        "--datasets",
        str(data),
        "--out",
        str(out),
    ]
    assert main([*base, "--episodes", "4"]) == 0
    pair = next((out / "pairs").glob("*/*.jsonl"))
    pair.write_text(
        "".join(pair.read_text().splitlines(keepends=True)[:3])
    )  # a file short of its record's count
    capsys.readouterr()
    assert main([*base, "--episodes", "4"]) == 0
    assert "playing it again" in capsys.readouterr().err and len(pair.read_text().splitlines()) == 4
    lines = (data / "test.jsonl").read_text().splitlines(keepends=True)
    (data / "test.jsonl").write_text(
        "".join([lines[1], lines[0], *lines[2:]])
    )  # the same path, other questions
    record = pair.with_name(pair.name + ".run.json")
    before = json.loads(record.read_text())["data"]["split_sha256"]
    assert main([*base, "--episodes", "4"]) == 0
    assert "playing it again" in capsys.readouterr().err
    assert json.loads(record.read_text())["data"]["split_sha256"] != before


def test_damaged_leftovers_of_a_killed_pair_start_it_again(tmp_path: Path) -> None:
    quick = require(QUICKSTART)
    out = tmp_path / "B"
    args = ["benchmark", "--no-progress", "--agent", "heuristic", "--datasets", str(quick), "--out", str(out)]
    assert main([*args, "--episodes", "3"]) == 0
    pair = next((out / "pairs").glob("*/*.jsonl"))
    record = pair.with_name(pair.name + ".run.json")
    partial = pair.with_name(pair.name + ".partial")
    partial_record = pair.with_name(pair.name + ".partial.run.json")
    partial.write_text("not json\n{}\n")  # a damaged middle line
    partial_record.write_text(record.read_text())
    record.unlink()
    pair.unlink()
    assert main([*args, "--episodes", "3"]) == 0
    assert len(pair.read_text().splitlines()) == 3 and record.is_file() and not partial_record.exists()
    partial.write_text("")
    partial_record.write_text('{"agent": "heur')  # a record cut off mid-write
    pair.unlink()
    assert main([*args, "--episodes", "3"]) == 0


@pytest.mark.parametrize(
    ("retrievers", "agents", "message"),
    [
        (["cassette:c.json.gz;record=bm25"], 1, "a cassette holds one dataset's searches"),
        (["cassette:c.json.gz"], 1, "a cassette holds one dataset's searches"),
        (
            ["{quick}=cassette:q.json.gz;record=bm25", "{hot}=cassette:h.json.gz;record=bm25"],
            2,
            "record-missing",
        ),
    ],
)
def test_a_cassette_serves_one_dataset_and_records_one_agent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], retrievers: list[str], agents: int, message: str
) -> None:
    quick, hot = require(QUICKSTART), require(HOTPOT)
    args = ["benchmark", "--no-progress", "--agent", "heuristic", "--datasets", str(quick), str(hot)]
    args += ["--agent", "random"] if agents == 2 else []
    for spec in retrievers:
        args += ["--retriever", spec.format(quick=quick.name, hot=hot.name)]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_two_agents_fill_one_cassette_per_dataset_with_record_missing(tmp_path: Path) -> None:
    quick = require(QUICKSTART)
    cassette = tmp_path / "q.json.gz"
    args = [
        "benchmark",
        "--no-progress",
        "--agent",
        "heuristic",
        "--agent",
        "random",
        "--datasets",
        str(quick),
    ]
    args += ["--episodes", "4", "--retriever", f"cassette:{cassette};record-missing=bm25"]
    assert main(args) == 0
    assert main([*args[:-1], f"cassette:{cassette}", "--out", str(tmp_path / "replayed")]) == 0  # replay only


@pytest.mark.parametrize("edit", ["em-value", "em-string", "em-missing", "reordered"])
def test_an_edited_cached_pair_is_played_again_not_entered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: str
) -> None:
    """A pair file is checked against the digest written with it: an edited ``em`` (shown as 1.0, 5.0 or NaN
    in the report), a string or a missing field, or reordered episodes replay the pair with a note."""
    quick = require(QUICKSTART)
    out = tmp_path / "B"
    base = ["benchmark", "--no-progress", "--json", "--agent", "heuristic", "--datasets", str(quick)]
    base += ["--out", str(out), "--episodes", "4"]
    assert main(base) == 0
    first = json.loads(capsys.readouterr().out)
    pair = next((out / "pairs").glob("*/*.jsonl"))
    original = pair.read_bytes()
    records = [json.loads(line) for line in original.splitlines()]
    if edit == "em-value":
        records[0]["em"] = 5.0
    elif edit == "em-string":
        records[0]["em"] = "1.0"
    elif edit == "em-missing":
        del records[0]["em"]
    else:
        records[0], records[1] = records[1], records[0]
    pair.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    assert main(base) == 0
    captured = capsys.readouterr()
    assert f"note: {pair} does not match the digest written with it" in captured.err
    assert json.loads(captured.out)["results"] == first["results"]
    assert pair.read_bytes() == original


def test_a_pair_started_over_its_damaged_leftovers_is_cached_with_a_good_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Leftovers the pair cannot continue are dropped before the digests are counted: the finished pair's
    record vouches for exactly its file, so the next run reads it back instead of playing it again."""
    quick = require(QUICKSTART)
    out = tmp_path / "B"
    base = ["benchmark", "--no-progress", "--json", "--agent", "heuristic", "--datasets", str(quick)]
    base += ["--out", str(out), "--episodes", "3"]
    assert main(base) == 0
    pair = next((out / "pairs").glob("*/*.jsonl"))
    partial = pair.with_name(pair.name + ".partial")
    partial.write_text("{damaged leftovers\n")  # no run record beside it: nothing to continue
    pair.unlink()
    capsys.readouterr()
    assert main(base) == 0
    assert main(base) == 0  # read back from the cache
    assert "playing it again" not in capsys.readouterr().err


# A user agent that plays as the heuristic does; its module is edited between runs.
EDITABLE_AGENT = textwrap.dedent(
    """
    from searchgym.agents.heuristic import HeuristicAgent

    class Mine(HeuristicAgent):
        def __init__(self, env):
            super().__init__(env.unwrapped.tokenizer)
    """
)


def test_an_edited_agent_class_or_pair_file_replays_its_pair(tmp_path: Path) -> None:
    """The cache is keyed on what played: a ``module:Class`` agent's source is part of its pair's identity,
    and every pair's line says whether it was read back or played."""
    quick = require(QUICKSTART)
    module = tmp_path / "editable_agent.py"
    module.write_text(EDITABLE_AGENT, encoding="utf-8")
    args = ["--agent", "editable_agent:Mine", "--datasets", str(quick), "--episodes", "3", "--out", "B"]
    first = benchmark(tmp_path, *args)
    assert first.returncode == 0, first.stderr
    assert "pair editable_agent:Mine on flashrag_quickstart_nq: played (3 episodes)" in first.stderr
    record = json.loads(next((tmp_path / "B" / "pairs").glob("*/*.run.json")).read_text())
    assert len(record["agent_sha256"]) == 64  # the source's digest, not null
    again = benchmark(tmp_path, *args)
    assert "pair editable_agent:Mine on flashrag_quickstart_nq: cached (3 episodes)" in again.stderr
    module.write_text(EDITABLE_AGENT + "\n# a changed line\n", encoding="utf-8")
    edited = benchmark(tmp_path, *args)
    assert edited.returncode == 0, edited.stderr
    assert "was played with other settings or data; playing it again" in edited.stderr
    assert "on flashrag_quickstart_nq: played (3 episodes)" in edited.stderr
    pair = next((tmp_path / "B" / "pairs").glob("*/*.jsonl"))
    lines = pair.read_text().splitlines()
    pair.write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n", encoding="utf-8")
    reordered = benchmark(tmp_path, *args)
    assert "does not match the digest written with it" in reordered.stderr
    assert "on flashrag_quickstart_nq: played (3 episodes)" in reordered.stderr


def test_sampled_pairs_are_their_own_cache_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quick = require(QUICKSTART)
    base = [
        "benchmark",
        "--no-progress",
        "--agent",
        "random",
        "--datasets",
        str(quick),
        "--out",
        str(tmp_path),
    ]
    assert main([*base, "--episodes", "2", "--json"]) == 0
    greedy = json.loads(capsys.readouterr().out)
    assert greedy["decoding"] == "greedy" and greedy["results"][0]["episodes"] == 2
    assert main([*base, "--episodes", "2", "--samples", "3", "--json"]) == 0
    captured = capsys.readouterr()
    assert "playing it again" in captured.err and "played (6 episodes)" in captured.err
    sampled = json.loads(captured.out)
    assert sampled["decoding"] == "greedy, K=3" and sampled["results"][0]["episodes"] == 6
    assert len(sampled["results"][0]["successes"]) == 2
    assert main([*base, "--episodes", "2", "--temperature", "1"]) == 2
    assert "does not sample by temperature" in capsys.readouterr().err
