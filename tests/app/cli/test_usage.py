"""Usage errors: one line saying what was wrong (a misspelt option or command named with the closest valid
one), then the usage of the command it belongs to — not the top-level usage block first."""

from __future__ import annotations

import argparse

import pytest

from searchgym.app.cli import build_parser, main


@pytest.mark.parametrize(
    ("argv", "error", "usage"),
    [
        (
            ["eval", "--agnet", "oracle"],
            "eval: unrecognized option --agnet (did you mean --agent?)",
            "usage: searchgym eval --agent AGENT [options]; `searchgym eval --help` says more",
        ),
        (
            ["train", "grpo", "--stpes", "3"],
            "train grpo: unrecognized option --stpes (did you mean --steps?)",
            "usage: searchgym train grpo [options]; `searchgym train grpo --help` says more",
        ),
        (
            ["train", "grop"],
            "train: no command 'grop' (did you mean 'grpo'?)",
            "usage: searchgym train COMMAND (",
        ),
        (["evl", "--agent", "x"], "no command 'evl' (did you mean 'eval'?)", "usage: searchgym COMMAND ("),
        (
            ["eval", "--agent", "oracle", "--xyzzy", "1"],
            "eval: unrecognized option --xyzzy",
            "usage: searchgym eval --agent AGENT",
        ),
        (
            ["eval", "--episodes", "0", "--agent", "oracle"],
            "argument --episodes: must be >= 1, got 0",
            "usage: searchgym eval --agent AGENT",
        ),
        (["eval"], "the following arguments are required: --agent", "usage: searchgym eval --agent AGENT"),
    ],
)
def test_a_usage_error_is_its_line_then_the_commands_usage(
    argv: list[str], error: str, usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == f"searchgym: error: {error}", lines
    assert len(lines) == 2 and lines[1].startswith(usage), lines


def test_outside_main_the_parser_reports_as_argparse_does(capsys: pytest.CaptureFixture[str]) -> None:
    parser: argparse.ArgumentParser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", "--agnet", "x"])
    assert "usage:" in capsys.readouterr().err
