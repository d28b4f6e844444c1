"""A mistaken ``--agent`` or ``--dataset`` gets one line that names what was probably meant."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchgym.app.cli import main

FORMS = "random, oracle, heuristic, checkpoint:PATH, sb3:PATH, openai:MODEL or package.module:Class"


def error_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main([*argv, "--episodes", "1", "--no-progress"]) == 2
    return capsys.readouterr().err.strip()


def test_a_misspelt_agent_gets_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(["eval", "--agent", "oracel"], capsys)
    assert err == f"searchgym: error: unknown agent 'oracel' (did you mean 'oracle'?); --agent takes {FORMS}"


def test_a_dotted_class_path_is_told_the_colon(capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(["eval", "--agent", "mypkg.twohop.TwoHop"], capsys)
    assert "a class of your own is named with a colon before the class, package.module:Class" in err
    assert "(did you mean mypkg.twohop:TwoHop?)" in err


def test_the_agent_forms_include_a_served_model(capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(["eval", "--agent", "zzz"], capsys)
    assert err == f"searchgym: error: unknown agent 'zzz'; --agent takes {FORMS}"
    assert "openai:MODEL" in err


def test_a_misspelt_prefix_gets_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(["eval", "--agent", "chekpoint:runs/sft/checkpoint.pt"], capsys)
    assert err.endswith("(did you mean checkpoint:runs/sft/checkpoint.pt?)"), err


def test_a_missing_dataset_names_the_folder_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    for name in ("hotpotqa_dev_distractor_1100", "nq_open_oracle_2655", ".hidden"):
        (data / name).mkdir(parents=True)
    err = error_of(["eval", "--agent", "random", "--dataset", f"{data}/hotpotqa"], capsys)
    assert err.endswith(f"(did you mean {data}/hotpotqa_dev_distractor_1100?)"), err
    err = error_of(["eval", "--agent", "random", "--dataset", f"{data}/nq_open_oracle_265"], capsys)
    assert err.endswith(f"(did you mean {data}/nq_open_oracle_2655?)"), err
    err = error_of(["eval", "--agent", "random", "--dataset", f"{data}/squad"], capsys)
    assert "did you mean" not in err and "is neither 'world' nor an existing FlashRAG folder" in err
