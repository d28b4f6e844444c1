"""Checkpoints written by an earlier build still load: the committed fixtures (made by
``tests/agents/training/fixtures/make_checkpoints.py``) are read, their configs taken back, a GRPO run resumed from
one and a new run started from the other."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

FIXTURES = Path(__file__).with_name("fixtures")
SFT = FIXTURES / "sft-checkpoint.pt"
GRPO = FIXTURES / "grpo-checkpoint.pt"


def test_the_fixtures_load_with_their_kind_step_and_config() -> None:
    from searchgym.agents.training.checkpoint import load_checkpoint

    sft, grpo = load_checkpoint(SFT), load_checkpoint(GRPO)
    assert (sft["kind"], grpo["kind"], grpo["step"]) == ("sft", "grpo", 1)
    assert grpo["config"]["topk"] == 2 and grpo["config"]["max_context_tokens"] == 256  # the flat form


def test_the_fixtures_flat_configs_convert_to_sections() -> None:
    from searchgym.agents.grpo.config import GRPOConfig, LLDSConfig
    from searchgym.agents.training.checkpoint import peek_checkpoint
    from searchgym.agents.training.checkpoint_checks import stored_config
    from searchgym.agents.training.config import CONFIG_FORMAT

    raw = peek_checkpoint(GRPO)
    assert raw is not None and "format" not in raw["config"] and raw["config"]["llds"] == "action"  # flat
    config = stored_config(raw["config"], "grpo", GRPO)
    assert isinstance(config, GRPOConfig) and config.llds == LLDSConfig(
        gate="action", coef=raw["config"]["llds_coef"]
    )
    assert config.env.topk == raw["config"]["topk"] == 2  # the env's options become its spec
    assert config.env.max_obs_tokens is None  # a field the old config lacked: the trainers' default
    stored = config.to_dict()
    assert stored["format"] == CONFIG_FORMAT and stored["llds"]["gate"] == "action"
    assert stored["env"]["max_context_tokens"] == 256
    assert stored_config(stored, "grpo", GRPO) == config  # the sectioned form reads back the same config


FORMAT_2 = {
    "format": 2,
    "run_dir": "runs/old",
    "overwrite": False,
    "model": "org/some-model",
    "tokenizer": None,
    "init": None,
    "device": "cpu",
    "dtype": "bfloat16",
    "tiny_layers": 2,
    "tiny_hidden": 128,
    "env": {"split": "train", "topk": 2, "max_turns": 3, "max_turn_tokens": 32, "max_context_tokens": 512},
    "optim": {"lr": 1e-5, "warmup_steps": 3, "weight_decay": 0.01},
    "eval": {"split": "dev", "questions": 8, "batch": 4, "at_start": False, "every": 2},
    "seed": 7,
    "threads": 1,
    "progress": False,
    "tensorboard": False,
    "report_to": "none",
    "questions_per_step": 3,
    "group_size": 4,
    "minibatch_size": 4,
    "temperature": 0.9,
    "clip_eps": 0.25,
    "kl_coef": 0.0,
    "entropy_coef": 0.0,
    "llds": {"gate": None, "coef": 0.2, "ma": False, "ledger": False},
    "resume": False,
    "steps": 5,
    "epochs": 2,
    "precision": "fp32",
    "advantage": "mean",
    "sapo_coef": 0.1,
    "probe_size": 0,
    "onpolicy_probe_size": 0,
    "ledger_size": 10,
    "warning_window": 4,
    "save_every": 2,
    "an_option_of_another_version": 1,
}
"""A ``GRPOConfig`` as format 2 stored it: the sections env, optim, eval and llds as mappings, every other
option flat, ``"model"`` the model's name."""


def test_a_format_2_config_converts_to_sections() -> None:
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.agents.training.checkpoint_checks import stored_config
    from searchgym.agents.training.config import CONFIG_FORMAT

    config = stored_config(FORMAT_2, "grpo", "old.pt")
    assert isinstance(config, GRPOConfig)
    assert (config.model.name, config.model.dtype, config.model.precision) == (
        "org/some-model",
        "bfloat16",
        "fp32",
    )
    assert (config.run.run_dir, config.run.seed, config.run.save_every, config.run.report_to) == (
        "runs/old",
        7,
        2,
        "none",
    )
    assert (config.batch.steps, config.batch.group_size, config.batch.epochs) == (5, 4, 2)
    assert (config.loss.advantage, config.loss.clip_eps, config.loss.sapo_coef) == ("mean", 0.25, 0.1)
    assert (config.probes.ledger_size, config.probes.warning_window) == (10, 4)
    assert config.llds.gate is None and config.env.topk == 2 and config.optim.lr == 1e-5
    assert (config.eval.split, config.eval.every) == ("dev", 2)
    stored = config.to_dict()
    assert stored["format"] == CONFIG_FORMAT == 3
    assert stored["model"]["name"] == "org/some-model" and stored["batch"]["group_size"] == 4
    assert stored_config(stored, "grpo", "new.pt") == config  # format 3 reads back the same config


def test_a_format_3_section_that_is_not_a_mapping_is_refused() -> None:
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.agents.training.checkpoint_checks import stored_config
    from searchgym.errors import CheckpointError

    stored = GRPOConfig().to_dict() | {"model": "org/some-model"}
    with pytest.raises(CheckpointError, match="config section 'model' is a str, not a mapping"):
        stored_config(stored, "grpo", "new.pt")


def test_a_grpo_run_resumes_from_the_fixture(tmp_path: Path) -> None:
    from searchgym.agents.grpo.trainer import train_grpo
    from searchgym.agents.training.checkpoint import load_checkpoint
    from searchgym.agents.training.checkpoint_checks import stored_config

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copyfile(GRPO, run_dir / "checkpoint.pt")
    shutil.copyfile(FIXTURES / "grpo-run.json", run_dir / "run.json")
    saved = stored_config(load_checkpoint(GRPO)["config"], "grpo", GRPO)
    config = dataclasses.replace(saved, run_dir=str(run_dir), steps=2, resume=True)
    with pytest.warns(UserWarning, match="resuming with changed options"):
        train_grpo(config)
    resumed = load_checkpoint(run_dir / "checkpoint.pt")
    assert resumed["step"] == 2 and resumed["config"]["env"]["topk"] == 2
    before, after = load_checkpoint(GRPO)["model"], resumed["model"]
    assert all(torch.equal(before[k], after[k]) for k in before)  # the frozen control (lr 0) kept its weights


def test_a_run_starts_from_the_sft_fixture(tmp_path: Path) -> None:
    from searchgym.agents.grpo.config import GRPOConfig
    from searchgym.agents.grpo.trainer import train_grpo

    config = GRPOConfig(
        run_dir=str(tmp_path / "run"),
        init=str(SFT),
        steps=1,
        questions_per_step=2,
        group_size=2,
        probe_size=0,
        onpolicy_probe_size=0,
        ledger_size=0,
        eval_at_start=False,
        eval_questions=0,
        max_turns=2,
        max_turn_tokens=8,
        max_context_tokens=256,
        threads=1,
        progress=False,
        tensorboard=False,
    )
    metrics = train_grpo(config)
    assert "rollout/reward" in metrics
