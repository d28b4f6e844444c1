"""The GRPO trainer on the tiny model: masks, gradients, LLDS across updates, checkpoints, config."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.agents.grpo.checkpoint import CheckpointError, load_checkpoint, save_checkpoint  # noqa: E402
from searchgym.agents.grpo.config import GRPOConfig, SFTConfig  # noqa: E402
from searchgym.agents.grpo.losses import group_advantages  # noqa: E402
from searchgym.agents.grpo.rollout import RolloutBatch  # noqa: E402
from searchgym.agents.grpo.trainer import GRPOTrainer  # noqa: E402
from searchgym.envs.episode import Source  # noqa: E402
from searchgym.errors import ConfigError  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(tmp_path: Path, **overrides: Any) -> GRPOConfig:
    """A few-second configuration: 2 questions x 2 responses, short turns, no evaluation."""
    values: dict[str, Any] = {
        "run_dir": str(tmp_path / "run"),
        "max_turns": 2,
        "max_turn_tokens": 8,
        "max_context_tokens": 768,
        "steps": 1,
        "questions_per_step": 2,
        "group_size": 2,
        "minibatch_size": 4,
        "epochs": 1,
        "eval_questions": 0,
        "progress": False,
        "tensorboard": False,
        "lr": 1e-2,
    }
    return GRPOConfig(**{**values, **overrides})


def rollout_with_rewards(trainer: GRPOTrainer, rewards: list[float]) -> tuple[RolloutBatch, Any]:
    """A real rollout whose rewards are replaced, so that every group has a nonzero advantage."""
    trainer.step = 1
    batch = trainer.rollout()
    batch.rewards = torch.tensor(rewards, dtype=torch.float32)
    return batch, group_advantages(batch.rewards, trainer.config.group_size)


def test_tool_and_prompt_positions_get_no_gradient(tmp_path: Path) -> None:
    trainer = GRPOTrainer(tiny(tmp_path))
    batch, adv = rollout_with_rewards(trainer, [1.0, 0.0, 0.0, 1.0])
    assert (batch.sources == Source.TOOL).any(), "the transcripts should hold tool text (corrective messages)"
    captured: dict[str, Any] = {}

    def keep(_module: Any, _inputs: Any, output: Any) -> None:
        output.retain_grad()
        captured["hidden"] = output

    # The final hidden state at t-1 feeds only the prediction of token t: its gradient is that token's.
    handle = trainer.model.model.norm.register_forward_hook(keep)
    loss, _ = trainer.loss(batch, adv, batch.logp_old, None, None)
    handle.remove()
    loss.backward()
    grad = captured["hidden"].grad.abs().sum(-1)  # (B, T)
    predicted = torch.zeros_like(batch.loss_mask)
    predicted[:, :-1] = batch.loss_mask[:, 1:]  # position t-1 predicts a policy token t
    assert grad[~predicted].abs().max() == 0.0
    assert (grad[predicted] > 0).float().mean() > 0.9


def test_every_parameter_changes_after_one_update(tmp_path: Path) -> None:
    trainer = GRPOTrainer(tiny(tmp_path))
    batch, adv = rollout_with_rewards(trainer, [1.0, 0.0, 0.0, 1.0])
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    metrics = trainer.update(batch, adv)
    assert len(trainer.update_metrics) == 1 and metrics["train/skipped_updates"] == 0
    assert metrics["train/grad_norm"] > 0
    unchanged = [n for n, p in trainer.model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert unchanged == []


@pytest.mark.parametrize("gate", ["token", "action"])
def test_llds_is_zero_on_the_first_update_and_acts_on_later_ones(tmp_path: Path, gate: str) -> None:
    trainer = GRPOTrainer(tiny(tmp_path, llds=gate, minibatch_size=2, epochs=2, kl_coef=0.0))
    batch, adv = rollout_with_rewards(trainer, [1.0, 0.0, 0.0, 1.0])
    trainer.update(batch, adv)
    updates = trainer.update_metrics
    assert len(updates) == 4
    assert updates[0]["llds_loss"] == 0.0 and updates[0]["llds_lost_frac"] == 0.0
    later = updates[1:]
    if gate == "token":  # no gate: non-zero exactly when some preserved token lost likelihood
        assert all((u["llds_loss"] > 0) == (u["llds_lost_frac"] > 0) for u in later)
    assert any(u["llds_loss"] > 0 for u in later)


def test_vanilla_grpo_reports_llds_without_training_on_it(tmp_path: Path) -> None:
    trainer = GRPOTrainer(tiny(tmp_path, llds="none", minibatch_size=2, epochs=2, kl_coef=0.0))
    batch, adv = rollout_with_rewards(trainer, [1.0, 0.0, 0.0, 1.0])
    metrics = trainer.update(batch, adv)
    assert "train/llds_loss" in metrics and trainer.update_metrics[0]["llds_loss"] == 0.0


def test_nan_loss_skips_the_update(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = GRPOTrainer(tiny(tmp_path))
    batch, adv = rollout_with_rewards(trainer, [1.0, 0.0, 0.0, 1.0])
    real = trainer.loss

    def poisoned(*args: Any, **kwargs: Any) -> Any:
        loss, metrics = real(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(trainer, "loss", poisoned)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    metrics = trainer.update(batch, adv)
    assert metrics["train/skipped_updates"] == 1
    assert all(torch.equal(a, p.detach()) for a, p in zip(before, trainer.model.parameters(), strict=True))


def test_train_logs_the_metric_set_and_checkpoints(tmp_path: Path) -> None:
    import json

    cfg = tiny(tmp_path, steps=2, save_every=1, llds_ma=True)
    metrics = GRPOTrainer(cfg).train()
    for name in (
        "rollout/reward",
        "rollout/em",
        "rollout/searches",
        "rollout/response_length",
        "lld/logp_correct",
        "lld/logp_incorrect",
        "lld/logp_token_correct",
        "lld/displacement",
        "train/entropy",
        "train/grad_norm",
        "train/clip_frac",
        "train/kl",
        "train/llds_loss",
        "train/llds_gate_open",
        "train/llds_ma_beta",
    ):
        assert name in metrics, name
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    payload = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert payload["step"] == 2 and {"model", "optimizer", "scheduler", "rng"} <= set(payload)


def test_corrupted_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "run" / "checkpoint.pt"
    path.parent.mkdir()
    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="corrupted"):
        GRPOTrainer(tiny(tmp_path, resume=True))
    save_checkpoint(path, {"kind": "grpo", "step": 1})
    path.write_bytes(path.read_bytes()[:40])  # truncated mid-write by something other than us
    with pytest.raises(CheckpointError, match="corrupted"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"group_size": 1}, "group_size must be >= 2"),
        ({"minibatch_size": 3}, "must divide the rollout batch"),
        ({"llds": "gate"}, "unknown llds"),
        ({"llds": "none", "llds_ma": True}, "llds_ma needs an LLDS gate"),
        ({"lr": 0.0}, "lr must be > 0"),
        ({"micro_batch_size": 3}, "micro_batch_size must be >= 1 and divide"),
    ],
)
def test_config_errors_are_actionable(tmp_path: Path, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tiny(tmp_path, **overrides)


def test_sft_config_and_derived_values(tmp_path: Path) -> None:
    cfg = tiny(tmp_path, questions_per_step=4, group_size=5, minibatch_size=10, epochs=3)
    assert cfg.batch_size == 20 and cfg.updates_per_step == 6 and cfg.llds_enabled
    with pytest.raises(ConfigError, match="batch_size must be >= 1"):
        SFTConfig(batch_size=0)


def test_linear_lr_schedule_warms_up_then_decays_to_zero() -> None:
    from searchgym.agents.grpo.config import SFTConfig
    from searchgym.agents.grpo.runtime import make_optimizer

    model = torch.nn.Linear(2, 2)
    config = SFTConfig(lr=1.0, warmup_steps=2, lr_schedule="linear")
    optimizer, scheduler = make_optimizer(model, config, total_updates=6)
    rates = []
    for _ in range(6):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25])
    constant, _ = make_optimizer(
        model, SFTConfig(lr=1.0, warmup_steps=0, lr_schedule="constant"), total_updates=6
    )
    assert constant.param_groups[0]["lr"] == 1.0
    with pytest.raises(ConfigError, match="lr_schedule"):
        SFTConfig(lr_schedule="cosine")  # type: ignore[arg-type]
