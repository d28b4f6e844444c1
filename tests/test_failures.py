"""Why answers fail: scripted agents with known failure modes land at their stage, with exact counts, overall
and per question kind; the flip table between two of them; the answer-string rule where no gold is named."""

from __future__ import annotations

from collections import Counter
from typing import Any

import gymnasium as gym
import pytest

import searchgym  # noqa: F401 - registers the env ids
from searchgym.agents import OracleAgent, evaluate
from searchgym.agents.scripted import ShortcutAgent, oracle_turns
from searchgym.app.benchmark import build_report, markdown_report
from searchgym.failures import answer_in_text, decompose, episode_stage, flip_table, tool_text

N = 40
WRONG = "Nobody At All"


class Guesser(OracleAgent):
    """Answers at once, without searching, a name that is never right: the evidence is never retrieved."""

    def reset(self, info: dict[str, Any], seed: int | None = None) -> None:
        self._turns, self._pos = [self.tokenizer.encode(f"<answer> {WRONG} </answer>")], 0


class Misreader(OracleAgent):
    """Makes the oracle's searches (every gold passage retrieved), then answers a wrong name."""

    def reset(self, info: dict[str, Any], seed: int | None = None) -> None:
        turns = oracle_turns(
            self.dataset, info["question_id"], self.split, self.max_turns, self.retriever, self.topk
        )
        turns[-1] = f"<answer> {WRONG} </answer>"
        self._turns, self._pos = [self.tokenizer.encode(t) for t in turns], 0


class Mute(OracleAgent):
    """Never writes a tag, so every turn is invalid and the turn budget ends the episode unanswered."""

    def reset(self, info: dict[str, Any], seed: int | None = None) -> None:
        self._turns, self._pos = [], 0


@pytest.fixture(scope="module")
def played() -> dict[str, Any]:
    """Each agent's records on the first N questions of the generated world's test split, and their kinds."""
    env = gym.make("SearchQA-v0", split="test")
    records = {}
    for cls in (OracleAgent, Guesser, Misreader, Mute, ShortcutAgent):
        summary = evaluate(env, cls.from_env(env), N)
        records[cls.__name__] = ([r.to_json() for r in summary.records], summary.failures)
    questions = env.unwrapped.questions[:N]
    env.close()
    return {
        "records": records,
        "kinds": [q.kind for q in questions],
        "support": [q.supporting_ids for q in questions],
    }


def counts(correct: int = 0, no_answer: int = 0, not_retrieved: int = 0, misread: int = 0) -> dict[str, int]:
    total = correct + no_answer + not_retrieved + misread
    return {
        "episodes": total,
        "correct": correct,
        "no_answer": no_answer,
        "not_retrieved": not_retrieved,
        "misread": misread,
    }


def lucky_bridges(played: dict[str, Any]) -> int:
    """The bridge questions whose one search by the shortcut happened to retrieve both gold passages too."""
    records = played["records"]["ShortcutAgent"][0]
    return sum(
        kind == "bridge" and set(support) <= {i for ids in r["retrieved_ids"] for i in ids}
        for kind, support, r in zip(played["kinds"], played["support"], records, strict=True)
    )


def test_each_scripted_failure_lands_at_its_stage(played: dict[str, Any]) -> None:
    kinds = Counter(played["kinds"])
    assert set(kinds) == {"attribute", "bridge", "comparison"}  # every kind of the world is in the sample
    lucky = lucky_bridges(played)
    assert 0 < lucky < kinds["bridge"]  # both cases occur in the sample
    expected = {
        "OracleAgent": counts(correct=N),
        "Guesser": counts(not_retrieved=N),
        "Misreader": counts(misread=N),
        "Mute": counts(no_answer=N),
        # The shortcut answers a bridge question after its first hop, wrongly: the second gold passage is
        # never seen, unless that one search happened to return it too (then the answer is a misreading).
        "ShortcutAgent": counts(
            correct=N - kinds["bridge"], not_retrieved=kinds["bridge"] - lucky, misread=lucky
        ),
    }
    for name, want in expected.items():
        records, failures = played["records"][name]
        assert {k: failures[k] for k in want} == want, name
        assert failures["rules"] == {"gold_passages": N, "answer_string": 0}
        assert failures == decompose(records)  # eval's summary and the benchmark's records agree


def test_the_kinds_split_the_counts(played: dict[str, Any]) -> None:
    kinds = Counter(played["kinds"])
    by_kind = played["records"]["ShortcutAgent"][1]["kinds"]
    assert list(by_kind) == list(dict.fromkeys(played["kinds"]))  # in order of first appearance
    lucky = lucky_bridges(played)
    assert by_kind["bridge"] == counts(not_retrieved=kinds["bridge"] - lucky, misread=lucky)
    assert by_kind["attribute"] == counts(correct=kinds["attribute"])
    assert by_kind["comparison"] == counts(correct=kinds["comparison"])
    assert played["records"]["Mute"][1]["kinds"]["comparison"] == counts(no_answer=kinds["comparison"])


def test_the_flip_table_counts_questions_gained_and_lost_by_stage(played: dict[str, Any]) -> None:
    records = {name: r for name, (r, _) in played["records"].items()}
    bridges = Counter(played["kinds"])["bridge"]
    lucky = lucky_bridges(played)
    gained = flip_table(records["ShortcutAgent"], records["OracleAgent"])
    assert gained["gained"] == {"no_answer": 0, "not_retrieved": bridges - lucky, "misread": lucky}
    assert gained["lost"] == {"no_answer": 0, "not_retrieved": 0, "misread": 0}
    lost = flip_table(records["OracleAgent"], records["Misreader"])
    assert lost["gained"] == {"no_answer": 0, "not_retrieved": 0, "misread": 0}
    assert lost["lost"] == {"no_answer": 0, "not_retrieved": 0, "misread": N}
    moved = flip_table(records["Guesser"], records["Mute"])["transitions"]
    assert moved["not_retrieved"]["no_answer"] == N
    assert sum(n for row in moved.values() for n in row.values()) == N
    with pytest.raises(ValueError, match="same questions"):
        flip_table(records["Guesser"], records["Mute"][1:])


def test_the_benchmark_report_carries_the_stages_and_the_flip_table(played: dict[str, Any]) -> None:
    records = {name: r for name, (r, _) in played["records"].items()}
    episodes = {a: {"world": records[a]} for a in ("ShortcutAgent", "OracleAgent", "Misreader")}
    report = build_report(episodes, [{"name": "world", "group": "other"}], resamples=200)
    failures = {r["agent"]: r for r in report["failures"]}
    assert failures["Misreader"]["misread"] == N and failures["OracleAgent"]["correct"] == N
    flips = {r["agent"]: r for r in report["flips"]}
    assert set(flips) == {"OracleAgent", "Misreader"}
    bridges, lucky = Counter(played["kinds"])["bridge"], lucky_bridges(played)
    assert flips["OracleAgent"]["gained"]["not_retrieved"] == bridges - lucky
    # The misreader retrieves everything and answers nothing right: it gains none and loses every question
    # the shortcut got right, now at the reading stage.
    assert flips["Misreader"]["lost"] == {"no_answer": 0, "not_retrieved": 0, "misread": N - bridges}
    table = markdown_report(report)
    assert "## Why answers fail, greedy" in table and "## Flips against ShortcutAgent" in table
    assert f"| world | ShortcutAgent | {N} | {N - bridges} (" in table
    assert f"| world | OracleAgent | gold not retrieved | {bridges - lucky} | 0 |" in table
    assert f"| world | OracleAgent | retrieved, misread | {lucky} | 0 |" in table
    assert f"| world | Misreader | retrieved, misread | 0 | {N - bridges} |" in table
    assert f"| world | ShortcutAgent | bridge | {bridges} | 0 (0%) | 0 (0%) | {bridges - lucky} (" in table


def transcript(tool: str, policy: str = "<answer> x </answer>") -> str:
    return f"[prompt]Question: Who?[/prompt][policy]<search> q </search>[/policy][tool]{tool}[/tool][policy]{policy}[/policy]"


@pytest.mark.parametrize(
    ("golden", "tool", "policy", "stage"),
    [
        (["Ann Vale"], "<information>Doc 1(Title: X) ann vale was born</information>", "<answer> Bo </answer>", "misread"),
        (["Ann Vale"], "<information>Doc 1(Title: X) Vale, Ann</information>", "<answer> Bo </answer>", "not_retrieved"),
        (["no"], "<information>Doc 1(Title: X) not now</information>", "<answer> yes </answer>", "not_retrieved"),
        # The policy's own words are no retrieved text.
        (["Ann Vale"], "<information>Doc 1(Title: X) Bo</information>", "Ann Vale <answer> Bo </answer>", "not_retrieved"),
        (["1961", "Ann"], "<information>Doc 1(Title: The Ann) born 1961.</information>", "<answer> 1960 </answer>", "misread"),
    ],
)  # fmt: skip
def test_without_gold_passages_retrieval_is_the_answer_in_the_tool_text(
    golden: list[str], tool: str, policy: str, stage: str
) -> None:
    record = {"em": 0.0, "answer": "wrong", "golden_answers": golden, "gold_retrieved": None,
              "gold_all_retrieved": None, "transcript": transcript(tool, policy)}  # fmt: skip
    assert episode_stage(record) == stage
    assert decompose([record])["rules"] == {"gold_passages": 0, "answer_string": 1}


def test_gold_passages_decide_over_the_answer_string() -> None:
    seen = transcript("<information>Doc 1(Title: X) Ann Vale</information>")
    partly = {"em": 0.0, "answer": "Bo", "golden_answers": ["Ann Vale"], "gold_retrieved": True,
              "gold_all_retrieved": False, "transcript": seen}  # fmt: skip
    assert episode_stage(partly) == "not_retrieved"  # a multi-hop question needs every gold passage
    assert episode_stage({**partly, "gold_all_retrieved": True, "transcript": ""}) == "misread"
    assert episode_stage({**partly, "em": 1.0}) == "correct"
    assert episode_stage({**partly, "answer": None}) == "no_answer"


def test_tool_text_and_whole_word_matches() -> None:
    text = "[prompt]P [tool]fake[/tool][/prompt][policy]a[/policy][tool]one[/tool][policy]b[/policy][tool]two[/tool]"
    assert tool_text(text) == "one\ntwo"
    assert answer_in_text(["The Who"], "a band, who played")
    assert not answer_in_text(["Ann"], "Anna and Annabel")
    assert not answer_in_text(["", "..."], "anything")


def test_near_misses_are_counted_exactly_on_hand_made_records() -> None:
    from searchgym.failures import near_miss, near_misses

    def record(answer: str | None, gold: list[str], em: float = 0.0) -> dict[str, Any]:
        return {"em": em, "answer": answer, "golden_answers": gold}

    records = [
        record("Paris", ["Paris"], em=1.0),  # right: not a miss
        record(None, ["Paris"]),  # no answer: not counted
        record("the city of Paris, France", ["Paris"]),  # holds the gold
        record("Paris Hilton", ["Hilton"]),  # holds the gold (whole words)
        record("Johann Sebastian Bach jr", ["Johann Sebastian Bach"]),  # holds it as well
        record("Johann Sebastian Bach", ["Johann Sebastian Bach Leipzig"]),  # F1 6/7, gold not contained
        record("Lyon", ["Paris"]),  # plainly wrong
        record("Parisian", ["Paris"]),  # part of a word: neither
    ]
    assert [near_miss(r) for r in records] == [
        None, None, "contains_gold", "contains_gold", "contains_gold", "high_f1", None, None,
    ]  # fmt: skip
    counts = near_misses(records)
    assert counts == {"wrong": 6, "contains_gold": 3, "high_f1": 1, "near": 4, "share": 4 / 6}
    assert near_misses([])["share"] == 0.0
