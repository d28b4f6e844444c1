"""``train grpo --advantage greedy``: each step plays its questions greedily, and a response's advantage is its
reward minus the greedy reward of its question (the self-critical baseline of SCST)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.agents.grpo.config import GRPOConfig  # noqa: E402
from searchgym.agents.grpo.trainer import GRPOTrainer  # noqa: E402
from searchgym.agents.llm import LLMPolicy  # noqa: E402
from searchgym.agents.training.metrics import read_metrics  # noqa: E402
from searchgym.agents.training.rollout import RolloutBatch, collect_rollouts  # noqa: E402
from searchgym.envs.vector import SearchQAVectorEnv  # noqa: E402
from searchgym.errors import ConfigError  # noqa: E402

SIZES: dict[str, Any] = {
    "tiny_layers": 1,
    "tiny_hidden": 32,
    "max_turns": 1,
    "max_turn_tokens": 4,
    "max_context_tokens": 768,
    "questions_per_step": 2,
    "group_size": 2,
    "minibatch_size": 2,
    "probe_size": 0,
    "onpolicy_probe_size": 0,
    "ledger_size": 0,
    "kl_coef": 0.0,
    "save_every": 0,
}


@pytest.fixture
def tiny(grpo_config: Callable[..., GRPOConfig]) -> Callable[..., GRPOConfig]:
    return functools.partial(grpo_config, **SIZES)


def question_ids(batch: RolloutBatch, group_size: int) -> list[str]:
    """The question of each group, in group order."""
    return [str(batch.infos[g]["question_id"]) for g in range(0, len(batch), group_size)]


class DirectionReward(GRPOTrainer):
    """The trainer with a reward a random tiny model earns about half the time (the env's EM is always 0
    for it): 1 when a response's first token lies on the positive side of a fixed random direction of the
    output-embedding space. Sampled and greedy episodes are scored alike; everything else is the real
    trainer. Records each step's greedy episodes and the advantages its update received."""

    def __init__(self, config: GRPOConfig) -> None:
        super().__init__(config)
        embeddings = self.model.get_output_embeddings().weight.detach()
        direction = torch.randn(embeddings.shape[1], generator=torch.Generator().manual_seed(0))
        self.rewarded = embeddings @ direction > 0
        self.greedy_batches: list[RolloutBatch] = []
        self.updates: list[tuple[RolloutBatch, Any]] = []

    def _rescore(self, batch: RolloutBatch) -> RolloutBatch:
        first = batch.loss_mask.float().argmax(dim=1)  # each response's first policy token
        batch.rewards = self.rewarded[batch.tokens[torch.arange(len(batch)), first]].float()
        return batch

    def _draw(self, draw: int = 0) -> RolloutBatch:
        return self._rescore(super()._draw(draw))

    def greedy_play(self, batch: RolloutBatch) -> RolloutBatch:
        played = self._rescore(super().greedy_play(batch))
        self.greedy_batches.append(played)
        return played

    def update(self, batch: RolloutBatch, advantages: Any) -> dict[str, float]:
        self.updates.append((batch, advantages.clone()))
        return super().update(batch, advantages)


def test_greedy_advantage_is_the_reward_minus_the_greedy_reward_of_the_question(
    tmp_path: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    trainer = DirectionReward(tiny(tmp_path, advantage="greedy", questions_per_step=4, steps=2))
    trainer.train()
    history = [r for r in read_metrics(trainer.run_dir) if r["step"] > 0]
    assert len(trainer.updates) == len(trainer.greedy_batches) == len(history) == 2
    signs: set[float] = set()
    for (batch, advantages), greedy, logged in zip(
        trainer.updates, trainer.greedy_batches, history, strict=True
    ):
        # One greedy episode per group, on the group's question, in group order.
        assert question_ids(greedy, 1) == question_ids(batch, 2) and len(greedy) == 4
        expected = batch.rewards - greedy.rewards.repeat_interleave(2)
        assert torch.equal(advantages, expected)
        signs |= set(torch.sign(advantages).tolist())
        assert logged["rollout/greedy_reward"] == pytest.approx(float(greedy.rewards.mean()))
        beats = float((batch.rewards > greedy.rewards.repeat_interleave(2)).float().mean())
        assert logged["rollout/beats_greedy_frac"] == pytest.approx(beats)
        assert logged["rollout/adv_abs"] == pytest.approx(float(expected.abs().mean()))
        assert logged["time/greedy_s"] > 0
        parts = logged["time/rollout_s"] + logged["time/greedy_s"] + logged["time/update_s"]
        assert logged["time/step_s"] >= parts
    assert signs == {-1.0, 0.0, 1.0}, "the seed's steps exercise both directions and ties"


def test_greedy_play_plays_the_assembled_batch_argmax_without_touching_the_sampling_streams(
    tmp_path: Path, tiny: Callable[..., GRPOConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = GRPOTrainer(tiny(tmp_path, advantage="greedy", filter_groups=True, max_gen_batches=3))
    real = trainer._draw

    def scripted(draw: int = 0) -> RolloutBatch:
        """Draw 0: no informative group; draws 1 and 2: one each (their first group)."""
        batch = real(draw)
        batch.rewards = torch.tensor([[0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]][draw])
        return batch

    monkeypatch.setattr(trainer, "_draw", scripted)
    trainer.step = 1
    draws = [scripted(d) for d in range(3)]
    batch, metrics = trainer.sample_step()
    assert metrics["rollout/gen_batches"] == 3.0
    wanted = [question_ids(draws[1], 2)[0], question_ids(draws[2], 2)[0]]
    assert question_ids(batch, 2) == wanted

    sampler = trainer.policy._generator.get_state()
    global_rng = torch.get_rng_state()
    seen: list[tuple[bool, bool]] = []  # (grad enabled, training mode) of each forward of the greedy pass
    hook = trainer.model.register_forward_hook(
        lambda module, _inputs, _output: seen.append((torch.is_grad_enabled(), module.training))
    )
    trainer.model.train()
    try:
        greedy = trainer.greedy_play(batch)
    finally:
        hook.remove()
    assert seen and not any(grad or training for grad, training in seen)
    assert trainer.model.training, "the model's mode comes back"
    assert torch.equal(trainer.policy._generator.get_state(), sampler)
    assert torch.equal(torch.get_rng_state(), global_rng)
    assert question_ids(greedy, 1) == wanted and greedy.rewards.shape == (2,)

    # Argmax decoding: a fresh greedy policy in a fresh env plays the same transcripts.
    cfg = trainer.config
    env = SearchQAVectorEnv(2, cfg.env, autoreset_mode="Disabled", tokenizer=trainer.policy.tokenizer)
    try:
        policy = LLMPolicy(
            trainer.model, trainer.policy.tokenizer, greedy=True, max_turn_tokens=cfg.env.max_turn_tokens
        )
        again = collect_rollouts(env, policy, seed=0, group_size=1, question_ids=wanted)
    finally:
        env.close()
        trainer.greedy.close()
        trainer.env.close()
    assert torch.equal(again.tokens, greedy.tokens) and torch.equal(again.rewards, greedy.rewards)


def test_the_greedy_pass_leaves_the_sampled_batches_of_a_seed_unchanged(
    tmp_path: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    def sampled(name: str, advantage: str, **values: Any) -> list[RolloutBatch]:
        trainer = GRPOTrainer(tiny(tmp_path / name, advantage=advantage, steps=2, **values))
        batches: list[RolloutBatch] = []
        real = trainer.sample_step

        def keep() -> tuple[RolloutBatch, dict[str, float]]:
            batch, metrics = real()
            batches.append(batch)
            return batch, metrics

        trainer.sample_step = keep  # type: ignore[method-assign]
        trainer.train()
        return batches

    # Training arms: step 1's sampled batch is the same (the step's first draw, before any update).
    group, greedy = sampled("group", "group"), sampled("greedy", "greedy")
    assert question_ids(group[0], 2) == question_ids(greedy[0], 2)
    assert torch.equal(group[0].tokens, greedy[0].tokens) and torch.equal(
        group[0].logp_old, greedy[0].logp_old
    )
    # Frozen controls (equal weights throughout): every step's batch is, so the greedy pass moved no stream.
    group, greedy = sampled("group0", "group", lr=0.0), sampled("greedy0", "greedy", lr=0.0)
    for a, b in zip(group, greedy, strict=True):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logp_old, b.logp_old)


def test_gns_benchmark_refuses_the_greedy_advantage_in_one_line(
    tmp_path: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    from searchgym.app.bench.gns import run_gns_benchmark

    with pytest.raises(ConfigError, match="advantage 'greedy' needs greedy_rewards") as caught:
        run_gns_benchmark(tiny(tmp_path, advantage="greedy"), groups=2)
    assert "\n" not in str(caught.value)


def test_a_greedy_run_checkpoints_and_resumes_and_keeps_its_advantage(
    tmp_path: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    from searchgym.agents.training.checkpoint import load_checkpoint

    GRPOTrainer(tiny(tmp_path, advantage="greedy", save_every=1)).train()
    payload = load_checkpoint(tmp_path / "run" / "checkpoint.pt")  # its saved config passes check_config
    assert payload["config"]["loss"]["advantage"] == "greedy"
    GRPOTrainer(tiny(tmp_path, advantage="greedy", steps=2, resume=True)).train()
    last = read_metrics(tmp_path / "run")[-1]
    assert last["step"] == 2 and "rollout/greedy_reward" in last and last["time/greedy_s"] > 0
    with pytest.raises(ConfigError, match="--advantage: saved 'greedy', now 'group'"):
        GRPOTrainer(tiny(tmp_path, advantage="group", steps=3, resume=True))
