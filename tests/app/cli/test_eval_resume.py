"""``eval --resume``: a run interrupted at any episode continues from ``OUT.partial`` into the same bytes as
an uninterrupted run; a different command, nothing to resume, or a damaged file is refused."""

from __future__ import annotations

import importlib
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from searchgym.app.cli import main

# the module (``searchgym.agents.evaluate`` as an attribute is the function of the same name)
evaluate_module = importlib.import_module("searchgym.agents.evaluate")

EPISODES = 9


def run_eval(out: Path, *extra: str, agent: str = "heuristic") -> int:
    args = [
        "eval",
        "--agent",
        agent,
        "--episodes",
        str(EPISODES),
        "--no-progress",
        "--out",
        str(out),
        "--json",
    ]
    return main([*args, *extra])


def interrupt_after(monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    """The next eval is stopped (Ctrl-C) as it starts its episode ``k``."""
    real = evaluate_module.run_episode
    played: list[int] = []

    def run_episode(*args: Any, **kwargs: Any) -> Any:
        if len(played) == k:
            raise KeyboardInterrupt
        played.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate_module, "run_episode", run_episode)


@pytest.fixture(scope="module", params=["heuristic", "random"])
def uninterrupted(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, bytes]:
    out = tmp_path_factory.mktemp("calm") / "e.jsonl"
    assert run_eval(out, agent=request.param) == 0
    assert not Path(str(out) + ".partial.run.json").exists()  # a finished run leaves no run record
    return request.param, out.read_bytes()


@pytest.mark.parametrize("k", [0, 1, 5, EPISODES - 1])
def test_a_run_interrupted_at_any_episode_resumes_into_the_same_bytes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    uninterrupted: tuple[str, bytes],
    k: int,
) -> None:
    agent, expected = uninterrupted
    out = tmp_path / "e.jsonl"
    interrupt_after(monkeypatch, k)
    assert run_eval(out, agent=agent) == 130
    partial = Path(str(out) + ".partial")
    assert len(partial.read_bytes().splitlines()) == k and not out.exists()
    monkeypatch.undo()
    capsys.readouterr()
    assert run_eval(out, "--resume", agent=agent) == 0
    assert out.read_bytes() == expected
    captured = capsys.readouterr()
    assert f"resuming {out}: {k} of {EPISODES} episodes done" in captured.err
    # the figures cover every episode, held and new: those of an uninterrupted run
    figures = json.loads(captured.out)
    assert figures["episodes"] == EPISODES
    records = [json.loads(line) for line in expected.splitlines()]
    assert figures["em"] == pytest.approx(sum(r["em"] for r in records) / EPISODES)


def test_a_torn_last_line_is_played_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uninterrupted: tuple[str, bytes]
) -> None:
    agent, expected = uninterrupted
    out = tmp_path / "e.jsonl"
    interrupt_after(monkeypatch, 4)
    assert run_eval(out, agent=agent) == 130
    monkeypatch.undo()
    partial = Path(str(out) + ".partial")
    fifth = expected.splitlines(keepends=True)[4]
    partial.write_bytes(partial.read_bytes() + fifth[: len(fifth) // 2])  # killed mid-write
    assert run_eval(out, "--resume", agent=agent) == 0
    assert out.read_bytes() == expected


@pytest.mark.parametrize(
    ("change", "named"),
    [(["--seed", "3"], "seed"), (["--topk", "2"], "env_options"), (["--max-turns", "3"], "env_options")],
)
def test_resuming_another_command_is_refused_naming_what_differs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    change: list[str],
    named: str,
) -> None:
    out = tmp_path / "e.jsonl"
    interrupt_after(monkeypatch, 3)
    assert run_eval(out) == 130
    monkeypatch.undo()
    partial = Path(str(out) + ".partial")
    before = partial.read_bytes()
    capsys.readouterr()
    assert run_eval(out, "--resume", *change) == 2
    err = capsys.readouterr().err
    assert "was written by another eval" in err and f"{named}: was" in err
    assert partial.read_bytes() == before  # nothing lost
    assert run_eval(out, "--resume", "--agent", "oracle") == 2
    assert "agent: was 'heuristic', now 'oracle'" in capsys.readouterr().err
    assert run_eval(out, "--resume", "--retriever-patience", "5") == 0  # patience is not part of the run


def test_nothing_to_resume_and_a_damaged_partial_are_clear_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "e.jsonl"
    assert run_eval(out, "--resume") == 2
    assert "no interrupted eval to continue" in capsys.readouterr().err
    assert main(["eval", "--agent", "heuristic", "--resume"]) == 2
    assert "give its --out" in capsys.readouterr().err
    interrupt_after(monkeypatch, 3)
    assert run_eval(out) == 130
    monkeypatch.undo()
    partial = Path(str(out) + ".partial")
    lines = partial.read_bytes().splitlines(keepends=True)
    capsys.readouterr()
    assert run_eval(out, "--resume", "--episodes", "2") == 2
    assert "holds 3 episodes, more than --episodes 2" in capsys.readouterr().err
    partial.write_bytes(lines[0] + b"{not json\n" + lines[2])  # damaged: played again from there
    assert run_eval(out, "--resume") == 0
    err = capsys.readouterr().err
    assert "2 finished episode(s) from episode 2 on do not match" in err and f"resuming {out}: 1 of" in err
    assert len(out.read_bytes().splitlines()) == EPISODES


def test_the_pace_counts_only_the_episodes_a_resumed_run_played(tmp_path: Path) -> None:
    import gymnasium as gym

    from searchgym.agents import HeuristicAgent

    env = gym.make("SearchQA-v0", split="test")
    agent = HeuristicAgent(env.unwrapped.tokenizer)
    out = tmp_path / "e.jsonl"
    full = evaluate_module.evaluate(env, agent, 3, out=out)
    held = [
        evaluate_module.EpisodeRecord.from_json(json.loads(line)) for line in out.read_text().splitlines()
    ]
    resumed = evaluate_module.evaluate(env, agent, 3, out=out, held=held)  # nothing left to play
    assert resumed.episodes == 3 and resumed.em == full.em and resumed.episodes_per_s == 0.0
    env.close()


def interrupted_partial(out: Path, monkeypatch: pytest.MonkeyPatch, agent: str, k: int = 5) -> Path:
    interrupt_after(monkeypatch, k)
    assert run_eval(out, agent=agent) == 130
    monkeypatch.undo()
    return Path(str(out) + ".partial")


def flip_em(line: bytes, value: Any) -> bytes:
    record = json.loads(line)
    record["em"] = value
    return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")


@pytest.mark.parametrize("edit", ["em", "em-string", "reordered", "another-run"])
def test_edited_reordered_or_foreign_held_episodes_are_played_again(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    uninterrupted: tuple[str, bytes],
    edit: str,
) -> None:
    """What ``--resume`` keeps must be what this run wrote, in its order: otherwise an edited ``em`` would
    enter the figures (the final EM of an all-wrong run read 0.124 instead of 0.0)."""
    agent, expected = uninterrupted
    out = tmp_path / "e.jsonl"
    partial = interrupted_partial(out, monkeypatch, agent)
    lines = partial.read_bytes().splitlines(keepends=True)
    if edit == "em":
        lines[1] = flip_em(lines[1], 1.0 - json.loads(lines[1])["em"])
    elif edit == "em-string":
        lines[1] = flip_em(lines[1], "abc")
    elif edit == "reordered":
        lines[1], lines[2] = lines[2], lines[1]
    else:  # the second episode of another run (other env options) spliced in
        other = tmp_path / "other.jsonl"
        assert run_eval(other, "--topk", "1", "--seed", "11", agent=agent) == 0
        lines[1] = other.read_bytes().splitlines(keepends=True)[1]
    partial.write_bytes(b"".join(lines))
    capsys.readouterr()
    assert run_eval(out, "--resume", agent=agent) == 0
    assert out.read_bytes() == expected
    captured = capsys.readouterr()
    assert "from episode 2 on do not match the digests written with them" in captured.err
    records = [json.loads(line) for line in expected.splitlines()]
    assert json.loads(captured.out)["em"] == pytest.approx(sum(r["em"] for r in records) / EPISODES)
    assert not Path(str(out) + ".partial.digests").exists()  # a finished run leaves no digests


@pytest.mark.parametrize("damage", [b"{bad", b"[1, 2]", b"\xff\xfe", b"1" * 5000])
def test_a_damaged_run_record_is_one_typed_line_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], damage: bytes
) -> None:
    out = tmp_path / "e.jsonl"
    partial = interrupted_partial(out, monkeypatch, "heuristic", k=3)
    before = partial.read_bytes()
    Path(str(out) + ".partial.run.json").write_bytes(damage)
    capsys.readouterr()
    assert run_eval(out, "--resume") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "e.jsonl.partial.run.json" in err
    assert partial.read_bytes() == before and not out.exists()


@pytest.mark.parametrize(
    ("value", "named"), [("abc", "'em' is 'abc'"), (None, "'em' is None"), ("drop", "no 'em'")]
)
def test_a_held_record_of_the_wrong_type_is_a_typed_error_even_with_fresh_digests(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    value: Any,
    named: str,
) -> None:
    """A file rewritten together with its digests passes them (they are not a signature): its records are
    still type-checked, one line naming the field, and nothing is lost."""
    from searchgym.app.cli.eval import run_identity  # noqa: F401 - the identity is read back from the run record
    from searchgym.data.digests import RecordDigests

    out = tmp_path / "e.jsonl"
    partial = interrupted_partial(out, monkeypatch, "heuristic", k=3)
    lines = partial.read_bytes().splitlines(keepends=True)
    record = json.loads(lines[1])
    if value == "drop":
        del record["em"]
    else:
        record["em"] = value
    lines[1] = (json.dumps(record) + "\n").encode()
    partial.write_bytes(b"".join(lines))
    identity = json.loads(Path(str(out) + ".partial.run.json").read_text())
    RecordDigests(partial, identity).restart()  # re-digested by whoever edited it
    before = partial.read_bytes()
    capsys.readouterr()
    assert run_eval(out, "--resume") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{partial}:2" in err and named in err
    assert partial.read_bytes() == before and not out.exists()


def test_the_same_command_run_again_continues_as_benchmark_does(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    uninterrupted: tuple[str, bytes],
) -> None:
    """One rule for eval and benchmark: an interrupted run's finished episodes are not thrown away by
    running the same command again; --restart is how to throw them away, and says so."""
    agent, expected = uninterrupted
    out = tmp_path / "e.jsonl"
    interrupt_after(monkeypatch, 4)
    assert run_eval(out, agent=agent) == 130
    monkeypatch.undo()
    capsys.readouterr()
    assert run_eval(out, agent=agent) == 0  # no --resume
    assert out.read_bytes() == expected
    err = capsys.readouterr().err
    assert f"resuming {out}: 4 of {EPISODES} episodes done (the same command was interrupted" in err
    interrupt_after(monkeypatch, 4)
    assert run_eval(out, agent=agent) == 130
    monkeypatch.undo()
    capsys.readouterr()
    assert run_eval(out, "--restart", agent=agent) == 0
    assert out.read_bytes() == expected
    err = capsys.readouterr().err
    assert (
        f"note: --restart: {out}.partial's finished episodes are discarded" in err and "resuming" not in err
    )


def test_another_evals_leftovers_are_replaced_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "e.jsonl"
    interrupt_after(monkeypatch, 3)
    assert run_eval(out) == 130
    monkeypatch.undo()
    capsys.readouterr()
    assert run_eval(out, "--seed", "3") == 0  # another eval: nothing of it to continue
    err = capsys.readouterr().err
    assert f"note: {out}.partial is not this eval's to continue (" in err and "seed: was 0, now 3" in err
    assert "playing every episode" in err and "resuming" not in err
    assert len(out.read_bytes().splitlines()) == EPISODES
    assert main(["eval", "--agent", "heuristic", "--restart"]) == 2
    assert "--restart applies to an interrupted --out run: give its --out" in capsys.readouterr().err


# Succeeds (as the oracle plays) on a seeded coin with probability RATE, else answers "nothing".
COIN_AGENT = textwrap.dedent(
    """
    import random
    from searchgym.agents import OracleAgent

    RATE = 0.5

    class Coin:
        temperature = 1.0

        def __init__(self, env):
            self.oracle = OracleAgent.from_env(env)
            self.wrong = env.unwrapped.tokenizer.encode("<answer> nothing </answer>")

        def reset(self, info, seed=None):
            self.win = random.Random(seed).random() < RATE
            self.oracle.reset(info, seed=seed)
            self.pending = list(self.wrong)

        def act(self, observation, info):
            return self.oracle.act(observation, info) if self.win else self.pending.pop(0)
    """
)


def test_sampled_eval_estimates_mean_and_pass_at_k_of_a_known_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """K = 4 samples of 60 questions by an agent that succeeds with probability 1/2 on each: mean@4 is 1/2
    and pass@4 is 1 - (1/2)^4 = 0.9375; the tolerance, 0.15, is over 4 standard errors of each estimate
    (sqrt(1/4 / 240) = 0.032 and sqrt(0.9375 * 0.0625 / 60) = 0.031)."""
    (tmp_path / "coin_agent.py").write_text(COIN_AGENT, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "coin.jsonl"
    args = ["eval", "--agent", "coin_agent:Coin", "--episodes", "60", "--samples", "4", "--temperature", "1"]
    assert main([*args, "--no-progress", "--json", "--out", str(out)]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["episodes"] == 240 and figures["questions"] == 60 and figures["decoding"] == "T=1, K=4"
    assert abs(figures["em"] - 0.5) < 0.15 and abs(figures["pass_at_k"] - 0.9375) < 0.15
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["sample"] for r in records[:8]] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert len({r["question_id"] for r in records[:4]}) == 1  # a question's samples are consecutive
    counts = [sum(r["em"] >= 1 for r in records[i : i + 4]) for i in range(0, 240, 4)]
    assert figures["successes"] == counts
    assert figures["em"] == pytest.approx(sum(counts) / 240)
    assert figures["em_low"] < figures["em"] < figures["em_high"]
