"""The learning study's knobs of ``train grpo``: each changes what it names (frozen control, reward,
advantage, filtered groups, Adam's betas, the noise-scale log, the logged rate, the probe cadence, SAPO)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.agents.grpo.config import GRPOConfig  # noqa: E402
from searchgym.agents.grpo.trainer import GRPOTrainer  # noqa: E402
from searchgym.agents.training.config import SFTConfig  # noqa: E402
from searchgym.agents.training.metrics import read_metrics  # noqa: E402
from searchgym.agents.training.run import EVAL_EPISODES  # noqa: E402
from searchgym.errors import ConfigError  # noqa: E402


@pytest.fixture
def tiny(tiny_grpo: Callable[..., GRPOConfig]) -> Callable[..., GRPOConfig]:
    return tiny_grpo


def weights(trainer: GRPOTrainer) -> dict[str, Any]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def test_lr_zero_is_a_frozen_control_paired_with_a_training_arm(
    tmp_path: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    frozen = GRPOTrainer(tiny(tmp_path / "frozen", lr=0.0, steps=3, entropy_coef=0.01))
    before = weights(frozen)
    frozen.train()
    assert all(torch.equal(before[n], p.detach()) for n, p in frozen.model.named_parameters())
    assert not frozen.optimizer.state, "the frozen control never steps Adam"
    history = read_metrics(frozen.run_dir)
    assert [r["train/lr"] for r in history if r["step"] > 0] == [0.0, 0.0, 0.0]
    assert all(r["train/grad_norm"] == 0.0 for r in history if r["step"] > 0)

    # Step 1 of a training arm of the same seed: the same questions and the same sampled tokens.
    arms = [GRPOTrainer(tiny(tmp_path / name, lr=lr)) for name, lr in (("f1", 0.0), ("t1", 1e-2))]
    batches = []
    for arm in arms:
        arm.step = 1
        batches.append(arm.rollout())
    a, b = batches
    assert [i["question_id"] for i in a.infos] == [i["question_id"] for i in b.infos]
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.sources, b.sources)
    trained = weights(arms[1])
    arms[1].update(b, torch.tensor([1.0, -1.0, -1.0, 1.0]))
    assert any(not torch.equal(trained[n], p.detach()) for n, p in arms[1].model.named_parameters())


def test_lr_zero_is_refused_where_it_means_nothing() -> None:
    with pytest.raises(ConfigError, match="frozen control, is a GRPO option"):
        SFTConfig(lr=0.0)


def test_reward_f1_reaches_the_env_the_evaluation_and_the_manifest(
    tmp_path: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    from searchgym.app.cli._manifest import write_config_manifest

    cfg = tiny(tmp_path, reward="f1", eval_questions=3, eval_at_start=False)
    trainer = GRPOTrainer(cfg)
    assert trainer.env.env_spec.reward == "f1"
    trainer.step = 1
    batch = trainer.rollout()
    assert batch.rewards.tolist() == pytest.approx([i["f1"] for i in batch.infos])
    trainer.evaluate()
    records = [json.loads(line) for line in (trainer.run_dir / EVAL_EPISODES).read_text().splitlines()]
    assert len(records) == 3 and all(r["reward"] == r["f1"] for r in records)
    write_config_manifest(cfg, "train grpo")
    manifest = json.loads((trainer.run_dir / "manifest.json").read_text())
    assert manifest["reward"]["metric"] == "f1"


@pytest.mark.parametrize("advantage", ["group", "mean", "sign", "greedy"])
def test_advantage_choice_reaches_the_update(
    tmp_path: Path, tiny: Callable[..., GRPOConfig], monkeypatch: pytest.MonkeyPatch, advantage: str
) -> None:
    import searchgym.agents.grpo.trainer as trainer_module

    seen: list[Any] = []
    real = trainer_module.compute_advantages

    def spy(rewards: Any, groups: Any, kind: str, *, greedy_rewards: Any = None) -> Any:
        out = real(rewards, groups, kind, greedy_rewards=greedy_rewards)
        seen.append((rewards.clone(), kind, greedy_rewards, out))
        return out

    monkeypatch.setattr(trainer_module, "compute_advantages", spy)
    GRPOTrainer(tiny(tmp_path, advantage=advantage)).train()
    rewards, kind, greedy, out = seen[0]
    assert kind == advantage
    assert (greedy is not None) == (advantage == "greedy")  # the greedy pass runs for greedy only
    if advantage == "sign":  # every response gets +1 or -1, whatever its group did
        assert torch.equal(out, 2 * rewards - 1)
    if advantage == "greedy":  # each response minus its question's greedy reward
        assert torch.equal(out, rewards - greedy.repeat_interleave(2))


def test_filter_groups_samples_more_batches_for_informative_groups(
    tmp_path: Path, tiny: Callable[..., GRPOConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = GRPOTrainer(tiny(tmp_path, filter_groups=True, max_gen_batches=3))
    real = trainer._draw
    draws: list[int] = []

    def scripted(draw: int = 0) -> Any:
        """Draw 0: no informative group; draw 1: one; draw 2: two (only one is needed)."""
        draws.append(draw)
        batch = real(draw)
        batch.rewards = torch.tensor([[0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]][draw])
        return batch

    monkeypatch.setattr(trainer, "_draw", scripted)
    trainer.step = 1
    batch, metrics = trainer.sample_step()
    assert draws == [0, 1, 2]
    assert batch.rewards.tolist() == [1.0, 0.0, 0.0, 1.0]  # draw 1's first group, then draw 2's first
    assert metrics == {
        "rollout/sampled_reward": 0.5,
        "rollout/informative_frac": 1.0,
        "rollout/gen_batches": 3.0,
    }

    # Out of draws: topped up with the first draw's uninformative groups, and the metric says so.
    trainer.config = dataclasses.replace(
        trainer.config, batch=dataclasses.replace(trainer.config.batch, max_gen_batches=1)
    )
    draws.clear()
    batch, metrics = trainer.sample_step()
    assert draws == [0] and len(batch) == 4
    assert metrics["rollout/informative_frac"] == 0.0 and metrics["rollout/gen_batches"] == 1.0


def test_adam_betas_and_eps_reach_the_optimizer(tmp_path: Path, tiny: Callable[..., GRPOConfig]) -> None:
    trainer = GRPOTrainer(tiny(tmp_path, adam_betas="0.8,0.95", adam_eps=1e-6))
    group = trainer.optimizer.param_groups[0]
    assert group["betas"] == (0.8, 0.95) and group["eps"] == 1e-6


def test_train_lr_is_the_rate_each_step_ran_at(tmp_path: Path, tiny: Callable[..., GRPOConfig]) -> None:
    cfg = tiny(tmp_path, steps=3, lr=3e-3, warmup_steps=3, warmup_start_lr=1e-3)
    GRPOTrainer(cfg).train()
    rates = [r["train/lr"] for r in read_metrics(cfg.run.run_dir) if r["step"] > 0]
    assert rates == pytest.approx([1e-3, 2e-3, 3e-3])


def test_log_gns_logs_the_noise_scale_every_step(tmp_path: Path, tiny: Callable[..., GRPOConfig]) -> None:
    cfg = tiny(tmp_path, steps=2, minibatch_size=4, micro_batch_size=2, length_buckets=False, log_gns=True)
    GRPOTrainer(cfg).train()
    steps = [r for r in read_metrics(cfg.run.run_dir) if r["step"] > 0]
    assert all("train/gns_groups" in r for r in steps)
    assert all(r["train/gns_small_groups"] == 1.0 and r["train/gns_big_groups"] == 2.0 for r in steps)


def test_probe_every_skips_the_probes_between(tmp_path: Path, tiny: Callable[..., GRPOConfig]) -> None:
    # turns long enough for the oracle to search and read (its probe transcripts answer from what it retrieved)
    cfg = tiny(tmp_path, steps=5, probe_size=2, probe_every=2, max_turns=3, max_turn_tokens=48)
    GRPOTrainer(cfg).train()
    probed = [r["step"] for r in read_metrics(cfg.run.run_dir) if "lld/probe_logp" in r]
    assert probed == [0, 1, 2, 4, 5]


def test_sapo_acts_from_the_second_update_and_splits_into_micro_batches(
    tmp_path: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    sapo = {"lr": 5e-2, "questions_per_step": 2, "minibatch_size": 2, "sapo_coef": 1.0, "sapo_threshold": 1.0}
    whole = GRPOTrainer(tiny(tmp_path / "whole", steps=1, **sapo))
    whole.train()
    first, second = whole.update_metrics
    assert first["sapo_loss"] == 0.0  # pi_old is the first update's own forward: every ratio is 1
    assert second["sapo_loss"] > 0.0 and 0.0 < second["sapo_frac"] <= 1.0
    assert read_metrics(whole.run_dir)[-1]["train/sapo_loss"] == pytest.approx(second["sapo_loss"] / 2)

    split = GRPOTrainer(tiny(tmp_path / "split", steps=1, micro_batch_size=1, length_buckets=False, **sapo))
    split.train()  # one token mean over the mini-batch's A >= 0 responses, whatever the micro-batches
    for key in ("sapo_loss", "sapo_frac", "grad_norm"):
        assert split.update_metrics[1][key] == pytest.approx(second[key], rel=1e-3), key


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sapo_coef": -0.1}, "sapo_coef must be >= 0"),
        ({"sapo_threshold": 0.0}, r"sapo_threshold must be in \(0, 1\]"),
        ({"sapo_threshold": 1.2}, r"sapo_threshold must be in \(0, 1\]"),
    ],
)
def test_sapo_options_are_validated(
    tmp_path: Path, tiny: Callable[..., GRPOConfig], options: dict[str, float], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        tiny(tmp_path, **options)


def test_llds_or_sapo_with_one_update_per_step_warns(tmp_path: Path, tiny: Callable[..., GRPOConfig]) -> None:
    with pytest.warns(UserWarning, match="one optimizer update per step"):
        tiny(tmp_path, questions_per_step=1, minibatch_size=2, llds="action")
    with pytest.warns(UserWarning, match="one optimizer update per step"):
        tiny(tmp_path, questions_per_step=1, minibatch_size=2, llds="none", sapo_coef=0.2)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny(tmp_path, questions_per_step=2, minibatch_size=2, llds="action")  # two updates: no warning
        tiny(tmp_path, questions_per_step=1, minibatch_size=2, llds="action", epochs=2)
