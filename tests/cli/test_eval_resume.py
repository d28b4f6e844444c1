"""``eval --resume``: a run interrupted at any episode continues from ``OUT.partial`` into the same bytes as
an uninterrupted run; a different command, nothing to resume, or a damaged file is refused."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from searchgym.cli import main

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
    partial.write_bytes(lines[0] + b"{not json\n" + lines[2])
    capsys.readouterr()
    assert run_eval(out, "--resume") == 2
    assert f"{partial}:2" in capsys.readouterr().err
    partial.write_bytes(b"".join(lines))
    assert run_eval(out, "--resume", "--episodes", "2") == 2
    assert "holds 3 episodes, more than --episodes 2" in capsys.readouterr().err


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
