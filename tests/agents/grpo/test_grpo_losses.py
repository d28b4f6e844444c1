"""GRPO and LLDS loss functions on small hand-computed tensors."""

from __future__ import annotations

import math

import pytest
import torch

from searchgym.agents.grpo.advantages import broadcast_advantages
from searchgym.agents.grpo.config import GATES, GRPOLossConfig, LLDSConfig
from searchgym.agents.grpo.losses import (
    action_ids,
    adaptive_answer_weight,
    answer_weights,
    entropy_bonus,
    entropy_from_logits,
    grpo_llds_loss,
    k3_kl,
    kl_penalty,
    llds_loss,
    masked_mean,
    policy_loss,
    sapo_loss,
)
from searchgym.errors import ConfigError
from searchgym.protocol import Source

from ..conftest import close

P, T, PAD, PR = int(Source.POLICY), int(Source.TOOL), int(Source.PAD), int(Source.PROMPT)

NO_LLDS = LLDSConfig(gate=None)
"""The LLDS section without its term."""


def test_masked_mean_ignores_garbage_outside_mask() -> None:
    values = torch.tensor([[1.0, float("nan"), 3.0], [float("inf"), 5.0, 0.0]])
    mask = torch.tensor([[1, 0, 1], [0, 1, 0]])
    assert close(masked_mean(values, mask), 3.0)
    assert close(masked_mean(values, mask, num_tokens=9), 1.0)
    assert close(masked_mean(values, torch.zeros(2, 3)), 0.0)


# -- PPO surrogate -------------------------------------------------------------------------------------


def _ratios_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # Response 0 (A = +1): ratios 1, 1.5, 0.5. Response 1 (A = -1): ratios 1.5, 0.5, then a tool token with
    # a wild log-probability that must not matter.
    ratios = torch.tensor([[1.0, 1.5, 0.5], [1.5, 0.5, 1.0]])
    logp_old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -3.0, -1.0]])
    logp = (logp_old + ratios.log()).clone()
    logp[1, 2] = 1000.0
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return logp.requires_grad_(), logp_old, torch.tensor([1.0, -1.0]), mask


def test_policy_loss_hand_computed() -> None:
    logp, logp_old, adv, mask = _ratios_case()
    loss, metrics = policy_loss(logp, logp_old, adv, mask, clip_eps=0.2)
    # per token: A=+1: -1, max(-1.5, -1.2) = -1.2, max(-0.5, -0.8) = -0.5; A=-1: max(1.5, 1.2), max(0.5, 0.8)
    assert close(loss, (-1.0 - 1.2 - 0.5 + 1.5 + 0.8) / 5)
    assert close(metrics["clip_frac"], 2 / 5)
    kl = 2 * (0.5 - math.log(1.5)) + 2 * (-0.5 - math.log(0.5))
    assert close(metrics["approx_kl"], kl / 5)
    loss.backward()
    assert logp.grad is not None
    # d/dlogp of -A * rho is -A * rho where the unclipped term is active, 0 where the clipped one is.
    expected = torch.tensor([[-1.0, 0.0, -0.5], [1.5, 0.0, 0.0]]) / 5
    assert torch.allclose(logp.grad, expected, atol=1e-6)


def test_policy_loss_per_token_advantages_and_clip_high() -> None:
    logp, logp_old, adv, mask = _ratios_case()
    per_token = broadcast_advantages(adv, mask)
    a, _ = policy_loss(logp, logp_old, adv, mask)
    b, _ = policy_loss(logp, logp_old, per_token, mask)
    assert close(a, float(b.detach()))
    # With clip_eps_high = 0.6 the ratio 1.5 of the A = +1 response is no longer clipped.
    c, metrics = policy_loss(logp, logp_old, adv, mask, clip_eps=0.2, clip_eps_high=0.6)
    assert close(c, (-1.0 - 1.5 - 0.5 + 1.5 + 0.8) / 5)
    assert close(metrics["clip_frac"], 1 / 5)


def test_tool_tokens_never_reach_any_loss() -> None:
    logp, logp_old, adv, mask = _ratios_case()
    ref = logp_old.clone()
    moved = logp.detach().clone()
    moved[1, 2] = -50.0  # the tool position
    for fn in (
        lambda lp: policy_loss(lp, logp_old, adv, mask)[0],
        lambda lp: kl_penalty(lp, ref, mask)[0],
        lambda lp: llds_loss(lp, logp_old, adv, mask, "token")[0],
    ):
        assert close(fn(logp.detach()), float(fn(moved)))
        x = logp.detach().clone().requires_grad_()
        fn(x).backward()
        assert x.grad is not None and x.grad[1, 2] == 0 and torch.isfinite(x.grad).all()


# -- KL and entropy ------------------------------------------------------------------------------------


def test_ratio_cap_values_and_gradients_at_and_beyond_the_cap() -> None:
    # Negative advantage: the unclipped term -A * rho is the active one, so the cap is what bounds it.
    logp_old = torch.zeros(1, 3)
    logp = torch.tensor([[math.log(50.0), math.log(100.0), math.log(400.0)]], requires_grad=True)
    adv = torch.tensor([-1.0])
    mask = torch.ones(1, 3)
    loss, m = policy_loss(logp, logp_old, adv, mask, 0.2, ratio_cap=100.0)
    # Per token -A * min(rho, 100): 50, 100, 100 -> token mean 250 / 3.
    assert close(loss, 250.0 / 3, 1e-3)
    loss.backward()
    assert logp.grad is not None
    # d/dlogp of rho/3 is rho/3 below the cap; zero beyond it (400 > 100 is capped to a constant).
    assert close(logp.grad[0, 0], 50.0 / 3, 1e-3) and close(logp.grad[0, 2], 0.0)
    assert close(m["max_abs_log_ratio"], math.log(400.0)) and close(m["ratio_cap_frac"], 1 / 3)
    uncapped, m = policy_loss(logp.detach(), logp_old, adv, mask, 0.2, ratio_cap=math.inf)
    assert close(uncapped, (50.0 + 100.0 + 400.0) / 3, 1e-3) and m["ratio_cap_frac"] == 0.0
    with pytest.raises(ConfigError, match="ratio_cap"):
        policy_loss(logp, logp_old, adv, mask, ratio_cap=1.0)


def test_k3_value_cap_values_and_gradients() -> None:
    # x = ref - logp; k3 = e^x - x - 1. x = 1: 0.718 (inside); x = 3: 16.09 -> 10 (capped, zero gradient).
    logp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[1.0, 3.0]])
    kl = k3_kl(logp, ref, value_cap=10.0)
    assert close(kl[0, 0], math.e - 2) and close(kl[0, 1], 10.0)
    kl.sum().backward()
    assert logp.grad is not None
    # d k3 / d logp = -(e^x - 1): 1 - e inside the cap, 0 beyond it.
    assert close(logp.grad[0, 0], 1 - math.e) and logp.grad[0, 1] == 0.0
    assert close(k3_kl(logp.detach(), ref, value_cap=math.inf)[0, 1], math.exp(3) - 4, 1e-4)
    loss, m = kl_penalty(logp.detach(), ref, torch.ones(1, 2), value_cap=10.0)
    assert close(loss, (math.e - 2 + 10.0) / 2) and m["kl_cap_frac"] == 0.5


def test_cap_frac_counts_tokens_at_either_cap() -> None:
    logp_old = torch.zeros(1, 4)
    logp = torch.tensor([[math.log(200.0), 0.0, 0.0, 0.0]])
    ref = torch.tensor([[0.0, 5.0, 0.0, 0.0]])  # token 1 is beyond the k3 cap; token 0 beyond the ratio cap
    _, m = grpo_llds_loss(logp, logp_old, torch.tensor([-1.0]), torch.ones(1, 4), llds=NO_LLDS, ref_logp=ref)
    assert m["cap_frac"] == 0.5 and m["ratio_cap_frac"] == 0.25 and m["kl_cap_frac"] == 0.25
    _, m = grpo_llds_loss(logp, logp_old, torch.tensor([-1.0]), torch.ones(1, 4), llds=NO_LLDS)
    assert m["cap_frac"] == 0.25


def test_k3_kl_hand_computed() -> None:
    logp = torch.tensor([[math.log(0.5), math.log(0.2)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.2)]])
    # ref - logp = log 0.5: e^x - x - 1 = 0.5 + log 2 - 1
    assert torch.allclose(k3_kl(logp, ref), torch.tensor([[0.5 + math.log(2) - 1, 0.0]]), atol=1e-6)
    assert (k3_kl(torch.randn(3, 4), torch.randn(3, 4)) >= 0).all()


def test_kl_penalty_is_masked_token_mean() -> None:
    logp = torch.tensor([[math.log(0.5), math.log(0.2), 0.0]])
    ref = torch.tensor([[math.log(0.25), math.log(0.2), -90.0]])  # position 2 is a tool token
    loss, metrics = kl_penalty(logp, ref, torch.tensor([[1, 1, 0]]))
    assert close(loss, (0.5 + math.log(2) - 1) / 2)
    assert close(metrics["kl_ref"], float(loss))


def test_entropy_from_logits_and_bonus() -> None:
    inf = float("inf")
    logits = torch.tensor([[[0.0, 0.0, -inf, -inf], [0.0, math.log(3.0), -inf, -inf]]])
    ent = entropy_from_logits(logits)
    h2 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert torch.allclose(ent, torch.tensor([[math.log(2.0), h2]]), atol=1e-6)
    mask = torch.tensor([[1, 0]])
    assert close(entropy_bonus(ent, mask)[0], math.log(2.0))
    h, metrics = entropy_bonus(logits, torch.tensor([[1, 1]]))
    assert close(h, (math.log(2.0) + h2) / 2) and close(metrics["entropy"], float(h))


# -- actions -------------------------------------------------------------------------------------------


def test_action_ids_split_at_tool_and_prompt_tokens() -> None:
    sources = torch.tensor([[PR, P, P, T, T, P, P, P, PAD], [P, T, P, PR, P, P, T, T, T]])
    ids = action_ids(sources == P)
    assert ids.tolist() == [[-1, 0, 0, -1, -1, 1, 1, 1, -1], [0, -1, 1, -1, 2, 2, -1, -1, -1]]
    assert action_ids(torch.zeros(2, 3)).tolist() == [[-1] * 3] * 2


# -- LLDS ----------------------------------------------------------------------------------------------
#
# Batch: row 0 (A = +1) has two actions split by a tool token, d = [.5, -.2] | [.4, -.6]: the first
# action's sum is .3 (gate open), the second's -.2 (closed), the response's .1 (open).
# Row 1 (A = 0, preserved) has one action d = [.3, -.5]: sum -.2, so its response and action gates stay
# closed although one token lost likelihood. Row 2 (A = -1) lost likelihood everywhere but is not
# preserved. N = 9 policy tokens in the batch.

D = torch.tensor([[0.5, -0.2, 0.0, 0.4, -0.6], [0.3, -0.5, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0]])
SOURCES = torch.tensor([[P, P, T, P, P], [P, P, PAD, PAD, PAD], [P, P, P, PAD, PAD]])
MASK = SOURCES == P
ADV = torch.tensor([1.0, 0.0, -1.0])


def _llds(
    gate: str, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
    logp_old = torch.zeros(3, 5)
    logp = (-D).clone().requires_grad_()  # d = logp_old - logp = D
    loss, metrics = llds_loss(logp, logp_old, ADV, MASK, gate, weights)  # type: ignore[arg-type]
    loss.backward()
    assert logp.grad is not None
    return loss, metrics, logp.grad


@pytest.mark.parametrize("gate", GATES)
def test_llds_is_zero_when_policy_unchanged(gate: str) -> None:
    logp = torch.randn(3, 5)
    loss, metrics = llds_loss(logp, logp.clone(), ADV, MASK, gate)  # type: ignore[arg-type]
    assert float(loss) == 0.0 and metrics["llds_loss"] == 0.0 and metrics["llds_gate_open"] == 0.0


def test_llds_token_gate_penalises_every_lost_token_of_preserved_responses() -> None:
    loss, metrics, grad = _llds("token")
    assert close(loss, (0.5 + 0.4 + 0.3) / 9)
    assert close(metrics["llds_gate_open"], 3 / 6)  # tokens of the preserving set with d > 0
    expected = torch.zeros(3, 5)
    expected[0, 0] = expected[0, 3] = expected[1, 0] = -1 / 9
    assert torch.allclose(grad, expected)  # the A < 0 response is untouched


def test_llds_response_gate() -> None:
    loss, metrics, grad = _llds("response")
    assert close(loss, (0.5 + 0.4) / 9)  # row 0 open (sum .1 > 0); row 1 closed (sum -.2)
    assert close(metrics["llds_gate_open"], 1 / 2)
    assert grad[1].abs().sum() == 0 and grad[2].abs().sum() == 0


def test_llds_action_gate() -> None:
    loss, metrics, grad = _llds("action")
    assert close(loss, 0.5 / 9)  # only row 0's first action is open
    assert close(metrics["llds_gate_open"], 1 / 3)
    expected = torch.zeros(3, 5)
    expected[0, 0] = -1 / 9
    assert torch.allclose(grad, expected)


def test_llds_default_gate_is_action_and_unknown_gate_lists_valid_ones() -> None:
    logp = torch.zeros(3, 5)
    a, _ = llds_loss(logp, D, ADV, MASK)
    b, _ = llds_loss(logp, D, ADV, MASK, "action")
    assert float(a) == float(b)
    with pytest.raises(ConfigError, match=r"'action', 'response', 'token'"):
        llds_loss(logp, D, ADV, MASK, "none")  # type: ignore[arg-type]


def test_llds_negative_advantage_only_is_zero_and_normaliser() -> None:
    logp = torch.zeros(3, 5)
    loss, metrics = llds_loss(logp, D, -torch.ones(3), MASK, "token")
    assert float(loss) == 0.0 and metrics["llds_gate_open"] == 0.0
    loss, _ = llds_loss(logp, D, ADV, MASK, "token", num_tokens=12)
    assert close(loss, 1.2 / 12)


def test_llds_ma_weights_touch_only_the_answer_span() -> None:
    answer = torch.zeros(3, 5, dtype=torch.bool)
    answer[0, 3:] = True  # row 0's last action is its answer
    w = answer_weights(answer, 0.5)
    assert w.tolist()[0] == [1.0, 1.0, 1.0, 0.5, 0.5] and (w[1:] == 1).all()
    loss, _, grad = _llds("token", w)
    assert close(loss, (0.5 + 0.5 * 0.4 + 0.3) / 9)
    assert close(grad[0, 3], -0.5 / 9) and close(grad[0, 0], -1 / 9)
    # The action gate sums unweighted d: row 0's first action stays the only one open.
    loss, _, _ = _llds("action", w)
    assert close(loss, 0.5 / 9)


def test_adaptive_answer_weight_schedules() -> None:
    searches = (0.0, 1.0, 1.5, 2.0, 3.5, -1.0)
    # paper: min(V / 2, 1); code (the authors' release): clip(V - 1, 0, 1); the default is the code's.
    assert [adaptive_answer_weight(v, "paper") for v in searches] == [0.0, 0.5, 0.75, 1.0, 1.0, 0.0]
    assert [adaptive_answer_weight(v, "code") for v in searches] == [0.0, 0.0, 0.5, 1.0, 1.0, 0.0]
    assert adaptive_answer_weight(1.5) == adaptive_answer_weight(1.5, "code")
    with pytest.raises(ConfigError, match=r"valid schedules: \['paper', 'code'\]"):
        adaptive_answer_weight(1.0, "linear")


def test_grpo_llds_loss_combines_terms() -> None:
    torch.manual_seed(0)
    logp_old = -torch.rand(3, 5)
    logp = logp_old + 0.3 * torch.randn(3, 5)
    ref = -torch.rand(3, 5)
    ent = torch.rand(3, 5)
    weights = GRPOLossConfig(kl_coef=0.001, entropy_coef=0.01)
    loss, metrics = grpo_llds_loss(
        logp, logp_old, ADV, MASK, weights, LLDSConfig(coef=0.2), ref_logp=ref, entropy=ent
    )
    pg, _ = policy_loss(logp, logp_old, ADV, MASK, 0.2)
    llds, _ = llds_loss(logp, logp_old, ADV, MASK, "action")
    kl, _ = kl_penalty(logp, ref, MASK)
    h, _ = entropy_bonus(ent, MASK)
    assert close(loss, float(pg + 0.2 * llds + 0.001 * kl - 0.01 * h))
    assert {
        "pg_loss",
        "clip_frac",
        "approx_kl",
        "llds_loss",
        "llds_gate_open",
        "kl_ref",
        "entropy",
        "loss",
    } <= set(metrics)
    plain, metrics = grpo_llds_loss(logp, logp_old, ADV, MASK, llds=NO_LLDS)
    assert close(plain, float(pg)) and "llds_loss" not in metrics and "kl_ref" not in metrics


# -- SAPO ----------------------------------------------------------------------------------------------


def _sapo(threshold: float = 0.8, advantages: tuple[float, ...] = (1.0, -1.0), **kw: float):
    # Row 0 (A >= 0): d = 0, 0.5, 0.1 -> ratios 1, e^-0.5 = 0.61, e^-0.1 = 0.90; row 1 (A < 0) loses more.
    logp_old = torch.full((2, 3), -1.0)
    logp = torch.tensor([[-1.0, -1.5, -1.1], [-3.0, -3.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, metrics = sapo_loss(logp, logp_old, torch.tensor(advantages), mask, threshold, **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, metrics, grad


def test_sapo_penalises_low_ratio_tokens_of_non_negative_responses_only() -> None:
    loss, metrics, grad = _sapo()
    assert close(loss, 0.5 / 3)  # only (0, 1) has r <= 0.8; N+ = row 0's three policy tokens
    assert close(metrics["sapo_loss"], 0.5 / 3) and close(metrics["sapo_frac"], 1 / 3)
    expected = torch.zeros(2, 3)
    expected[0, 1] = -1 / 3  # raises the token's likelihood; the A < 0 row gets nothing
    assert torch.allclose(grad, expected)


def test_sapo_threshold_one_penalises_every_lost_token_and_zero_advantage_counts() -> None:
    loss, metrics, _ = _sapo(threshold=1.0, advantages=(0.0, -1.0))
    assert close(loss, (0.5 + 0.1) / 3)
    assert close(metrics["sapo_frac"], 1.0)  # r <= t: the unchanged token (r = 1) is in, with d = 0
    loss, _, _ = _sapo(threshold=1.0, advantages=(0.0, 0.0))  # row 1: d = 2, 2 on its two policy tokens
    assert close(loss, (0.5 + 0.1 + 4.0) / 5)


def test_sapo_is_zero_when_the_policy_is_unchanged_and_takes_a_denominator() -> None:
    logp = torch.randn(3, 5)
    loss, metrics = sapo_loss(logp, logp.clone(), ADV, MASK)
    assert float(loss) == 0.0 and metrics["sapo_frac"] == 0.0
    loss, metrics, _ = _sapo(num_tokens=10)
    assert close(loss, 0.5 / 10) and close(metrics["sapo_frac"], 1 / 10)


@pytest.mark.parametrize("threshold", [0.0, -0.5, 1.5])
def test_sapo_threshold_outside_zero_one_is_refused(threshold: float) -> None:
    with pytest.raises(ConfigError, match=r"SAPO threshold must be in \(0, 1\]"):
        _sapo(threshold=threshold)


def test_grpo_llds_loss_adds_sapo_with_its_own_denominator() -> None:
    torch.manual_seed(1)
    logp_old = -torch.rand(3, 5)
    logp = logp_old + 0.5 * torch.randn(3, 5)
    sapo_on = GRPOLossConfig(kl_coef=0.0, sapo_coef=0.5)
    loss, metrics = grpo_llds_loss(logp, logp_old, ADV, MASK, sapo_on, NO_LLDS, sapo_tokens=7)
    pg, _ = policy_loss(logp, logp_old, ADV, MASK, 0.2)
    sapo, _ = sapo_loss(logp, logp_old, ADV, MASK, num_tokens=7)
    assert float(sapo) > 0 and close(loss, float(pg + 0.5 * sapo))
    assert {"sapo_loss", "sapo_frac"} <= set(metrics)
    _, metrics = grpo_llds_loss(logp, logp_old, ADV, MASK, GRPOLossConfig(kl_coef=0.0), NO_LLDS)
    assert "sapo_loss" not in metrics
