import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from searchgym.app.cli import main


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


# -- --episodes, and more episodes than questions --------------------------------------------------------------


@pytest.mark.parametrize(
    "command", ["eval --agent oracle", "demos --out d.jsonl", "export-trajectories --out t.jsonl"]
)
@pytest.mark.parametrize("episodes", ["0", "-5"])
def test_episodes_below_one_is_a_usage_error(
    command: str, episodes: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*command.split(), "--episodes", episodes])
    assert exit_info.value.code == 2
    assert f"--episodes: must be >= 1, got {episodes}" in capsys.readouterr().err


def test_more_episodes_than_questions_says_so_and_reports_distinct_questions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(
            [
                "eval",
                "--agent",
                "oracle",
                "--split",
                "validation",
                "--episodes",
                "1100",
                "--json",
                "--no-progress",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    figures = json.loads(captured.out)
    assert figures["episodes"] == 1100 and figures["questions"] == 500
    assert "1100 episodes over the 500 questions of split 'validation'" in captured.err
    assert "2 or 3 times" in captured.err
    assert main(["eval", "--agent", "oracle", "--episodes", "20", "--json", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["questions"] == 20 and "note:" not in captured.err


def test_demos_beyond_the_split_say_that_questions_repeat(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from searchgym.agents.demonstrations import read_demonstrations

    out = tmp_path / "d.jsonl"
    argv = ["demos", "--split", "validation", "--out", str(out)]
    assert main([*argv, "--episodes", "502"]) == 0
    err = capsys.readouterr().err
    assert "502 episodes over the 500 questions of split 'validation'" in err and "1 or 2 times" in err
    demos = read_demonstrations(out)
    assert len(demos) == 502 and demos[500].question_id == demos[0].question_id
    assert main([*argv, "--episodes", "500"]) == 0
    assert "note:" not in capsys.readouterr().err


def test_demos_count_each_teacher_and_refuse_an_unknown_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d.jsonl"
    argv = ["demos", "--split", "train", "--episodes", "40", "--out", str(out)]
    assert main([*argv, "--demonstrator", "shortcut"]) == 0
    line = capsys.readouterr().out
    shortcut = int(re.search(r"shortcut (\d+) \(0 rewarded\)", line).group(1))  # type: ignore[union-attr]
    oracle = int(re.search(r"oracle (\d+) \(", line).group(1))  # type: ignore[union-attr]
    assert shortcut > 0 and shortcut + oracle == 40
    out.unlink()
    assert main([*argv, "--demonstrator", "mix:oracle=1,wizard=2"]) == 2
    assert "wizard" in capsys.readouterr().err and not out.exists()


def test_eval_help_lists_every_agent_form(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    agent_help = capsys.readouterr().out.split("--agent AGENT", 2)[-1].split("--episodes")[0]
    words = " ".join(agent_help.split())
    for form in ("random", "oracle", "heuristic", "checkpoint:PATH", "sb3:PATH", "package.module:Class"):
        assert form in words


# -- --out never loses a file ----------------------------------------------------------------------------------


def test_failed_eval_keeps_the_earlier_out_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "crashing_agent.py").write_text(
        "from searchgym.agents.base import Agent\n"
        "class Crash(Agent):\n"
        "    def __init__(self, env): pass\n"
        "    def act(self, observation, info):\n"
        "        raise RuntimeError('agent bug')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "results.jsonl"
    earlier = "".join(json.dumps({"episode": i}) + "\n" for i in range(2932))
    out.write_text(earlier)
    with pytest.raises(RuntimeError, match="agent bug"):
        main(
            ["eval", "--agent", "crashing_agent:Crash", "--episodes", "3", "--no-progress", "--out", str(out)]
        )
    assert out.read_text() == earlier
    assert (
        main(["eval", "--agent", "oracle", "--episodes", "3", "--no-progress", "--json", "--out", str(out)])
        == 0
    )
    assert len(out.read_text().splitlines()) == 3 and not Path(f"{out}.partial").exists()


def test_failed_demos_keep_the_earlier_out_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from searchgym.agents import scripted

    out = tmp_path / "demos.jsonl"
    out.write_text('{"kept": true}\n')

    def crash(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("oracle bug")

    monkeypatch.setattr(scripted.OracleAgent, "act", crash)
    with pytest.raises(RuntimeError, match="oracle bug"):
        main(["demos", "--episodes", "2", "--out", str(out)])
    assert out.read_text() == '{"kept": true}\n'


def test_two_concurrent_eval_out_runs_lose_no_transcripts(tmp_path: Path) -> None:
    out = tmp_path / "transcripts.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "searchgym.app.cli", "eval", "--env", "SearchQAMacro-v0", "--agent", "random",
            "--episodes", "60", "--no-progress", "--out", str(out)]  # fmt: skip
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(p.wait(timeout=600), p.stderr.read() if p.stderr else "") for p in procs]
    for code, err in results:
        assert code == 0 or "another run is writing" in err, err[-2000:]
    assert any(code == 0 for code, _ in results)
    lines = out.read_text().splitlines()
    assert len(lines) == 60 and all(json.loads(line) for line in lines)


# -- checkpoint upgrade ----------------------------------------------------------------------------------------


def test_upgrade_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    from searchgym.agents.training.checkpoint import load_checkpoint

    old = tmp_path / "v1.pt"
    torch.save(
        {
            "format": "searchgym-checkpoint-v1",
            "kind": "sft",
            "step": 1,
            "rng": {"numpy": np.random.get_state()},
        },
        old,
    )
    assert main(["checkpoint", "upgrade", str(old), str(tmp_path / "new.pt")]) == 0
    assert load_checkpoint(tmp_path / "new.pt")["kind"] == "sft"
    assert f"wrote {tmp_path / 'new.pt'}" in capsys.readouterr().out
    assert main(["checkpoint", "upgrade", str(tmp_path / "new.pt"), str(tmp_path / "v3.pt")]) == 2
    assert "not a legacy searchgym checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["os:system", "builtins:exec", "searchgym.app.cli._common:load_agent"])
def test_an_agent_target_that_is_not_a_class_is_one_line(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", "--agent", target, "--episodes", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a class" in err and target in err


def test_an_agent_class_without_act_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "sg_no_act_agent.py").write_text("class Agent:\n    def __init__(self, env):\n        pass\n")
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--agent", "sg_no_act_agent:Agent", "--episodes", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no act" in err
