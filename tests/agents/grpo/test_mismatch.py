"""The sampler–learner mismatch dial: the gap metrics and the rollout corrections on hand-computed numbers,
the sampler's three dials, the collapse diagnostics on scripted transcripts, and a trainer run with each."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from searchgym.agents.grpo.config import GRPOConfig, SamplerConfig  # noqa: E402
from searchgym.agents.grpo.losses import policy_loss  # noqa: E402
from searchgym.agents.grpo.mismatch import Sampler, mismatch_metrics, rollout_correction  # noqa: E402
from searchgym.agents.grpo.spans import tag_masks  # noqa: E402
from searchgym.agents.grpo.step_metrics import collapse_metrics  # noqa: E402
from searchgym.agents.grpo.trainer import GRPOTrainer  # noqa: E402
from searchgym.agents.llm import LLMPolicy  # noqa: E402
from searchgym.agents.training.metrics import read_metrics  # noqa: E402
from searchgym.agents.training.rollout import RolloutBatch  # noqa: E402
from searchgym.agents.training.run import EVAL_EPISODES  # noqa: E402
from searchgym.errors import ConfigError  # noqa: E402
from searchgym.protocol import Source  # noqa: E402
from searchgym.tokenization import load_tokenizer  # noqa: E402

L = math.log


# -- the gap and the corrections, by hand ------------------------------------------------------------------


def test_mismatch_metrics_by_hand() -> None:
    # two policy tokens: the sampler gave 1/2 and 1/4, the learner 1/4 and 1/4 (a pad position ignored)
    sampler = torch.tensor([[L(0.5), L(0.25), 0.0]])
    learner = torch.tensor([[L(0.25), L(0.25), 5.0]])
    mask = torch.tensor([[True, True, False]])
    m = mismatch_metrics(sampler, learner, mask)
    assert m["gap_mean"] == pytest.approx(L(2) / 2)
    assert m["kl_k1"] == pytest.approx(L(2) / 2)
    # r = pi_learner / pi_sampler = (1/2, 1); k3 = mean(r - 1 - log r) = ((-1/2 + log 2) + 0) / 2
    assert m["kl_k3"] == pytest.approx((L(2) - 0.5) / 2)
    assert m["ratio_mean"] == pytest.approx(0.75)
    assert m["ratio_max"] == pytest.approx(1.0)
    assert m["ratio_p01"] == pytest.approx(0.5 + 0.01 * 0.5)  # linear interpolation between 0.5 and 1
    assert m["gap_p99"] == pytest.approx(0.99 * L(2))
    assert all(math.isnan(v) for v in mismatch_metrics(sampler, learner, mask & False).values())


def test_tis_truncates_each_token_weight_at_the_threshold() -> None:
    # ratios pi_learner / pi_sampler = 0.5 and 4 on policy tokens; C = 2
    learner = torch.tensor([[L(0.25), L(0.8), 0.0]])
    sampler = torch.tensor([[L(0.5), L(0.2), 0.0]])
    mask = torch.tensor([[True, True, False]])
    weights, keep, m = rollout_correction(learner, sampler, mask, "tis", 2.0)
    assert weights is not None
    assert weights.tolist()[0] == pytest.approx([0.5, 2.0, 0.0])
    assert keep.tolist() == [True]
    assert m == pytest.approx({"tis_capped_frac": 0.5, "tis_weight_mean": 1.25})


def test_mis_drops_responses_whose_geometric_mean_ratio_leaves_the_bounds() -> None:
    # response 0: ratios 2, 2 (geometric mean 2, dropped at C 1.5); response 1: 2, 1/2 (mean 1, kept);
    # response 2: ratio 1/1.6 (below 1/1.5, dropped); response 3: no policy token (kept: nothing to drop)
    learner = torch.tensor([[L(0.8), L(0.6)], [L(0.8), L(0.1)], [L(0.5), 0.0], [0.0, 0.0]])
    sampler = torch.tensor([[L(0.4), L(0.3)], [L(0.4), L(0.2)], [L(0.8), 0.0], [0.0, 0.0]])
    mask = torch.tensor([[True, True], [True, True], [True, False], [False, False]])
    weights, keep, m = rollout_correction(learner, sampler, mask, "mis", 1.5)
    assert weights is None
    assert keep.tolist() == [False, True, False, True]
    assert m == {"mis_dropped_frac": 0.5}


def test_no_correction_and_an_unknown_one() -> None:
    x = torch.zeros(1, 2)
    weights, keep, m = rollout_correction(x, x, torch.ones(1, 2, dtype=torch.bool), "none", 2.0)
    assert weights is None and keep.tolist() == [True] and m == {}
    with pytest.raises(ValueError, match="none, tis, mis"):
        rollout_correction(x, x, torch.ones(1, 2, dtype=torch.bool), "tsi", 2.0)


def test_policy_loss_scales_each_tokens_surrogate_by_its_weight() -> None:
    # on-policy (ratio 1), advantage 1 on both tokens: the surrogate is -1 a token; weights 1/2 and 2
    logp = torch.tensor([[L(0.5), L(0.25)]], requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    plain, _ = policy_loss(logp, logp.detach(), torch.tensor([1.0]), mask)
    weighted, _ = policy_loss(
        logp, logp.detach(), torch.tensor([1.0]), mask, is_weights=torch.tensor([[0.5, 2.0]])
    )
    assert float(plain.detach()) == pytest.approx(-1.0)
    assert float(weighted.detach()) == pytest.approx(-(0.5 + 2.0) / 2)
    weighted.backward()
    assert logp.grad is not None
    assert logp.grad.tolist()[0] == pytest.approx([-0.25, -1.0])  # d/dlogp of -w * exp(logp - old) / 2


def test_the_threshold_must_exceed_one_with_a_correction() -> None:
    with pytest.raises(ConfigError, match="rollout_correction_threshold"):
        SamplerConfig(rollout_correction="tis", rollout_correction_threshold=1.0)
    with pytest.raises(ConfigError, match="rollout_correction"):
        SamplerConfig(rollout_correction="is")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="sampler_stale"):
        SamplerConfig(sampler_stale=-1)
    assert not SamplerConfig().active and SamplerConfig(sampler_noise=0.1).dial_on


# -- the sampler's dials -----------------------------------------------------------------------------------


def _policy(**kwargs: Any) -> LLMPolicy:
    from searchgym.agents.llm import tiny_causal_lm

    tok = load_tokenizer(None)
    model = tiny_causal_lm(tok.vocab_size, layers=1, hidden=16, seed=0, eos_token_id=tok.eos_token_id)
    return LLMPolicy(model, tok, **kwargs)


def _params(model: Any) -> dict[str, Any]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_bfloat16_sampler_holds_the_learners_weights_rounded() -> None:
    learner = _policy()
    sampler = Sampler(learner, SamplerConfig(sampler_dtype="bfloat16"), seed=0)
    sampler.sync()
    for name, value in learner.model.state_dict().items():
        got = sampler.policy.model.state_dict()[name]
        assert torch.equal(got, value.to(torch.bfloat16).to(value.dtype)), name
    assert any(
        not torch.equal(sampler.policy.model.state_dict()[k], v)
        for k, v in learner.model.state_dict().items()
    )


def test_a_stale_sampler_lags_the_learner_by_k_updates() -> None:
    learner = _policy()
    sampler = Sampler(learner, SamplerConfig(sampler_stale=2), seed=0)
    snapshots = [_params(learner.model)]
    for _ in range(3):  # three "updates"
        with torch.no_grad():
            for p in learner.model.parameters():
                p.add_(0.1)
        sampler.record()
        snapshots.append(_params(learner.model))
    sampler.sync()  # after 3 updates, 2 stale: the weights after update 1
    for name, value in snapshots[1].items():
        assert torch.equal(sampler.policy.model.state_dict()[name], value), name
    restored = Sampler(learner, SamplerConfig(sampler_stale=2), seed=0)
    restored.load_state(sampler.state())
    restored.sync()
    for name, value in snapshots[1].items():
        assert torch.equal(restored.policy.model.state_dict()[name], value), name


def test_logit_noise_changes_what_is_sampled_and_reports_the_noisy_probabilities() -> None:
    clean, noisy = _policy(seed=3), _policy(seed=3, logit_noise=2.0)
    logits = torch.randn(64, clean.model.config.vocab_size, generator=torch.Generator().manual_seed(0))
    ids_clean, logp_clean = clean._sample(logits)
    ids_noisy, logp_noisy = noisy._sample(logits)
    assert not torch.equal(ids_clean, ids_noisy)
    clean_of_noisy = torch.log_softmax(logits[:, : clean.vocab_size], dim=-1).gather(-1, ids_noisy[:, None])[
        :, 0
    ]
    assert not torch.allclose(logp_noisy, clean_of_noisy)  # the noisy distribution's, not the model's
    assert torch.equal(_policy(seed=3, logit_noise=0.0)._sample(logits)[0], ids_clean)
    with pytest.raises(ConfigError, match="logit_noise"):
        _policy(logit_noise=-1.0)


# -- the collapse diagnostics on a scripted batch ------------------------------------------------------------


def _scripted_batch(texts: list[tuple[str, str]], infos: list[dict[str, Any]]) -> tuple[RolloutBatch, Any]:
    """One response per (prompt, policy text): the prompt's tokens, then the policy's."""
    tok = load_tokenizer(None)
    rows = []
    for prompt, policy in texts:
        p, a = tok.encode(prompt), [*tok.encode(policy), tok.eos_token_id]
        rows.append((p + a, [int(Source.PROMPT)] * len(p) + [int(Source.POLICY)] * len(a)))
    width = max(len(t) for t, _ in rows)
    tokens = torch.full((len(rows), width), tok.pad_token_id)
    sources = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (t, s) in enumerate(rows):
        tokens[i, : len(t)] = torch.tensor(t)
        sources[i, : len(s)] = torch.tensor(s)
    batch = RolloutBatch(
        tokens, (sources > 0).long(), sources, torch.zeros(tokens.shape), torch.zeros(len(rows)), infos
    )
    return batch, tok


def test_tag_masks_mark_exactly_the_tag_tokens_the_policy_wrote() -> None:
    batch, tok = _scripted_batch([("Q <search> in the prompt </search>", "<search> Coin </search>")], [{}])
    masks = tag_masks(batch.tokens, batch.sources, tok.token_bytes, tok.eos_token_id)
    row = batch.tokens[0].tolist()

    def text(name: str) -> bytes:
        return b"".join(tok.token_bytes[row[t]] for t in masks[name][0].nonzero().flatten().tolist())

    assert text("search_open").strip() == b"<search>"
    assert text("search_close").strip() == b"</search>"
    assert not masks["answer_open"].any() and not masks["answer_close"].any()
    assert masks["eos"][0].nonzero().flatten().tolist() == [row.index(tok.eos_token_id)]
    assert not (masks["search_open"] & (batch.sources != int(Source.POLICY))).any()  # never the prompt's tags


def test_collapse_metrics_on_scripted_episodes() -> None:
    infos = [
        {"invalid_turns": 0, "answer": "x", "searches": 1},
        {"invalid_turns": 2, "answer": None, "searches": 0},
        {"invalid_turns": 0, "answer": "y", "searches": 0},
        {"invalid_turns": 0, "answer": "z", "searches": 0},
    ]
    texts = [
        ("Q", "<answer> x </answer>"),
        ("Q", "nonsense"),
        ("Q", "<answer> y </answer>"),
        ("Q", "<answer> z"),
    ]
    batch, tok = _scripted_batch(texts, infos)
    masks = tag_masks(batch.tokens, batch.sources, tok.token_bytes, tok.eos_token_id)
    logp = torch.zeros(batch.tokens.shape)
    logp[masks["answer_open"]] = L(0.5)  # the policy gives its answer openers probability 1/2
    logp[masks["answer_close"]] = L(0.25)
    m = collapse_metrics(batch, logp, tok.token_bytes, tok.eos_token_id)
    assert m["collapse/p_answer_open"] == pytest.approx(0.5)
    assert m["collapse/p_answer_close"] == pytest.approx(0.25)
    assert m["collapse/p_eos"] == pytest.approx(1.0)
    assert math.isnan(m["collapse/p_search_open"])  # no response searched
    assert m["collapse/malformed_frac"] == pytest.approx(0.25)
    assert m["collapse/answer_without_search_frac"] == pytest.approx(0.5)


# -- the trainer with the dial ----------------------------------------------------------------------------------


@pytest.fixture
def tiny(tiny_grpo: Callable[..., GRPOConfig]) -> Callable[..., GRPOConfig]:
    """Two steps of the smallest GRPO run (tests/agents/conftest.py)."""
    return functools.partial(tiny_grpo, steps=2)


def test_the_dial_off_logs_no_mismatch_and_the_sampler_is_the_learner(
    tmp_path: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    trainer = GRPOTrainer(tiny(tmp_path))
    assert trainer.sampler is None
    trainer.train()
    last = read_metrics(trainer.run_dir)[-1]
    assert not any(k.startswith("mismatch/") for k in last)
    assert {"collapse/p_eos", "collapse/malformed_frac", "collapse/answer_without_search_frac"} <= set(last)


@pytest.mark.parametrize(
    "dial",
    [
        {"sampler_noise": 1.0, "rollout_correction": "tis"},
        {"sampler_dtype": "bfloat16", "rollout_correction": "mis", "rollout_correction_threshold": 1.001},
        {"sampler_stale": 1},
    ],
    ids=["noise+tis", "bf16+mis", "stale"],
)
def test_each_dial_opens_a_gap_the_run_logs(
    tmp_path: Path, tiny: Callable[..., GRPOConfig], dial: dict[str, Any]
) -> None:
    trainer = GRPOTrainer(tiny(tmp_path, **dial))
    assert trainer.sampler is not None
    trainer.train()
    history = [r for r in read_metrics(trainer.run_dir) if r["step"] > 0]
    gaps = [r["mismatch/gap_abs_p99"] for r in history]
    if "sampler_stale" in dial:  # step 1 samples with the initial weights, which the learner still has
        assert gaps[0] == pytest.approx(0.0, abs=1e-5) and gaps[1] > 1e-4
    else:
        assert all(g > 1e-4 for g in gaps)
    if dial.get("rollout_correction") == "tis":
        assert all(r["mismatch/tis_weight_mean"] > 0 for r in history)
    if dial.get("rollout_correction") == "mis":
        assert all(0 <= r["mismatch/mis_dropped_frac"] <= 1 for r in history)


def test_evaluation_records_carry_kind_and_failure_stage(
    tmp_path: Path, tiny: Callable[..., GRPOConfig]
) -> None:
    trainer = GRPOTrainer(tiny(tmp_path, steps=1, eval_questions=3, eval_batch=3, eval_at_start=True))
    trainer.train()
    lines = (trainer.run_dir / EVAL_EPISODES).read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [0, 0, 0, 1, 1, 1]
    assert all(r["stage"] in ("correct", "no_answer", "not_retrieved", "misread") for r in records)
    assert all(r["kind"] in ("attribute", "bridge", "comparison") for r in records)
    assert all((r["stage"] == "correct") == (r["em"] >= 1.0) for r in records)
