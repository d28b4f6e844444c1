"""stable-baselines3 on both views: check_env, the token features extractor, smoke runs, agents and the CLI."""

from __future__ import annotations

import json
import warnings
import zipfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

import torch
from stable_baselines3.common.env_checker import check_env
from stable_baselines3.common.env_util import make_vec_env

import searchgym  # noqa: F401 - registers the env ids
from searchgym.agents import MacroOracleAgent, RandomAgent, evaluate
from searchgym.agents.sb3 import (
    ALGORITHMS,
    MODEL_ENV_VAR,
    SB3Agent,
    TokenFeaturesExtractor,
    load_model,
    token_policy_kwargs,
)
from searchgym.app.cli import main
from searchgym.errors import CheckpointError, ConfigError

from .conftest import RunsCode

# Small transcripts keep the token view fast; the prompt (~170 tokens) still fits.
TOKEN_KWARGS: dict[str, Any] = {"max_context_tokens": 256, "max_turn_tokens": 16}
VIEWS: dict[str, tuple[str, dict[str, Any], str]] = {
    "macro": ("SearchQAMacro-v0", {}, "MlpPolicy"),
    "token": ("SearchQA-v0", TOKEN_KWARGS, "MultiInputPolicy"),
}
# Tiny rollouts and batches: each smoke run is a few hundred steps with several updates.
SMOKE: dict[str, dict[str, Any]] = {
    "ppo": {"n_steps": 64, "batch_size": 32, "n_epochs": 2},
    "a2c": {"n_steps": 8},
    "dqn": {"learning_starts": 50, "buffer_size": 500, "train_freq": 4, "target_update_interval": 100},
}


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_sb3_check_env_passes_on_the_registered_env(view: str) -> None:
    env_id, kwargs, _ = VIEWS[view]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(gym.make(env_id, **kwargs))


def _token_batch(lengths: list[int], size: int = 32) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(0)
    tokens = np.zeros((len(lengths), size), dtype=np.int64)
    sources = np.zeros((len(lengths), size), dtype=np.int64)
    for i, n in enumerate(lengths):
        tokens[i, :n] = rng.integers(1, 100, size=n)
        sources[i, :n] = rng.integers(1, 4, size=n)
    return {
        "tokens": torch.as_tensor(tokens, dtype=torch.float32),  # SB3 hands Box observations over as floats
        "sources": torch.as_tensor(sources, dtype=torch.float32),
        "length": torch.as_tensor(lengths, dtype=torch.float32).view(-1, 1),
    }


def test_token_extractor_reads_only_the_valid_prefix() -> None:
    space = gym.spaces.Dict(
        {
            "tokens": gym.spaces.Box(0, 99, (32,), np.int64),
            "sources": gym.spaces.Box(0, 3, (32,), np.int8),
            "length": gym.spaces.Box(0, 32, (1,), np.int64),
        }
    )
    torch.manual_seed(0)
    extractor = TokenFeaturesExtractor(space, embed_dim=8, last_k=4, features_dim=16)
    batch = _token_batch([3, 10, 32])
    out = extractor(batch)
    assert out.shape == (3, 16)
    garbage = {k: v.clone() for k, v in batch.items()}
    garbage["tokens"][0, 3:] = 7.0  # past the length: must be ignored
    garbage["sources"][1, 10:] = 2.0
    torch.testing.assert_close(extractor(garbage), out)
    changed = {k: v.clone() for k, v in batch.items()}
    changed["tokens"][1, 9] = 55.0  # the last valid token: must matter
    assert not torch.allclose(extractor(changed)[1], out[1])


def _smoke_model(algo: str, view: str, steps: int = 256) -> Any:
    env_id, kwargs, policy = VIEWS[view]
    venv = make_vec_env(env_id, n_envs=2, seed=0, env_kwargs={**kwargs, "render_mode": None})
    policy_kwargs = token_policy_kwargs(embed_dim=16, last_k=4, features_dim=32) if view == "token" else None
    model = ALGORITHMS[algo](policy, venv, seed=0, device="cpu", policy_kwargs=policy_kwargs, **SMOKE[algo])
    model.learn(steps)
    return model


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_each_algorithm_trains_then_reloads_as_the_same_policy(algo: str, view: str, tmp_path: Path) -> None:
    model = _smoke_model(algo, view)
    assert model.num_timesteps >= 256
    model.save(tmp_path / "model.zip")
    env_id, kwargs, _ = VIEWS[view]
    env = gym.make(env_id, split="test", **kwargs)
    loaded = load_model(
        tmp_path / "model.zip", env=env
    )  # no config.json: the algorithm is read from the file
    assert type(loaded) is type(model)
    obs, _ = env.reset(seed=0)
    assert np.array_equal(
        loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0]
    )
    saved, rebuilt = model.policy.state_dict(), loaded.policy.state_dict()
    assert saved.keys() == rebuilt.keys() and all(torch.equal(saved[k], rebuilt[k]) for k in saved)
    summary = evaluate(env, SB3Agent(env, loaded), episodes=2)
    assert summary.episodes == 2 and 0.0 <= summary.em <= 1.0


def test_sb3_agent_refuses_an_env_of_another_shape(tmp_path: Path) -> None:
    model = _smoke_model("a2c", "token", steps=16)
    other = gym.make("SearchQA-v0", max_context_tokens=300, max_turn_tokens=16)
    with pytest.raises(ValueError, match="observation_space"):
        SB3Agent(other, model)


def test_macro_random_floor_and_oracle_ceiling() -> None:
    env = gym.make("SearchQAMacro-v0", split="test")
    random = evaluate(env, RandomAgent(int(env.action_space.n)), episodes=40)
    oracle = evaluate(env, MacroOracleAgent(env), episodes=40)
    assert oracle.em >= 0.9  # the candidates cover the golden answers
    assert random.em < 0.2


def test_cli_trains_checkpoints_and_evaluates_through_searchgym_eval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    argv = ["train", "sb3", "--algo", "ppo", "--steps", "256", "--n-envs", "2", "--save-every", "128",
            "--eval-questions", "3", "--run-dir", str(out)]  # fmt: skip
    assert main(argv) == 0
    for name in ("config.json", "progress.csv", "model.zip", "eval.json", "eval.jsonl"):
        assert (out / name).is_file(), name
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "ppo_128_steps.zip",
        "ppo_256_steps.zip",
    ]
    assert json.loads((out / "config.json").read_text())["env_id"] == "SearchQAMacro-v0"
    assert "rollout/em" in (out / "progress.csv").read_text().splitlines()[0]
    capsys.readouterr()

    monkeypatch.setenv(MODEL_ENV_VAR, str(out / "model.zip"))
    argv = ["eval", "--env", "SearchQAMacro-v0", "--agent", "searchgym.agents.sb3:SB3Agent", "--episodes", "3",
            "--no-progress", "--json"]  # fmt: skip
    assert main(argv) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["episodes"] == 3
    assert figures["em"] == json.loads((out / "eval.json").read_text())["em"]  # same questions, greedy policy
    argv = ["eval", "--env", "SearchQAMacro-v0", "--agent", f"sb3:{out / 'model.zip'}", "--episodes", "3",
            "--no-progress", "--json"]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["em"] == figures["em"]
    # Without --env: the run's config.json says which env the model plays.
    argv = ["eval", "--agent", f"sb3:{out / 'checkpoints' / 'ppo_256_steps.zip'}", "--episodes", "3", "--no-progress",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["em"] == figures["em"]


# -- safe loading: no file is unpickled ------------------------------------------------------------------------


def _sb3_model(tmp_path: Path, policy_kwargs: dict[str, Any] | None = None) -> tuple[Path, Any]:
    env = gym.make("SearchQAMacro-v0", split="test")
    model = ALGORITHMS["ppo"](
        "MlpPolicy", env, device="cpu", n_steps=8, batch_size=8, seed=0, policy_kwargs=policy_kwargs
    )
    path = tmp_path / "model.zip"
    model.save(path)
    return path, model


def _rewrite_data(path: Path, change: Any) -> None:
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    data = json.loads(members["data"])
    change(data)
    members["data"] = json.dumps(data).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)


def _poison(data: dict[str, Any], marker: Path) -> None:
    import base64
    import pickle

    evil = base64.b64encode(pickle.dumps(RunsCode(marker))).decode()
    for value in data.values():  # every serialized field, the policy class among them
        if isinstance(value, dict) and ":serialized:" in value:
            value[":serialized:"] = evil
    data["policy_class"][":serialized:"] = evil


def test_an_sb3_zip_with_a_code_running_pickle_plays_without_running_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stable_baselines3 import PPO

    path, _ = _sb3_model(tmp_path)
    marker = tmp_path / "pwned"
    _rewrite_data(path, lambda data: _poison(data, marker))
    code = main(
        [
            "eval",
            "--env",
            "SearchQAMacro-v0",
            "--agent",
            f"sb3:{path}",
            "--episodes",
            "2",
            "--no-progress",
            "--json",
        ]
    )
    assert code == 0 and json.loads(capsys.readouterr().out)["episodes"] == 2
    assert not marker.exists()
    # The same file does run code through stable-baselines3's own loader: the input is a real exploit.
    with pytest.raises(Exception):  # noqa: B017 - what fails after the payload ran does not matter
        PPO.load(path, device="cpu")
    assert marker.read_text() == "pwned"


def test_an_sb3_model_without_an_env_needs_its_run_config(tmp_path: Path) -> None:
    path, _ = _sb3_model(tmp_path)
    with pytest.raises(ConfigError, match="pass the env"):
        load_model(path)
    (tmp_path / "config.json").write_text(
        json.dumps({"algo": "ppo", "env_id": "SearchQAMacro-v0", "env": {}})
    )
    assert type(load_model(path)).__name__ == "PPO"


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (
            lambda d: d.update(policy_kwargs={"net_arch": [10**6, 10**6]}),
            CheckpointError,
            r"at least 1,000,\d{3},\d{3},\d{3} parameters but the file stores",
        ),
        (
            lambda d: d.update(policy_kwargs={"activation_fn": "<class 'os.system'>"}),
            ConfigError,
            "names os.system",
        ),
        (
            lambda d: d.update(
                policy_kwargs={
                    ":type:": "<class 'dict'>",
                    ":serialized:": "x",
                    "optimizer_class": "<class 'builtins.eval'>",
                }
            ),
            ConfigError,
            "names builtins.eval",
        ),
        (lambda d: d.update(n_steps=int("9" * 5000)), CheckpointError, "not valid JSON"),
    ],
    ids=["net_arch bomb", "unknown activation", "serialized eval", "integer bomb"],
)
def test_crafted_sb3_data_is_a_typed_error(tmp_path: Path, change: Any, error: type, message: str) -> None:
    path, _ = _sb3_model(tmp_path)
    if "integer bomb" in message or message == "not valid JSON":
        with zipfile.ZipFile(path) as archive:
            members = {name: archive.read(name) for name in archive.namelist()}
        members["data"] = members["data"].replace(b'"n_steps": 8', b'"n_steps": ' + b"9" * 5000)
        with zipfile.ZipFile(path, "w") as archive:
            for name, content in members.items():
                archive.writestr(name, content)
    else:
        _rewrite_data(path, change)
    with pytest.raises(error, match=message):
        load_model(path, env=gym.make("SearchQAMacro-v0"))


def test_an_sb3_token_model_rebuilds_its_features_extractor(tmp_path: Path) -> None:
    env = gym.make("SearchQA-v0", max_context_tokens=256, max_turn_tokens=16)
    kwargs = token_policy_kwargs(embed_dim=8, last_k=2, features_dim=16)
    model = ALGORITHMS["ppo"](
        "MultiInputPolicy", env, device="cpu", n_steps=8, batch_size=8, policy_kwargs=kwargs
    )
    model.save(tmp_path / "model.zip")
    loaded = load_model(tmp_path / "model.zip", env=env)
    saved, rebuilt = model.policy.state_dict(), loaded.policy.state_dict()
    assert saved.keys() == rebuilt.keys() and all(torch.equal(saved[k], rebuilt[k]) for k in saved)
    with pytest.raises(ConfigError, match="observation_space differs from the env's"):
        load_model(
            tmp_path / "model.zip", env=gym.make("SearchQA-v0", max_context_tokens=300, max_turn_tokens=16)
        )


def test_train_sb3_into_an_existing_run_is_refused_without_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sb3"
    args = ["train", "sb3", "--algo", "a2c", "--steps", "16", "--eval-questions", "0", "--run-dir", str(out)]
    assert main(args) == 0
    stale = out / "checkpoints" / "a2c_999_steps.zip"  # a checkpoint of the run the folder holds
    stale.parent.mkdir(exist_ok=True)
    stale.write_bytes(b"earlier run")
    before = (out / "model.zip").read_bytes()
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--overwrite" in err
    assert (out / "model.zip").read_bytes() == before and stale.exists()  # nothing touched
    assert main([*args, "--overwrite"]) == 0
    assert not stale.exists(), "the replaced run's checkpoints must not mix with the new run's"


@pytest.mark.parametrize("payload", ["module", "this"])
def test_an_sb3_run_config_cannot_make_load_model_import_a_module(
    payload: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``env_id`` in ``config.json`` may only be a registered searchgym env id: gym.make's ``module:EnvId``
    form would import (and so run) a module named by the file."""
    import sys

    folder = tmp_path / "sg_evil_run"
    folder.mkdir()
    path, _ = _sb3_model(folder)
    marker = tmp_path / "ran"
    (folder / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    env_id = "sg_evil_run.evilmod:SearchQAMacro-v0" if payload == "module" else "this:SearchQAMacro-v0"
    (folder / "config.json").write_text(json.dumps({"algo": "ppo", "env_id": env_id, "env": {}}))
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -c` run from the folder's parent
    monkeypatch.delitem(sys.modules, "this", raising=False)
    with pytest.raises(ConfigError, match="registered searchgym env"):
        load_model(path)
    assert not marker.exists() and "sg_evil_run.evilmod" not in sys.modules
    assert "this" not in sys.modules and "Zen of Python" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"entry_point": "os:system"}, "'entry_point' is not an argument"),
        ({"dataset": ["x"]}, "'dataset' holds a list"),
        ({"retriever": "cassette:stolen.json.gz;record=bm25"}, "writes a file"),
        ({"disable_env_checker": True}, "'disable_env_checker' is not an argument"),
    ],
)
def test_an_sb3_run_config_passes_only_the_envs_own_arguments(
    env: dict[str, Any], message: str, tmp_path: Path
) -> None:
    path, _ = _sb3_model(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({"algo": "ppo", "env_id": "SearchQAMacro-v0", "env": env})
    )
    with pytest.raises(ConfigError, match=message):
        load_model(path)


# -- eval takes the env a model's run records ------------------------------------------------------------------


def _eval(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, list[str]]:
    code = main(["eval", *argv, "--episodes", "2", "--no-progress", "--json"])
    captured = capsys.readouterr()
    return code, captured.out, [line for line in captured.err.splitlines() if line.strip()]


def test_eval_plays_an_sb3_model_on_the_env_and_sizes_its_run_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = gym.make("SearchQA-v0", **TOKEN_KWARGS)
    model = ALGORITHMS["ppo"](
        "MultiInputPolicy", env, device="cpu", n_steps=8, batch_size=8, seed=0,
        policy_kwargs=token_policy_kwargs(embed_dim=8, last_k=2, features_dim=16),
    )  # fmt: skip
    (tmp_path / "token").mkdir()
    model.save(tmp_path / "token" / "model.zip")
    config = {"algo": "ppo", "env_id": "SearchQA-v0", "env": {**TOKEN_KWARGS, "split": "train"}}
    (tmp_path / "token" / "config.json").write_text(json.dumps(config))
    macro, _ = _sb3_model(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({"algo": "ppo", "env_id": "SearchQAMacro-v0", "env": {}})
    )

    code, out, err = _eval(["--agent", f"sb3:{macro}"], capsys)  # the macro env, with no --env
    assert code == 0 and json.loads(out)["episodes"] == 2, err
    # The token env at the sizes it trained with (the defaults, 1024 and 48, would not fit its spaces).
    code, out, err = _eval(["--agent", f"sb3:{tmp_path / 'token' / 'model.zip'}"], capsys)
    assert code == 0 and json.loads(out)["episodes"] == 2, err
    # An explicit --env wins, with a note when it is not the recorded one; the model's spaces then refuse it.
    code, out, err = _eval(["--env", "SearchQA-v0", "--agent", f"sb3:{macro}"], capsys)
    assert code == 2 and err[0] == (
        f"note: --env SearchQA-v0 differs from SearchQAMacro-v0, the env {tmp_path / 'config.json'} records for "
        "this model; playing SearchQA-v0"
    )
    assert "observation_space differs" in err[1] and len(err) == 2
    code, out, err = _eval(["--env", "SearchQAMacro-v0", "--agent", f"sb3:{macro}"], capsys)
    assert code == 0 and err == []
    # A folder is not a model: the message names the one inside.
    code, out, err = _eval(["--agent", f"sb3:{tmp_path / 'token'}"], capsys)
    assert code == 2 and err == [
        f"searchgym: error: {str(tmp_path / 'token')!r} is a train sb3 run folder, not a model; did you mean "
        f"{tmp_path / 'token' / 'model.zip'}?"
    ]


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        ("sg_evil_eval.evilmod:SearchQAMacro-v0", "is not a registered searchgym env"),
        (["SearchQAMacro-v0"], "is not a registered searchgym env"),
        (None, "is not a registered searchgym env"),
    ],
    ids=["module:id", "a list", "null"],
)
def test_eval_refuses_an_env_id_a_run_config_may_not_name_in_one_line(
    env_id: Any,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import sys

    folder = tmp_path / "sg_evil_eval"
    folder.mkdir()
    path, _ = _sb3_model(folder)
    marker = tmp_path / "ran"
    (folder / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (folder / "config.json").write_text(json.dumps({"algo": "ppo", "env_id": env_id, "env": {}}))
    monkeypatch.chdir(tmp_path)  # the module is importable from here, as an --agent module would be
    code, out, err = _eval(["--agent", f"sb3:{path}"], capsys)
    assert code == 2 and len(err) == 1 and message in err[0] and err[0].startswith("searchgym: error: ")
    assert not marker.exists() and "sg_evil_eval.evilmod" not in sys.modules
    (folder / "config.json").write_text("{not json")
    code, out, err = _eval(["--agent", f"sb3:{path}"], capsys)
    assert code == 2 and len(err) == 1 and "not a readable train sb3 run config" in err[0]
    code, out, err = _eval(["--env", "SearchQAMacro-v0", "--agent", f"sb3:{path}"], capsys)
    assert code == 0 and err == []  # with --env, the run config is not needed


@pytest.mark.parametrize(
    ("old", "new", "field", "value"),
    [
        ("--timesteps", "--steps", "steps", "64"),
        ("--out", "--run-dir", "run_dir", "runs/x"),
        ("--learning-rate", "--lr", "lr", "0.001"),
        ("--checkpoint-freq", "--save-every", "save_every", "32"),
        ("--eval-episodes", "--eval-questions", "eval_questions", "5"),
    ],
)
def test_train_sb3_shares_the_trainers_option_names_and_takes_the_old_ones_with_a_line(
    old: str, new: str, field: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from searchgym.app.cli import build_parser
    from searchgym.app.cli.train_sb3 import config_from_args

    configs = []
    for flag in (new, old):
        args = build_parser().parse_args(["train", "sb3", "--algo", "ppo", flag, value])
        configs.append(config_from_args(args))
        err = capsys.readouterr().err
        assert err == ("" if flag == new else f"searchgym: {old} is deprecated; use {new}\n")
    assert configs[0] == configs[1] and str(getattr(configs[0], field)) == value
    with pytest.raises(SystemExit):
        main(["train", "sb3", "--help"])
    shown = capsys.readouterr().out
    assert f"  {new} " in shown and f"  {old} " not in shown


@pytest.mark.parametrize("view", ["macro", "token"])
def test_train_sb3s_config_builds_for_either_view_and_keeps_an_explicit_size(view: str) -> None:
    """Both views give a config (the token view's own sizes merge with the env's record, never twice), and a
    size given on the command line is the one the run plays."""
    import argparse

    from searchgym.app.cli import train_sb3

    parser = argparse.ArgumentParser()
    train_sb3.add_arguments(parser)
    config = train_sb3.config_from_args(
        parser.parse_args(["--algo", "a2c", "--view", view, "--max-turn-tokens", "30"])
    )
    assert config.view == view and config.env.max_turn_tokens == 30
    assert config.env_record["max_turn_tokens"] == 30
