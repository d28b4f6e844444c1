"""How ``--agent`` builds an agent: one rule for the built-in names and a user's class, a clear line for a class
that does not follow it or a run folder given for a model, and tables that name the agent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchgym.app.cli import main
from searchgym.app.cli._agent_options import agent_label, agent_labels

USER_AGENTS = """
from searchgym.agents import Agent, HeuristicAgent


class MyHeuristic(HeuristicAgent):  # its own constructor: built as MyHeuristic(env), not by from_env
    name = "my-heuristic"

    def __init__(self, env):
        super().__init__(env.unwrapped.tokenizer)


class Named(Agent):
    name = "echo-bot"

    def __init__(self, env):
        self.eos = int(env.unwrapped.tokenizer.eos_token_id or 0)

    def act(self, observation, info):
        return self.eos


class Unnamed(Named):
    name = None


class Seeded:  # not an Agent subclass: built as Seeded(env, seed=SEED) all the same
    seeds = []

    def __init__(self, env, seed=0):
        Seeded.seeds.append(seed)
        self.eos = int(env.unwrapped.tokenizer.eos_token_id or 0)

    def reset(self, info, seed=None):
        pass

    def act(self, observation, info):
        return self.eos


class NoEnv(Agent):
    def __init__(self):
        pass

    def act(self, observation, info):
        return 0


class MoreArguments:
    def __init__(self, env, tokenizer):
        pass

    def act(self, observation, info):
        return 0
"""


@pytest.fixture
def user_agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "sg_rule_agents.py").write_text(USER_AGENTS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(__import__("sys").modules, "sg_rule_agents", raising=False)
    return "sg_rule_agents"


def _eval(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["eval", *argv, "--episodes", "3", "--no-progress"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("cls", "signature"),
    [("NoEnv", "NoEnv.__init__()"), ("MoreArguments", "MoreArguments.__init__(env, tokenizer)")],
)
def test_a_class_that_cannot_take_the_env_is_one_line_naming_the_signature(
    cls: str, signature: str, user_agents: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _eval(capsys, "--agent", f"{user_agents}:{cls}")
    assert code == 2 and err.count("\n") == 1, err
    assert f"--agent {user_agents}:{cls}: {signature} cannot be called with the env" in err
    assert "give it def __init__(self, env)" in err and "Traceback" not in err


def test_builtin_agents_are_built_by_the_rule_user_classes_follow(capsys: pytest.CaptureFixture[str]) -> None:
    """``heuristic`` and ``searchgym.agents:HeuristicAgent`` are one agent, built the same way; so are
    ``random`` and ``searchgym.agents:RandomAgent`` (both given the command's seed)."""
    for name, cls in (("heuristic", "HeuristicAgent"), ("random", "RandomAgent")):
        figures = []
        for spec in (name, f"searchgym.agents:{cls}"):
            code, out, err = _eval(capsys, "--agent", spec, "--seed", "5", "--json")
            assert code == 0, err
            figures.append({k: v for k, v in json.loads(out).items() if k != "episodes_per_s"})
        assert figures[0] == figures[1], name


def test_a_subclass_with_its_own_constructor_is_built_by_it(
    user_agents: str, capsys: pytest.CaptureFixture[str]
) -> None:
    figures = []
    for spec in ("heuristic", f"{user_agents}:MyHeuristic"):
        code, out, err = _eval(capsys, "--agent", spec, "--json")
        assert code == 0, err
        figures.append({k: v for k, v in json.loads(out).items() if k != "episodes_per_s"})
    assert figures[0] == figures[1]


def test_a_class_with_a_seed_parameter_is_given_the_seed(
    user_agents: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    assert _eval(capsys, "--agent", f"{user_agents}:Seeded", "--seed", "7")[0] == 0
    assert sys.modules[user_agents].Seeded.seeds == [7]


def test_the_eval_table_names_the_agent(user_agents: str, capsys: pytest.CaptureFixture[str]) -> None:
    for spec, label in (
        (f"{user_agents}:Named", "echo-bot"),
        (f"{user_agents}:Unnamed", "Unnamed"),
        ("searchgym.agents:HeuristicAgent", "heuristic"),
    ):
        code, out, err = _eval(capsys, "--agent", spec)
        assert code == 0, err
        row = out.splitlines()[2].split()
        assert row[0] == label and spec not in out


def test_labels_are_names_and_unique(user_agents: str) -> None:
    specs = [f"{user_agents}:Named", "heuristic", "checkpoint:runs/a/checkpoint.pt", "sb3:runs/b/model.zip"]
    assert agent_labels(specs) == {
        f"{user_agents}:Named": "echo-bot",
        "heuristic": "heuristic",
        "checkpoint:runs/a/checkpoint.pt": "checkpoint:runs/a/checkpoint.pt",  # a trained model: its path
        "sb3:runs/b/model.zip": "sb3:runs/b/model.zip",
    }
    # Two classes of one name are told apart by their specs.
    twins = [f"{user_agents}:Named", "searchgym.agents:HeuristicAgent", "heuristic"]
    assert agent_labels(twins) == {
        f"{user_agents}:Named": "echo-bot",
        "searchgym.agents:HeuristicAgent": "searchgym.agents:HeuristicAgent",
        "heuristic": "heuristic",
    }
    assert agent_label("nosuchmodule_sg:Agent") == "nosuchmodule_sg:Agent"


@pytest.mark.parametrize("inside", ["checkpoint.pt", "model/config.json"])
def test_checkpoint_of_a_run_folder_names_the_model_inside(
    inside: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    run = tmp_path / "runs" / "sft"
    (run / inside).parent.mkdir(parents=True, exist_ok=True)
    (run / inside).write_text("{}")
    (run / "metrics.jsonl").write_text("")
    code, _, err = _eval(capsys, "--agent", f"checkpoint:{run}")
    target = run / inside.split("/")[0]
    assert code == 2 and err.strip().splitlines() == [
        f"searchgym: error: --agent checkpoint:{run} names a run folder, not a model; did you mean "
        f"checkpoint:{target}?"
    ]
    from searchgym.agents.training.export import load_policy
    from searchgym.errors import ConfigError

    with pytest.raises(ConfigError, match=f"did you mean {target}"):
        load_policy(run)
