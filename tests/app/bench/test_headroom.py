"""``bench headroom``: the figures on hand-made records, the runner end to end on a scripted policy whose
figures are known exactly, the LLM adapter's seeding, and the command (a tiny model, bad input)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from searchgym.app.bench.headroom import (
    FIGURE_KEYS,
    Draw,
    HeadroomSettings,
    QuestionRecord,
    failure_stage,
    headroom_figures,
    parse_temperatures,
    run_headroom,
    sample_seed,
)
from searchgym.errors import ConfigError

torch = pytest.importorskip("torch")

from searchgym.agents.llm import Segment  # noqa: E402
from searchgym.agents.scripted import oracle_turns  # noqa: E402
from searchgym.app.cli import main  # noqa: E402
from searchgym.envs import EnvSpec  # noqa: E402
from searchgym.envs.vector import SearchQAVectorEnv  # noqa: E402
from searchgym.protocol import Source  # noqa: E402

# -- the figures on hand-made records ----------------------------------------------------------------------


def record(qid: str, kind: str, stage: str, greedy: float, **samples: list[float]) -> QuestionRecord:
    """A record whose samples are given as ``t1=[...]`` (temperature 1.0) and ``t05=[...]`` (0.5)."""
    temps = {"t1": 1.0, "t05": 0.5}
    return QuestionRecord(qid, kind, stage, greedy, {temps[k]: tuple(v) for k, v in samples.items()})


RECORDS = [
    record("a", "bridge", "correct", 1.0, t1=[1, 0], t05=[1, 1]),
    record("b", "bridge", "retrieval_miss", 0.0, t1=[0, 1], t05=[0, 0]),
    record("c", "attribute", "misread", 0.0, t1=[0, 0], t05=[1, 0]),
    record("d", "attribute", "no_answer", 0.0, t1=[1, 1], t05=[0, 0]),
    record("e", "unknown", "retrieval_unknown", 0.0, t1=[0, 0], t05=[0, 0]),
]


def test_figures_of_hand_made_records() -> None:
    fig = headroom_figures(RECORDS)
    assert (fig["questions"], fig["samples"], fig["temperatures"], fig["temperature"]) == (
        5,
        2,
        [1.0, 0.5],
        1.0,
    )
    # temperature 1.0: greedy right on a; samples right: a 1, b 1, d 2 of 10; greedy-wrong b..e, solvable b, d
    first = {
        "questions": 5,
        "greedy_em": 1 / 5,
        "greedy_wrong": 4,
        "mean_at_k": 4 / 10,
        "pass_at_k": 3 / 5,
        "solvable_given_greedy_wrong": 2 / 4,
        "success_given_greedy_wrong": 3 / 8,
        "greedy_gain_bound": 3 / 5,
    }
    assert {k: fig[k] for k in FIGURE_KEYS} == first
    block = fig["by_temperature"]["1.0"]
    assert {k: block[k] for k in FIGURE_KEYS} == first
    assert fig["by_kind"] == block["by_kind"] and fig["by_stage"] == block["by_stage"]
    # temperature 0.5: samples right: a 2, c 1 of 10; greedy-wrong solvable: c
    half = fig["by_temperature"]["0.5"]
    assert {k: half[k] for k in FIGURE_KEYS} == {
        "questions": 5,
        "greedy_em": 1 / 5,
        "greedy_wrong": 4,
        "mean_at_k": 3 / 10,
        "pass_at_k": 2 / 5,
        "solvable_given_greedy_wrong": 1 / 4,
        "success_given_greedy_wrong": 1 / 8,
        "greedy_gain_bound": 2 / 5,
    }
    assert list(block["by_kind"]) == ["attribute", "bridge", "unknown"]
    assert block["by_kind"]["bridge"] == {
        "questions": 2,
        "greedy_em": 1 / 2,
        "greedy_wrong": 1,
        "mean_at_k": 2 / 4,
        "pass_at_k": 2 / 2,
        "solvable_given_greedy_wrong": 1 / 1,
        "success_given_greedy_wrong": 1 / 2,
        "greedy_gain_bound": 2 / 2,
    }
    assert block["by_kind"]["attribute"] == {
        "questions": 2,
        "greedy_em": 0.0,
        "greedy_wrong": 2,
        "mean_at_k": 2 / 4,
        "pass_at_k": 1 / 2,
        "solvable_given_greedy_wrong": 1 / 2,
        "success_given_greedy_wrong": 2 / 4,
        "greedy_gain_bound": 1 / 2,
    }
    assert list(block["by_stage"]) == [
        "correct",
        "retrieval_miss",
        "misread",
        "no_answer",
        "retrieval_unknown",
    ]
    assert block["by_stage"]["correct"] == {
        "questions": 1,
        "greedy_em": 1.0,
        "greedy_wrong": 0,
        "mean_at_k": 1 / 2,
        "pass_at_k": 1.0,
        "solvable_given_greedy_wrong": None,
        "success_given_greedy_wrong": None,
        "greedy_gain_bound": 1.0,
    }
    assert half["by_stage"]["misread"] == {
        "questions": 1,
        "greedy_em": 0.0,
        "greedy_wrong": 1,
        "mean_at_k": 1 / 2,
        "pass_at_k": 1.0,
        "solvable_given_greedy_wrong": 1.0,
        "success_given_greedy_wrong": 1 / 2,
        "greedy_gain_bound": 1.0,
    }
    json.dumps(fig)  # plain data


def test_an_empty_stage_has_counts_and_no_figures() -> None:
    fig = headroom_figures(RECORDS[:2])
    assert list(fig["by_stage"]) == ["correct", "retrieval_miss", "misread", "no_answer"]
    assert fig["by_stage"]["misread"] == {
        k: 0 if k in ("questions", "greedy_wrong") else None for k in FIGURE_KEYS
    }


def test_records_must_agree_on_temperatures_and_samples() -> None:
    with pytest.raises(ConfigError, match="no questions"):
        headroom_figures([])
    with pytest.raises(ConfigError, match="question b"):
        headroom_figures([RECORDS[0], record("b", "bridge", "correct", 1.0, t1=[1, 0])])


@pytest.mark.parametrize(
    ("info", "stage"),
    [
        ({"em": 1.0, "answer": "x", "gold_all_retrieved": False}, "correct"),
        ({"em": 0.0, "answer": None, "gold_all_retrieved": True}, "no_answer"),
        ({"em": 0.0, "answer": "x", "gold_all_retrieved": False}, "retrieval_miss"),
        ({"em": 0.0, "answer": "x", "gold_all_retrieved": True}, "misread"),
        ({"em": 0.0, "answer": "x", "gold_all_retrieved": None}, "retrieval_unknown"),
    ],
)
def test_failure_stage_of_an_episode(info: dict[str, Any], stage: str) -> None:
    assert failure_stage(info) == stage


def test_sample_seeds_depend_on_seed_temperature_and_sample_only() -> None:
    seeds = {sample_seed(s, t, k) for s in (0, 1) for t in (1.0, 0.7) for k in range(3)}
    assert len(seeds) == 12
    assert sample_seed(3, 0.7, 2) == sample_seed(3, 0.7, 2)


@pytest.mark.parametrize("text", ["", "1,abc", "0", "1,-0.5", "1,nan", "1,1", "inf"])
def test_bad_temperatures_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--temperatures"):
        parse_temperatures(text)


def test_settings_are_checked() -> None:
    assert parse_temperatures("1, 0.7") == (1.0, 0.7)
    for bad in ({"samples": 0}, {"questions": 0}, {"batch_size": 0}, {"seed": -1}, {"temperatures": ()}):
        with pytest.raises(ConfigError):
            HeadroomSettings(**bad)  # type: ignore[arg-type]


# -- the runner on a scripted policy -----------------------------------------------------------------------

ENV = EnvSpec(split="test", max_turn_tokens=48, max_context_tokens=1024)
"""The generated world (seed 0), BM25, top 3, 4 turns. Its first test questions: 0 attribute, 1 comparison,
2 comparison, 3 attribute, 4 attribute, 5 bridge."""

GREEDY = ["right", "right", "miss", "misread", "silent", "misread"]
"""The greedy play of questions 0..5: ``right`` the oracle; ``miss`` answers at once, wrongly (no passage
retrieved); ``misread`` the oracle's searches, then a wrong answer; ``silent`` searches nonsense until the turn
budget ends the episode without an answer."""

SAMPLED = {
    1.0: [[1, 1, 0], [0, 0, 0], [0, 1, 0], [0, 0, 0], [1, 1, 1], [0, 0, 1]],
    0.5: [[1, 1, 1], [1, 1, 1], [0, 0, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0]],
}
"""Sample ``k`` of question ``i`` at temperature ``t`` is the oracle (right) when ``SAMPLED[t][i][k]``, else
``miss``."""


class ScriptedPolicy:
    """A :class:`~searchgym.app.bench.headroom.HeadroomPolicy` that plays :data:`GREEDY` and :data:`SAMPLED`:
    it reads the question from the prompt and the turn from the transcript, and writes the script's turn."""

    def __init__(self, env: SearchQAVectorEnv) -> None:
        self.env = env
        self.index = {q.question.rstrip("?"): i for i, q in enumerate(env.questions)}
        self.draws: list[Draw] = []

    def decoder(self, draw: Draw) -> ScriptedDecoder:
        self.draws.append(draw)
        return ScriptedDecoder(self, draw)

    def turns(self, i: int, plan: str) -> list[str]:
        env, q = self.env, self.env.questions[i]
        oracle = oracle_turns(
            env.dataset, q.id, "test", env.env_spec.max_turns, env.retriever, env.env_spec.topk
        )
        wrong = "<answer> nobody at all </answer>"
        return {
            "right": oracle,
            "miss": [wrong],
            "misread": [*oracle[:-1], wrong],
            "silent": ["<search> zzz qqq </search>"] * env.env_spec.max_turns,
        }[plan]


class ScriptedDecoder:
    def __init__(self, owner: ScriptedPolicy, draw: Draw) -> None:
        self.owner = owner
        self.draw = draw

    def clear_cache(self) -> None:
        pass

    def rollout_segments(self, observations: Sequence[dict[str, np.ndarray]]) -> list[Segment]:
        return [self.turn(o) for o in observations]

    def turn(self, observation: Mapping[str, Any]) -> Segment:
        n = int(observation["length"][0])
        tokens, sources = observation["tokens"][:n], observation["sources"][:n]
        tok = self.owner.env.tokenizer
        prompt = tok.decode([int(t) for t in tokens[sources == Source.PROMPT]])
        question = prompt.rsplit("Question: ", 1)[1].strip().rstrip("?")
        i = self.owner.index[question]
        policy = (sources == Source.POLICY).astype(np.int8)
        turn = int(np.count_nonzero(np.diff(np.concatenate([[0], policy])) == 1))  # policy runs so far
        t = self.draw.temperature
        plan = GREEDY[i] if t is None else ("right" if SAMPLED[t][i][self.draw.sample] else "miss")
        ids = tok.encode(self.owner.turns(i, plan)[turn])
        return Segment(ids, torch.zeros(len(ids)), "")


def test_runner_gives_the_scripted_policys_exact_figures() -> None:
    held = SearchQAVectorEnv(1, ENV, autoreset_mode="Disabled")
    try:
        assert [q.kind for q in held.questions[:6]] == [
            "attribute",
            "comparison",
            "comparison",
            "attribute",
            "attribute",
            "bridge",
        ]
        policy = ScriptedPolicy(held)
        settings = HeadroomSettings(questions=6, samples=3, temperatures=(1.0, 0.5), seed=7, batch_size=4)
        records = run_headroom(policy, ENV, settings)
    finally:
        held.close()
    assert [r.question_id for r in records] == [f"test-{i}" for i in range(6)]
    assert [r.stage for r in records] == [
        "correct",
        "correct",
        "retrieval_miss",
        "misread",
        "no_answer",
        "misread",
    ]
    assert [r.greedy for r in records] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert [dict(r.samples) for r in records] == [
        {t: tuple(float(x) for x in SAMPLED[t][i]) for t in (1.0, 0.5)} for i in range(6)
    ]
    assert policy.draws == [Draw(None, 0, 0)] + [
        Draw(t, k, sample_seed(7, t, k)) for t in (1.0, 0.5) for k in range(3)
    ]

    fig = headroom_figures(records)
    assert {k: fig[k] for k in FIGURE_KEYS} == {
        "questions": 6,
        "greedy_em": 2 / 6,
        "greedy_wrong": 4,
        "mean_at_k": 7 / 18,
        "pass_at_k": 4 / 6,
        "solvable_given_greedy_wrong": 3 / 4,
        "success_given_greedy_wrong": 5 / 12,
        "greedy_gain_bound": 5 / 6,
    }
    half = fig["by_temperature"]["0.5"]
    assert {k: half[k] for k in FIGURE_KEYS} == {
        "questions": 6,
        "greedy_em": 2 / 6,
        "greedy_wrong": 4,
        "mean_at_k": 7 / 18,
        "pass_at_k": 3 / 6,
        "solvable_given_greedy_wrong": 1 / 4,
        "success_given_greedy_wrong": 1 / 12,
        "greedy_gain_bound": 3 / 6,
    }
    stage = fig["by_stage"]
    assert [stage[s]["questions"] for s in ("correct", "retrieval_miss", "misread", "no_answer")] == [
        2,
        1,
        2,
        1,
    ]
    assert stage["misread"] == {
        "questions": 2,
        "greedy_em": 0.0,
        "greedy_wrong": 2,
        "mean_at_k": 1 / 6,
        "pass_at_k": 1 / 2,
        "solvable_given_greedy_wrong": 1 / 2,
        "success_given_greedy_wrong": 1 / 6,
        "greedy_gain_bound": 1 / 2,
    }
    assert stage["no_answer"]["success_given_greedy_wrong"] == 1.0
    assert stage["retrieval_miss"]["success_given_greedy_wrong"] == 1 / 3
    kind = fig["by_kind"]
    assert kind["attribute"] == {
        "questions": 3,
        "greedy_em": 1 / 3,
        "greedy_wrong": 2,
        "mean_at_k": 5 / 9,
        "pass_at_k": 2 / 3,
        "solvable_given_greedy_wrong": 1 / 2,
        "success_given_greedy_wrong": 3 / 6,
        "greedy_gain_bound": 2 / 3,
    }
    assert kind["comparison"]["greedy_gain_bound"] == 1.0 and kind["bridge"]["pass_at_k"] == 1.0


# -- the LLM adapter -----------------------------------------------------------------------------------------


def test_llm_decoders_are_greedy_or_seeded_samplers() -> None:
    from searchgym.agents.llm import LLMPolicy, tiny_causal_lm
    from searchgym.app.bench.headroom import LLMHeadroomPolicy
    from searchgym.tokenization import load_tokenizer

    tokenizer = load_tokenizer(None)
    model = tiny_causal_lm(tokenizer.vocab_size, layers=1, hidden=32, eos_token_id=tokenizer.eos_token_id)
    policy = LLMHeadroomPolicy(model, tokenizer, max_turn_tokens=12)
    context = [tokenizer.encode("Answer the question. Question: who?\n")]

    def turn(draw: Draw) -> list[int]:
        decoder = policy.decoder(draw)
        assert isinstance(decoder, LLMPolicy) and decoder.max_turn_tokens == 12
        return decoder.generate_segments(context)[0].tokens

    assert policy.decoder(Draw(None, 0, 0)).greedy  # type: ignore[attr-defined]
    assert turn(Draw(None, 0, 0)) == turn(Draw(None, 0, 5))
    sampled = [turn(Draw(1.0, k, sample_seed(0, 1.0, k))) for k in range(4)]
    assert sampled == [turn(Draw(1.0, k, sample_seed(0, 1.0, k))) for k in range(4)]  # reproducible
    assert len({tuple(s) for s in sampled}) > 1  # the samples differ from one another


# -- the command ---------------------------------------------------------------------------------------------

TINY = [
    "bench",
    "headroom",
    "--tiny-layers",
    "1",
    "--tiny-hidden",
    "32",
    "--max-turn-tokens",
    "8",
    "--threads",
    "1",
]


def test_command_prints_every_key_with_a_tiny_model(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*TINY, "--questions", "3", "--samples", "2", "--temperatures", "1,0.7", "--batch-size", "2"]
    assert main([*argv, "--json", "--no-progress"]) == 0
    fig = json.loads(capsys.readouterr().out)
    assert set(FIGURE_KEYS) <= set(fig) and {"by_kind", "by_stage", "by_temperature", "temperatures"} <= set(
        fig
    )
    assert (fig["questions"], fig["samples"], fig["temperatures"], fig["max_turn_tokens"]) == (
        3,
        2,
        [1.0, 0.7],
        8,
    )
    assert list(fig["by_temperature"]) == ["1.0", "0.7"]
    for block in fig["by_temperature"].values():
        assert set(FIGURE_KEYS) <= set(block)
        assert sum(s["questions"] for s in block["by_stage"].values()) == 3
        assert sum(k["questions"] for k in block["by_kind"].values()) == 3
    assert main([*argv, "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "temperature 1.0" in text and "temperature 0.7" in text and "pass_at_k" in text


def test_command_writes_one_record_per_question(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "records.jsonl"
    argv = [*TINY, "--questions", "3", "--samples", "2", "--temperatures", "1,0.7", "--batch-size", "2"]
    assert main([*argv, "--json", "--no-progress", "--out", str(out)]) == 0
    fig = json.loads(capsys.readouterr().out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 3 and all(len(r["samples"]["0.7"]) == 2 for r in records)
    assert sum(r["greedy"] for r in records) / 3 == fig["greedy_em"]
    stages = Counter(r["stage"] for r in records)
    assert {s: stages[s] for s in stages} == {
        s: b["questions"] for s, b in fig["by_stage"].items() if b["questions"]
    }


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--samples", "0"], "--samples must be an integer >= 1, got 0"),
        (["--temperatures", "1,hot"], "--temperatures '1,hot': 'hot' is not a number"),
        (["--temperatures", "0"], "--temperatures '0': every temperature must be a finite number > 0"),
        (["--init", "no/such/checkpoint.pt"], "no checkpoint at no/such/checkpoint.pt"),
    ],
)
def test_bad_input_is_one_error_line(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*TINY, "--questions", "2", "--samples", "1", "--no-progress", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"searchgym: error: {message}"), lines


def test_command_takes_the_checkpoints_turn_and_context_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    from searchgym.agents.llm import tiny_causal_lm
    from searchgym.agents.training.checkpoint import save_checkpoint
    from searchgym.agents.training.config import SFTConfig
    from searchgym.tokenization import load_tokenizer

    tokenizer = load_tokenizer(None)
    model = tiny_causal_lm(tokenizer.vocab_size, layers=1, hidden=32, eos_token_id=tokenizer.eos_token_id)
    config = SFTConfig(tiny_layers=1, tiny_hidden=32, max_turn_tokens=8, max_context_tokens=768)
    arch = {"kind": "tiny", "layers": 1, "hidden": 32, "tokenizer": None}
    payload = {
        "kind": "sft",
        "step": 1,
        "model": model.state_dict(),
        "arch": arch,
        "config": config.to_dict(),
    }
    init = str(save_checkpoint(tmp_path / "checkpoint.pt", payload))
    argv = [
        "bench",
        "headroom",
        "--init",
        init,
        "--questions",
        "2",
        "--samples",
        "1",
        "--threads",
        "1",
        "--json",
        "--no-progress",
    ]
    assert main(argv) == 0
    fig = json.loads(capsys.readouterr().out)
    assert (fig["init"], fig["max_turn_tokens"], fig["max_context_tokens"]) == (init, 8, 768)
    assert main([*argv, "--max-turn-tokens", "6"]) == 0  # what the command line gives wins
    fig = json.loads(capsys.readouterr().out)
    assert (fig["max_turn_tokens"], fig["max_context_tokens"]) == (6, 768)
