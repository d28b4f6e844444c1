import json
import re
import sys
from pathlib import Path

import pytest

from searchgym.cli import main


def test_eval_oracle_500_episodes_json(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "t.jsonl"
    assert (
        main(["eval", "--agent", "oracle", "--episodes", "500", "--json", "--no-progress", "--out", str(out)])
        == 0
    )
    metrics = json.loads(capsys.readouterr().out)
    assert {
        "em",
        "subem",
        "f1",
        "valid_format",
        "searches",
        "retrieval_recall",
        "tokens",
        "episodes",
        "episodes_per_s",
    } <= set(metrics)
    assert metrics["episodes"] == 500 and metrics["em"] >= 0.99
    lines = out.read_text().splitlines()
    assert len(lines) == 500 and "transcript" in json.loads(lines[0])


def test_eval_table_and_unknown_agent(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--agent", "random", "--episodes", "2", "--no-progress"]) == 0
    assert "episodes_per_s" in capsys.readouterr().out
    assert main(["eval", "--agent", "nobody", "--episodes", "1"]) == 2
    assert "unknown agent 'nobody'" in capsys.readouterr().err


def test_user_agent_class_plugs_in(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["eval", "--agent", "tests_user_agent:Echo", "--episodes", "1", "--json", "--no-progress"]) == 2
    )
    assert "cannot load agent" in capsys.readouterr().err


def test_random_and_oracle_work_on_the_macro_view(capsys: pytest.CaptureFixture[str]) -> None:
    for agent, low, high in (("random", 0.0, 0.3), ("oracle", 0.95, 1.0)):
        argv = [
            "eval",
            "--env",
            "SearchQAMacro-v0",
            "--agent",
            agent,
            "--episodes",
            "20",
            "--json",
            "--no-progress",
        ]
        assert main(argv) == 0
        em = json.loads(capsys.readouterr().out)["em"]
        assert low <= em <= high


def test_env_size_options_reach_the_env(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["eval", "--agent", "random", "--episodes", "3", "--json", "--no-progress", "--max-turn-tokens", "8",
            "--max-context-tokens", "400"]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] <= 4 * 8


def test_help_states_each_default_once(capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["demos"], ["train", "grpo"], ["eval"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "(default:" in text
        repeated = re.findall(r"\(default:[^)]*\) \(default:[^)]*\)", text)
        assert not repeated, f"searchgym {' '.join(command)} --help repeats a default: {repeated}"


def test_user_agent_module_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--agent mypkg.mymodule:MyAgent`` imports from the working directory, as ``python -m`` does."""
    package = tmp_path / "sg_cwd_agents"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "always_eos.py").write_text(
        "from searchgym.agents import Agent\n\n\n"
        "class AlwaysEos(Agent):\n"
        "    name = 'always-eos'\n\n"
        "    def __init__(self, env):\n"
        "        self.eos = env.unwrapped.tokenizer.eos_token_id\n\n"
        "    def act(self, observation, info):\n"
        "        return self.eos\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "sg_cwd_agents", raising=False)
    monkeypatch.delitem(sys.modules, "sg_cwd_agents.always_eos", raising=False)
    path_before = list(sys.path)
    try:
        argv = ["eval", "--agent", "sg_cwd_agents.always_eos:AlwaysEos", "--episodes", "2", "--json"]
        assert main([*argv, "--no-progress"]) == 0
    finally:
        for module in ("sg_cwd_agents.always_eos", "sg_cwd_agents"):
            sys.modules.pop(module, None)
    assert json.loads(capsys.readouterr().out)["episodes"] == 2
    assert sys.path == path_before  # the working directory was added for that import only
