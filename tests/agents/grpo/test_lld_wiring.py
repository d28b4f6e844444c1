"""The trainer's wiring of the LLD diagnostics and of the new controls, on a tiny model and a fixed batch.

Each test here fails when one specific wiring mistake is made in :class:`GRPOTrainer` (named in its
docstring), not only when a pure function is wrong: the pure functions have their own tests.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import searchgym.agents.grpo.trainer as trainer_module  # noqa: E402
from searchgym.agents.grpo.advantages import group_advantages  # noqa: E402
from searchgym.agents.grpo.config import GRPOConfig  # noqa: E402
from searchgym.agents.grpo.displacement import displacement_by_advantage  # noqa: E402
from searchgym.agents.grpo.losses import adaptive_answer_weight, answer_weights, masked_mean  # noqa: E402
from searchgym.agents.grpo.spans import answer_span_mask  # noqa: E402
from searchgym.agents.grpo.trainer import GRPOTrainer  # noqa: E402
from searchgym.agents.llm import token_logprobs  # noqa: E402
from searchgym.agents.training.rollout import RolloutBatch, pad_transcripts  # noqa: E402

SIZES: dict[str, Any] = {
    "max_turns": 4,
    "max_turn_tokens": 48,
    "max_context_tokens": 1024,
    "questions_per_step": 3,
    "group_size": 2,
    "minibatch_size": 2,
    "probe_size": 0,
    "onpolicy_probe_size": 0,
    "ledger_size": 0,
    "kl_coef": 0.0,
    "entropy_coef": 0.0,
}


@pytest.fixture
def config(grpo_config: Callable[..., GRPOConfig]) -> Callable[..., GRPOConfig]:
    """3 questions x G 2, mini-batches of one group (3 updates a step), no probes (``config(folder, **overrides)``)."""
    return functools.partial(grpo_config, **SIZES)


_DEMOS: dict[int, list[Any]] = {}


def oracle_batch(
    trainer: GRPOTrainer, rewards: list[float], searches: list[int] | None = None
) -> RolloutBatch:
    """A batch of oracle transcripts (they search, read and answer) with the given rewards and searches."""
    import gymnasium as gym

    import searchgym  # noqa: F401
    from searchgym.agents.demonstrations import generate_demonstrations

    n = len(rewards)
    if n not in _DEMOS:
        cfg = trainer.config
        env = gym.make("SearchQA-v0", spec=cfg.env, tokenizer=trainer.policy.tokenizer)
        _DEMOS[n] = list(generate_demonstrations(env, n, seed=0))
        env.close()
    demos = _DEMOS[n]
    tokens, mask, sources = pad_transcripts(
        [d.tokens for d in demos], [d.sources for d in demos], trainer.policy.tokenizer.pad_token_id
    )
    searches = searches if searches is not None else [1] * n
    infos = [
        {
            "em": r,
            "f1": r,
            "searches": s,
            "end_reason": "answered",
            "policy_tokens": int((src == 2).sum()),
        }
        for r, s, src in zip(rewards, searches, sources, strict=True)
    ]
    return RolloutBatch(
        tokens, mask, sources, torch.zeros(tokens.shape), torch.tensor(rewards, dtype=torch.float32), infos
    )


def full_score(trainer: GRPOTrainer, model: Any, batch: RolloutBatch) -> Any:
    """Every response scored in one forward, no buckets: the reference the trainer's passes must match."""
    with torch.no_grad():
        logp, _ = token_logprobs(
            model,
            batch.tokens,
            batch.attention_mask,
            vocab_size=trainer.policy.vocab_size,
            temperature=trainer.policy.temperature,
            score_mask=batch.loss_mask,
        )
    return logp


REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]


def test_groups_plan_reaches_the_updates(
    tmp_path: Path, config: Callable[..., GRPOConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches a trainer that hard-wires the shuffled plan (or the grouped one) in its call."""
    seen: dict[str, list[set[int]]] = {}
    for plan in ("groups", "shuffle"):
        trainer = GRPOTrainer(config(tmp_path / plan, minibatch_plan=plan, seed=3))
        batch = oracle_batch(trainer, REWARDS)
        real = trainer._update_minibatch
        updates: list[set[int]] = []

        def spy(b: Any, micro: list[Any], *args: Any, _real: Any = real, _u: Any = updates) -> Any:
            _u.append({int(i) for idx in micro for i in idx})
            return _real(b, micro, *args)

        monkeypatch.setattr(trainer, "_update_minibatch", spy)
        trainer.step = 1
        trainer.update(batch, group_advantages(batch.rewards, 2))
        seen[plan] = updates
    groups = [{0, 1}, {2, 3}, {4, 5}]
    assert len(seen["groups"]) == 3 and all(u in groups for u in seen["groups"])
    assert any(u not in groups for u in seen["shuffle"]), "this seed's shuffle should cross groups"


@pytest.mark.parametrize("schedule", ["code", "paper"])
def test_llds_ma_weights_and_beta_reach_the_loss(
    tmp_path: Path, config: Callable[..., GRPOConfig], monkeypatch: pytest.MonkeyPatch, schedule: str
) -> None:
    """Catches a trainer that drops LLDS-MA's weights or hard-codes the mean valid searches V."""
    trainer = GRPOTrainer(config(tmp_path, llds="action", llds_ma=True, llds_ma_schedule=schedule))
    searches = [3, 1, 2, 2, 1, 2]  # V = 11/6: beta 0.833 (code), 0.917 (paper)
    batch = oracle_batch(trainer, REWARDS, searches)
    beta = adaptive_answer_weight(sum(searches) / len(searches), schedule)
    assert 0 < beta < 1
    span = answer_span_mask(batch.tokens, batch.sources, trainer.policy.tokenizer.token_bytes)
    assert span.any(), "oracle transcripts end with an answer span"
    expected = answer_weights(span, beta)
    captured: list[tuple[Any, Any]] = []
    real = trainer_module.grpo_llds_loss

    def spy(logp: Any, *args: Any, **kwargs: Any) -> Any:
        captured.append((kwargs["llds_weights"], logp.shape))
        return real(logp, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "grpo_llds_loss", spy)
    trainer.step = 1
    metrics = trainer.update(batch, group_advantages(batch.rewards, 2))
    assert metrics["train/llds_ma_beta"] == pytest.approx(beta)
    assert captured and all(w is not None for w, _ in captured)
    seen = torch.cat([w.flatten() for w, _ in captured])
    assert torch.isclose(seen, torch.tensor(beta)).any() and (seen == 1).any()
    # The weights are the batch's own: the answer span carries beta, nothing else does.
    assert sorted(set(seen.tolist())) == sorted(set(expected.flatten().tolist()))


def test_displacement_is_measured_after_all_of_the_steps_updates(
    tmp_path: Path, config: Callable[..., GRPOConfig]
) -> None:
    """Catches Δ measured after the first update only, or with its sign flipped."""
    trainer = GRPOTrainer(config(tmp_path, rescore_pi_old=True))
    batch = oracle_batch(trainer, REWARDS)
    advantages = group_advantages(batch.rewards, 2)
    initial = copy.deepcopy(trainer.model).eval()
    after_first: dict[str, Any] = {}
    real = trainer._update_minibatch

    def spy(*args: Any) -> Any:
        out = real(*args)
        if not after_first:
            after_first["logp"] = full_score(trainer, trainer.model.eval(), batch)
        return out

    trainer._update_minibatch = spy  # type: ignore[method-assign]
    trainer.step = 1
    metrics = trainer.update(batch, advantages)
    assert len(trainer.update_metrics) == 3
    before = full_score(trainer, initial, batch)
    expected = displacement_by_advantage(
        before, full_score(trainer, trainer.model.eval(), batch), advantages, batch.loss_mask
    )
    early = displacement_by_advantage(before, after_first["logp"], advantages, batch.loss_mask)
    for sign in ("pos", "neg"):
        assert abs(expected[f"delta_adv_{sign}"]) > 1e-3  # large enough that a flipped sign shows
        assert abs(expected[f"delta_adv_{sign}"] - early[f"delta_adv_{sign}"]) > 1e-4  # the test can tell
        assert metrics[f"lld/delta_adv_{sign}"] == pytest.approx(expected[f"delta_adv_{sign}"], abs=1e-5)


def test_displacement_sign_follows_the_advantage(tmp_path: Path, config: Callable[..., GRPOConfig]) -> None:
    """Catches a flipped sign directly: one update that reinforces the positives raises their likelihood."""
    trainer = GRPOTrainer(config(tmp_path, minibatch_size=6, rescore_pi_old=True, lr=1e-3, weight_decay=0.0))
    batch = oracle_batch(trainer, REWARDS)
    trainer.step = 1
    metrics = trainer.update(batch, group_advantages(batch.rewards, 2))
    assert metrics["lld/delta_adv_pos"] > 0 > metrics["lld/delta_adv_neg"]


def test_every_probe_is_scored_whole(tmp_path: Path, config: Callable[..., GRPOConfig]) -> None:
    """Catches scoring only the first chunk (micro-batch) of a probe set."""
    trainer = GRPOTrainer(config(tmp_path, probe_size=12))
    assert trainer.probe is not None and len(trainer.probe) == 12
    onpolicy = oracle_batch(trainer, REWARDS)
    trainer.onpolicy_probes = {"train": onpolicy, "heldout": onpolicy.select([3, 4, 5, 0, 1])}
    metrics = trainer.probe_metrics()
    model = trainer.model.eval()
    probe = full_score(trainer, model, trainer.probe)
    assert metrics["lld/probe_logp"] == pytest.approx(
        float(masked_mean(probe, trainer.probe.loss_mask)), abs=1e-5
    )
    for name, batch in trainer.onpolicy_probes.items():
        value = float(masked_mean(full_score(trainer, model, batch), batch.loss_mask))
        assert metrics[f"lld/probe_onpolicy_{name}"] == pytest.approx(value, abs=1e-5)


def test_warning_counts_the_current_step(tmp_path: Path, config: Callable[..., GRPOConfig]) -> None:
    """Catches ``lld/warning`` computed before the current step joins the history."""
    trainer = GRPOTrainer(config(tmp_path, warning_window=3))
    trainer.history = [{"step": 1, "lld/delta_adv_pos": -0.1}, {"step": 2, "lld/delta_adv_pos": -0.2}]
    trainer._log(3, {"lld/delta_adv_pos": -0.05})
    trainer.history.insert(0, {"step": 0, "lld/delta_adv_pos": -0.3})
    trainer._log(4, {"lld/delta_adv_pos": 0.2})
    trainer.logger.close()
    records = {
        r["step"]: r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
    }
    assert records[3]["lld/warning"] == 1.0  # steps 1-3 all <= 0, the current one included
    assert records[4]["lld/warning"] == 0.0  # the current step gained: no warning, whatever came before


# -- zero-signal steps ---------------------------------------------------------------------------------


def _params(trainer: GRPOTrainer) -> list[Any]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def _same(a: list[Any], b: list[Any]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("skip", [False, True])
def test_zero_signal_updates_are_skipped_only_when_asked(
    tmp_path: Path, config: Callable[..., GRPOConfig], skip: bool
) -> None:
    trainer = GRPOTrainer(config(tmp_path, llds="none", skip_zero_signal=skip, rescore_pi_old=True))
    batch = oracle_batch(trainer, REWARDS)
    trainer.step = 1
    # Step 1: the first group carries signal, the other two none.
    advantages = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 0.0]), 2)
    metrics = trainer.update(batch, advantages)
    assert metrics["train/zero_signal_frac"] == pytest.approx(2 / 3)
    flags = [u["zero_signal"] for u in trainer.update_metrics]
    assert sorted(flags) == [0.0, 1.0, 1.0]
    state = trainer.optimizer.state[next(trainer.model.parameters())]
    assert int(state["step"]) == (1 if skip else 3)  # Adam's moments moved only on real steps when skipping
    # Step 2: no signal at all. Adam's momentum from step 1 (and weight decay) still moves the weights
    # unless the update is skipped.
    before = _params(trainer)
    trainer.step = 2
    metrics = trainer.update(batch, torch.zeros(6))
    assert metrics["train/zero_signal_frac"] == 1.0
    assert _same(before, _params(trainer)) == skip


def test_a_kl_term_is_signal(tmp_path: Path, config: Callable[..., GRPOConfig]) -> None:
    trainer = GRPOTrainer(config(tmp_path, llds="none", kl_coef=0.1, skip_zero_signal=True))
    batch = oracle_batch(trainer, REWARDS)
    trainer.step = 1
    trainer.update(batch, group_advantages(batch.rewards, 2))  # moves the policy away from the reference
    trainer.step = 2
    metrics = trainer.update(batch, torch.zeros(6))
    assert metrics["train/zero_signal_frac"] == 0.0


# -- the ledger ----------------------------------------------------------------------------------------


def test_ledger_anchors_successes_and_measures_their_later_displacement(
    tmp_path: Path, config: Callable[..., GRPOConfig]
) -> None:
    trainer = GRPOTrainer(config(tmp_path, ledger_size=5, rescore_pi_old=True))
    batch = oracle_batch(trainer, REWARDS)
    advantages = group_advantages(batch.rewards, 2)
    trainer.step = 1
    trainer.update(batch, advantages)
    first = trainer.ledger_metrics(batch)
    assert first["lld/ledger_size"] == 0 and math.isnan(first["lld/ledger_delta"])
    assert first["lld/ledger_added"] == 3 and trainer.ledger is not None and len(trainer.ledger) == 3
    ledger, anchor = trainer.ledger.batch()
    assert torch.allclose(anchor, full_score(trainer, trainer.model.eval(), ledger), atol=1e-5)
    snapshot = copy.deepcopy(trainer.model).eval()
    trainer.step = 2
    trainer.update(batch, -advantages)  # a later step moves the past successes
    second = trainer.ledger_metrics(batch)
    now = full_score(trainer, trainer.model.eval(), ledger)
    then = full_score(trainer, snapshot, ledger)
    per = torch.where(ledger.loss_mask, now - then, 0.0).sum(1) / ledger.loss_mask.sum(1)
    assert second["lld/ledger_size"] == 3
    assert second["lld/ledger_delta"] == pytest.approx(float(per.mean()), abs=1e-5)
    assert abs(second["lld/ledger_delta"]) > 1e-3
    assert second["lld/ledger_frac_displaced"] == pytest.approx(float((per < -1e-5).float().mean()))
    assert len(trainer.ledger) == 5  # capacity: the oldest went first


def test_ledger_llds_changes_the_update_and_pulls_back_to_the_anchor(
    tmp_path: Path, config: Callable[..., GRPOConfig]
) -> None:
    results = {}
    for on in (False, True):
        trainer = GRPOTrainer(
            config(
                tmp_path / str(on), ledger_size=6, llds_ledger=on, ledger_lambda=5.0, ledger_batch=3, lr=1e-3
            )
        )
        batch = oracle_batch(trainer, REWARDS)
        trainer.step = 1
        trainer.update(batch, group_advantages(batch.rewards, 2))
        trainer.ledger_metrics(batch)
        trainer.step = 2
        metrics = trainer.update(batch, -group_advantages(batch.rewards, 2))
        results[on] = (_params(trainer), trainer.ledger_metrics(batch)["lld/ledger_delta"], metrics)
    assert not _same(results[False][0], results[True][0])
    assert (
        results[True][2]["train/ledger_llds_loss"] > 0 and "train/ledger_llds_loss" not in results[False][2]
    )
    assert results[True][1] > results[False][1]  # less displacement of the past successes


def test_ledger_survives_a_checkpoint(tmp_path: Path, config: Callable[..., GRPOConfig]) -> None:
    trainer = GRPOTrainer(config(tmp_path, ledger_size=4))
    batch = oracle_batch(trainer, REWARDS)
    trainer.step = 1
    trainer.update(batch, group_advantages(batch.rewards, 2))
    trainer.ledger_metrics(batch)
    trainer.save()
    trainer.logger.close()
    resumed = GRPOTrainer(config(tmp_path, ledger_size=4, resume=True))
    assert resumed.ledger is not None and trainer.ledger is not None
    a, b = trainer.ledger.batch(), resumed.ledger.batch()
    assert torch.equal(a[0].tokens, b[0].tokens) and torch.equal(a[1], b[1])
    assert [e.step for e in resumed.ledger.entries] == [1, 1, 1]


# -- on-policy probes and step 0 -----------------------------------------------------------------------


def test_onpolicy_probes_hold_the_initial_policys_own_successes(
    tmp_path: Path, config: Callable[..., GRPOConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    import searchgym.agents.grpo.probes as probes_module

    real = probes_module.collect_rollouts

    def lucky(env: Any, policy: Any, **kwargs: Any) -> RolloutBatch:
        batch = real(env, policy, **kwargs)
        batch.rewards = torch.tensor([float(i % 3 == 0) for i in range(len(batch))])  # every third correct
        return batch

    monkeypatch.setattr(probes_module, "collect_rollouts", lucky)
    cfg = config(tmp_path, onpolicy_probe_size=5, onpolicy_probe_episodes=20, max_turn_tokens=8, max_turns=2)
    trainer = GRPOTrainer(cfg)
    assert {k: len(v) for k, v in trainer.onpolicy_probes.items()} == {"train": 5, "heldout": 5}
    train_ids = {q.id for q in trainer.env.questions}
    heldout_ids = {info["question_id"] for info in trainer.onpolicy_probes["heldout"].infos}
    assert heldout_ids and not heldout_ids & train_ids  # never a training question
    assert trainer.warmstart["probe_onpolicy_train_size"] == 5
    assert 0 <= trainer.warmstart["answered"] <= 1 and trainer.warmstart["episodes"] >= 5
    trainer.train()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    start = next(r for r in records if r["step"] == 0)  # logged although no evaluation runs
    for key in ("lld/probe_onpolicy_train", "lld/probe_onpolicy_heldout", "warmstart/searches"):
        assert math.isfinite(start[key])
    assert math.isfinite(records[-1]["lld/probe_onpolicy_heldout"])


def test_warmup_from_a_start_rate_is_a_straight_ramp() -> None:
    from searchgym.agents.training.run import make_optimizer

    model = torch.nn.Linear(2, 2)
    cfg = GRPOConfig(lr=1.2e-3, warmup_steps=80, warmup_start_lr=1e-4, steps=80)
    optimizer, scheduler = make_optimizer(model, cfg.optim, total_updates=80)
    rates = []
    for _ in range(80):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()  # no gradients: changes nothing, keeps the scheduler's order
        scheduler.step()
    assert rates[0] == pytest.approx(1e-4) and rates[-1] == pytest.approx(1.2e-3)
    steps = [b - a for a, b in itertools.pairwise(rates)]
    assert max(steps) == pytest.approx(min(steps)) and steps[0] == pytest.approx(1.1e-3 / 79)
