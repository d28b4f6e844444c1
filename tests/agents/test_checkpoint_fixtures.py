"""Checkpoints written by an earlier build still load: the committed fixtures (made by
``tests/agents/fixtures/make_checkpoints.py``) are read, their configs taken back, a GRPO run resumed from
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
