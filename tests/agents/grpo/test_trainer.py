"""The GRPO trainer on the tiny model: masks, gradients, LLDS across updates, checkpoints, config."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.agents.grpo.advantages import group_advantages  # noqa: E402
from searchgym.agents.grpo.config import GRPOConfig  # noqa: E402
from searchgym.agents.grpo.trainer import GRPOTrainer, minibatch_plan  # noqa: E402
from searchgym.agents.llm import ScoringOptions  # noqa: E402
from searchgym.agents.training.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from searchgym.agents.training.config import ModelConfig, SFTConfig  # noqa: E402
from searchgym.agents.training.rollout import RolloutBatch  # noqa: E402
from searchgym.errors import CheckpointError, ConfigError  # noqa: E402
from searchgym.protocol import Source  # noqa: E402

TINY: dict[str, Any] = {
    "max_turns": 2,
    "max_turn_tokens": 8,
    "max_context_tokens": 768,
    "questions_per_step": 2,
    "group_size": 2,
    "minibatch_size": 4,
    "epochs": 1,
    "onpolicy_probe_size": 0,
    "ledger_size": 0,
}


@pytest.fixture
def tiny(grpo_config: Callable[..., GRPOConfig]) -> Callable[..., GRPOConfig]:
    """A few-second configuration: 2 questions x 2 responses, short turns (``tiny(folder, **overrides)``)."""
    return functools.partial(grpo_config, **TINY)


def rollout_with_rewards(trainer: GRPOTrainer, rewards: list[float]) -> tuple[RolloutBatch, Any]:
    """A real rollout whose rewards are replaced, so that every group has a nonzero advantage."""
    trainer.step = 1
    batch = trainer.rollout()
    batch.rewards = torch.tensor(rewards, dtype=torch.float32)
    return batch, group_advantages(batch.rewards, trainer.config.batch.group_size)


def test_tool_and_prompt_positions_get_no_gradient(tmp_path: Path, tiny: Callable[..., GRPOConfig]) -> None:
    # Shared prefixes read per row: one forward, so the hook sees all positions at once.
    trainer = GRPOTrainer(tiny(tmp_path), scoring=ScoringOptions(shared_prefix_min=0))
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


def test_every_parameter_changes_after_one_update(tmp_path: Path, tiny: Callable[..., GRPOConfig]) -> None:
    trainer = GRPOTrainer(tiny(tmp_path))
    batch, adv = rollout_with_rewards(trainer, [1.0, 0.0, 0.0, 1.0])
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    metrics = trainer.update(batch, adv)
    assert len(trainer.update_metrics) == 1 and metrics["train/skipped_updates"] == 0
    assert metrics["train/grad_norm"] > 0
    unchanged = [n for n, p in trainer.model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert unchanged == []


@pytest.mark.parametrize("gate", ["token", "action"])
def test_llds_is_zero_on_the_first_update_and_acts_on_later_ones(
    tmp_path: Path, tiny: Callable[..., GRPOConfig], gate: str
) -> None:
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


def test_vanilla_grpo_reports_llds_without_training_on_it(
    tmp_path: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    """Vanilla GRPO measures the LLDS term (action gate) on every update, and its weights end where an
    update with the term at weight 0 ends, not where training on it (lambda 0.2) ends."""
    final: dict[str, list[Any]] = {}
    for name, llds in (("vanilla", {"llds": "none"}), ("zero", {"llds_coef": 0.0}), ("llds", {})):
        trainer = GRPOTrainer(tiny(tmp_path / name, minibatch_size=2, epochs=2, kl_coef=0.0, **llds))
        batch, adv = rollout_with_rewards(trainer, [1.0, 0.0, 0.0, 1.0])
        metrics = trainer.update(batch, adv)
        final[name] = [p.detach().clone() for p in trainer.model.parameters()]
        if name == "vanilla":
            reported = [u["llds_loss"] for u in trainer.update_metrics]
            assert "train/llds_loss" in metrics and reported[0] == 0.0 and max(reported) > 0.0
    assert all(torch.equal(a, b) for a, b in zip(final["vanilla"], final["zero"], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(final["vanilla"], final["llds"], strict=True))


def test_nan_loss_skips_the_update(
    tmp_path: Path, tiny: Callable[..., GRPOConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
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


def test_train_logs_the_metric_set_and_checkpoints(tmp_path: Path, tiny: Callable[..., GRPOConfig]) -> None:
    import json

    cfg = tiny(tmp_path, steps=2, save_every=1, llds_ma=True)
    metrics = GRPOTrainer(cfg).train()
    for name in (
        "rollout/reward",
        "rollout/em",
        "rollout/searches",
        "rollout/response_length",
        "rollout/logp_correct",
        "rollout/logp_token_incorrect",
        "lld/delta_adv_pos",
        "lld/delta_adv_zero",
        "lld/delta_adv_neg",
        "lld/probe_logp",
        "lld/probe_logp_first",
        "lld/probe_logp_search",
        "lld/probe_logp_answer",
        "lld/warning",
        "train/max_abs_log_ratio",
        "train/cap_frac",
        "train/grad_norm_max",
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
    assert [x["step"] for x in lines] == [0, 1, 2]  # step 0: the initial policy's probes, always logged
    assert "lld/probe_logp" in lines[0] and "rollout/reward" not in lines[0]
    payload = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert payload["step"] == 2 and {"model", "optimizer", "scheduler", "rng"} <= set(payload)


def test_corrupted_checkpoint_is_a_clear_error(tmp_path: Path, tiny: Callable[..., GRPOConfig]) -> None:
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
        ({"minibatch_size": 3}, "must be >= 1 and divide the rollout batch"),
        ({"minibatch_size": 1}, "multiple of group_size 2 with --minibatch-plan groups"),
        ({"minibatch_plan": "random"}, "unknown minibatch_plan"),
        ({"llds_ma_schedule": "linear"}, "unknown llds_ma_schedule"),
        ({"ratio_cap": 1.1}, "ratio_cap must be > 1 \\+ clip_eps"),
        ({"kl_value_cap": 0.0}, "kl_value_cap must be > 0"),
        ({"llds": "gate"}, "unknown llds"),
        ({"llds": "none", "llds_ma": True}, "llds_ma needs an LLDS gate"),
        ({"lr": -1e-4}, "lr must be > 0"),
        ({"advantage": "rank"}, "unknown advantage"),
        ({"adam_betas": "0.9"}, "adam_betas must be two numbers"),
        ({"adam_betas": "0.9,1.0"}, "adam_betas must both be in"),
        ({"adam_eps": 0.0}, "adam_eps must be > 0"),
        ({"reward": "bleu"}, "unknown reward"),
        ({"log_gns": True}, "log_gns compares micro-batch and mini-batch gradients"),
        ({"max_gen_batches": 0}, "max_gen_batches must be >= 1"),
        ({"probe_every": 0}, "probe_every must be >= 1"),
        ({"micro_batch_size": 3}, "micro_batch_size must be >= 1 and divide"),
    ],
)
def test_config_errors_are_actionable(
    tmp_path: Path, tiny: Callable[..., GRPOConfig], overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        tiny(tmp_path, **overrides)


def test_sft_config_and_derived_values(tmp_path: Path, tiny: Callable[..., GRPOConfig]) -> None:
    cfg = tiny(tmp_path, questions_per_step=4, group_size=5, minibatch_size=10, epochs=3)
    assert cfg.batch.batch_size == 20 and cfg.batch.updates_per_step == 6 and cfg.llds.enabled
    # The reference recipe by default: one pass, one whole group per update (10 updates for 10 questions).
    default = GRPOConfig()
    assert default.batch.epochs == 1 and default.batch.minibatch_plan == "groups"
    assert (
        default.batch.minibatch_responses == default.batch.group_size and default.batch.updates_per_step == 10
    )
    loss = default.loss
    assert (loss.ratio_cap, loss.kl_value_cap, loss.entropy_coef, default.optim.weight_decay) == (
        100.0,
        10.0,
        0.001,
        0.01,
    )
    with pytest.raises(ConfigError, match="batch_size must be >= 1"):
        SFTConfig(batch_size=0)


def test_linear_lr_schedule_warms_up_then_decays_to_zero() -> None:
    from searchgym.agents.training.config import SFTConfig
    from searchgym.agents.training.run import make_optimizer

    model = torch.nn.Linear(2, 2)
    config = SFTConfig(lr=1.0, warmup_steps=2, lr_schedule="linear")
    optimizer, scheduler = make_optimizer(model, config.optim, total_updates=6)
    rates = []
    for _ in range(6):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25])
    constant, _ = make_optimizer(
        model, SFTConfig(lr=1.0, warmup_steps=0, lr_schedule="constant").optim, total_updates=6
    )
    assert constant.param_groups[0]["lr"] == 1.0
    with pytest.raises(ConfigError, match="lr_schedule"):
        SFTConfig(lr_schedule="cosine")


@pytest.mark.parametrize(("n", "group", "size", "epochs"), [(20, 5, 5, 1), (20, 5, 10, 2), (12, 4, 12, 3)])
def test_group_minibatch_plan_uses_every_trajectory_once_per_epoch_and_never_splits_a_group(
    n: int, group: int, size: int, epochs: int
) -> None:
    plan = minibatch_plan(n, group, size, epochs, "groups", torch.Generator().manual_seed(0))
    per_epoch = n // size
    assert len(plan) == epochs * per_epoch and all(len(mb) == size for mb in plan)
    for e in range(epochs):
        seen = torch.cat(plan[e * per_epoch : (e + 1) * per_epoch]).sort().values
        assert seen.tolist() == list(range(n))  # each trajectory exactly once per epoch
    for mb in plan:
        groups = (mb // group).tolist()
        for g in set(groups):
            assert groups.count(g) == group  # a group is either wholly in a mini-batch or absent
    orders = [torch.cat(plan[e * per_epoch : (e + 1) * per_epoch]).tolist() for e in range(epochs)]
    if epochs > 1:
        assert len({tuple(o) for o in orders}) > 1, "each epoch reshuffles the group order"


def test_shuffle_plan_crosses_groups_and_bad_sizes_fail() -> None:
    plan = minibatch_plan(20, 5, 4, 1, "shuffle", torch.Generator().manual_seed(0))
    assert torch.cat(plan).sort().values.tolist() == list(range(20))
    assert any(len(set((mb // 5).tolist())) > 1 for mb in plan)
    with pytest.raises(ConfigError, match="cannot cut"):
        minibatch_plan(20, 5, 4, 1, "groups", torch.Generator())
    with pytest.raises(ConfigError, match="unknown minibatch plan"):
        minibatch_plan(20, 5, 5, 1, "random", torch.Generator())


def test_a_step_that_changes_nothing_measures_zero_displacement(
    tmp_path: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    # No gradient (zero advantages, no LLDS/KL/entropy) and no weight decay: the weights stay put, and the
    # within-step displacement must then be exactly 0 (the same responses, scored with the same shapes;
    # pi_old re-scored, not the sampler's log-probs, which match a full forward only to float noise).
    cfg = tiny(
        tmp_path,
        kl_coef=0.0,
        entropy_coef=0.0,
        weight_decay=0.0,
        llds="none",
        minibatch_size=2,
        rescore_pi_old=True,
    )
    trainer = GRPOTrainer(cfg)
    batch, _ = rollout_with_rewards(trainer, [1.0, 0.0, 0.0, 1.0])
    metrics = trainer.update(batch, torch.zeros(4))
    assert metrics["lld/delta_adv_zero"] == 0.0 and metrics["lld/n_adv_zero"] == 4
    assert math.isnan(metrics["lld/delta_adv_pos"])
    metrics = trainer.update(batch, group_advantages(batch.rewards, 2))
    assert metrics["lld/n_adv_pos"] == 2 and metrics["lld/n_adv_neg"] == 2
    assert metrics["lld/delta_adv_pos"] != 0.0  # a real update moves the likelihood


def _init_checkpoint(tmp_path: Path) -> Path:
    """An SFT-style checkpoint of a tiny model whose weights differ from a fresh seed-0 model."""
    from searchgym.agents.training.policy import build_policy

    policy, arch = build_policy(ModelConfig(), weights_seed=7)
    path = tmp_path / "init.pt"
    save_checkpoint(path, {"kind": "sft", "model": policy.model.state_dict(), "arch": arch, "step": 0})
    return path


def test_resume_without_init_restores_the_original_reference(
    tmp_path: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    init = _init_checkpoint(tmp_path)
    first = GRPOTrainer(tiny(tmp_path, init=str(init), kl_coef=0.01, steps=1))
    first.train()
    assert first.ref_model is not None
    batch = first.rollout()
    reference = first._score(first.ref_model, batch, [torch.arange(len(batch))])
    resumed = GRPOTrainer(tiny(tmp_path, kl_coef=0.01, steps=2, resume=True))  # no --init
    assert resumed.ref_model is not None and resumed.step == 1
    again = resumed._score(resumed.ref_model, batch, [torch.arange(len(batch))])
    assert torch.equal(reference, again)  # bit-identical reference log-probs
    fresh = GRPOTrainer(
        tiny(tmp_path / "other", kl_coef=0.01)
    )  # a reference rebuilt from the config, not the saved one
    assert fresh.ref_model is not None
    assert not torch.equal(reference, fresh._score(fresh.ref_model, batch, [torch.arange(len(batch))]))


def test_resume_whose_init_is_gone_or_changed_is_a_clear_error(
    tmp_path: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    init = _init_checkpoint(tmp_path)
    GRPOTrainer(tiny(tmp_path, init=str(init), steps=1)).train()
    with pytest.raises(CheckpointError, match="differs from the init checkpoint"):
        GRPOTrainer(tiny(tmp_path, init=str(_init_other(tmp_path)), steps=2, resume=True))
    init.unlink()
    with pytest.raises(CheckpointError, match="which is gone: the reference model cannot be rebuilt"):
        GRPOTrainer(tiny(tmp_path, steps=2, resume=True))


def _init_other(tmp_path: Path) -> Path:
    other = tmp_path / "other.pt"
    other.write_bytes((tmp_path / "init.pt").read_bytes())
    payload = load_checkpoint(other)
    payload["step"] = 1
    save_checkpoint(other, payload)
    return other


def test_pi_old_from_the_sampler_when_rescoring_is_off(
    tmp_path: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    # Off: the sampler's cached log-probs are pi_old, so the first update's ratio is 1 only to float noise.
    trainer = GRPOTrainer(tiny(tmp_path, rescore_pi_old=False, llds="token", kl_coef=0.0))
    batch, adv = rollout_with_rewards(trainer, [1.0, 0.0, 0.0, 1.0])
    metrics = trainer.update(batch, adv)
    assert math.isnan(metrics["rollout/logp_mismatch"])  # nothing re-scored, nothing compared
    assert 0.0 < trainer.update_metrics[0]["max_abs_log_ratio"] < 1e-3
    on = GRPOTrainer(tiny(tmp_path / "on", llds="token", kl_coef=0.0))
    on.update(batch, adv)
    assert on.update_metrics[0]["max_abs_log_ratio"] == 0.0
