"""Trajectory rows for TRL and verl, and ``searchgym export-trajectories``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchgym.agents.integrations.trajectories import EpisodeTokens, split_transcript, to_record
from searchgym.errors import ConfigError
from searchgym.protocol import Source

P, A, T, PAD = int(Source.PROMPT), int(Source.POLICY), int(Source.TOOL), int(Source.PAD)


def test_split_transcript_masks_tool_tokens_and_drops_padding() -> None:
    tokens = [5, 6, 7, 8, 9, 10, 11, 0]
    sources = [P, P, A, A, T, T, A, PAD]
    logp = [0.0, 0.0, -1.0, -2.0, 0.0, 0.0, -3.0, 0.0]
    assert split_transcript(tokens, sources, logp) == (
        [5, 6],
        [7, 8, 9, 10, 11],
        [1, 1, 0, 0, 1],
        [-1.0, -2.0, 0.0, 0.0, -3.0],
    )
    with pytest.raises(ConfigError):
        split_transcript([1, 2, 3], [P, A, P])


def test_records_use_each_engines_field_names() -> None:
    ep = EpisodeTokens([1], [2, 3], [1, 0], [-0.5, 0.0], 1.0, {"question_id": "q", "em": 1.0})
    trl = to_record(ep, "trl")
    verl = to_record(ep, "verl")
    assert (trl["completion_ids"], trl["env_mask"], trl["logprobs"], trl["reward"]) == (
        [2, 3],
        [1, 0],
        [-0.5, 0.0],
        1.0,
    )
    assert (verl["response_ids"], verl["response_mask"], verl["response_logprobs"], verl["reward_score"]) == (
        [2, 3],
        [1, 0],
        [-0.5, 0.0],
        1.0,
    )
    assert trl["question_id"] == verl["extra_fields"]["question_id"] == "q"
    assert verl["extra_fields"]["reward_extra_info"]["em"] == 1.0
    assert verl["num_turns"] == 3 and verl["metrics"] == {}  # prompt, a policy run, a tool run
    with pytest.raises(ConfigError, match="trl"):
        to_record(ep, "other")  # type: ignore[arg-type]


def test_export_trajectories_command(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from searchgym.app.cli import main

    out = tmp_path / "traj.jsonl"
    argv = [
        "export-trajectories",
        "--out",
        str(out),
        "--episodes",
        "4",
        "--group-size",
        "2",
        "--format",
        "verl",
    ]
    assert main([*argv, "--max-turn-tokens", "12", "--max-context-tokens", "300", "--batch", "4"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4
    info = [row["extra_fields"] for row in rows]
    assert info[0]["question_id"] == info[1]["question_id"]  # a group shares its question
    for row in rows:
        assert len(row["response_ids"]) == len(row["response_mask"]) == len(row["response_logprobs"])
        assert set(row["response_mask"]) <= {0, 1} and row["reward_score"] in (0.0, 1.0)


def test_export_trajectories_shares_the_env_options(tmp_path: Path) -> None:
    """--max-obs-tokens, --reward and --prompt-style, as on train trl and prepare verl."""
    pytest.importorskip("torch")
    from searchgym.app.cli import main

    out = tmp_path / "traj.jsonl"
    argv = ["export-trajectories", "--out", str(out), "--episodes", "4", "--batch", "4", "--format", "trl"]
    argv += ["--max-turn-tokens", "12", "--max-context-tokens", "300", "--max-obs-tokens", "5"]
    assert main([*argv, "--reward", "f1"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for row in rows:
        assert row["reward"] == row["f1"]  # the episode reward is F1
        tool_runs = "".join(map(str, row["env_mask"])).split("1")
        assert all(len(run) <= 5 for run in tool_runs)  # every observation cut to 5 tokens
    assert any("0" * 5 in "".join(map(str, row["env_mask"])) for row in rows)  # the cut acted
    # The built-in tokenizer has no chat template: the chat prompt reaches the env, which says so.
    assert main([*argv, "--prompt-style", "chat"]) != 0
