"""The likelihood and displacement measurements on hand-built tensors."""

from __future__ import annotations

import math

import torch

from searchgym.agents.grpo.displacement import displacement_by_advantage, likelihood_metrics, probe_metrics
from searchgym.agents.grpo.spans import PROBE_ACTIONS, probe_masks
from searchgym.protocol import Source
from searchgym.tokenization import builtin_tokenizer

from ..conftest import close

P, T, PR = int(Source.POLICY), int(Source.TOOL), int(Source.PROMPT)


def test_likelihood_metrics() -> None:
    logp = torch.tensor([[-1.0, -2.0, 9.0], [-3.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    m = likelihood_metrics(logp, mask, torch.tensor([True, False]))
    assert m == {
        "logp_correct": -3.0,
        "logp_token_correct": -1.5,
        "logp_incorrect": -3.0,
        "logp_token_incorrect": -3.0,
    }
    assert math.isnan(likelihood_metrics(logp, mask, torch.tensor([True, True]))["logp_incorrect"])


def test_displacement_by_advantage_on_a_hand_built_batch() -> None:
    before = torch.tensor([[-1.0, -1.0, 0.0], [-2.0, -2.0, -2.0], [-1.0, 0.0, 0.0], [-1.0, -1.0, 0.0]])
    after = torch.tensor([[-1.5, -0.5, 7.0], [-2.0, -3.0, -2.5], [-0.5, 9.0, 9.0], [-1.2, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    adv = torch.tensor([1.2, 1.2, 0.0, -0.8])
    m = displacement_by_advantage(before, after, adv, mask)
    # Per response (token mean over its own policy tokens): 0.0, -0.5, +0.5, -0.1; padding is ignored.
    assert close(m["delta_adv_pos"], -0.25) and m["n_adv_pos"] == 2
    assert close(m["delta_adv_zero"], 0.5) and close(m["delta_adv_neg"], -0.1)
    empty = displacement_by_advantage(before, after, torch.tensor([1.0, 1.0, 1.0, 1.0]), mask)
    assert math.isnan(empty["delta_adv_neg"]) and empty["n_adv_neg"] == 0
    assert displacement_by_advantage(before, before, adv, mask)["delta_adv_pos"] == 0.0


def test_probe_masks_and_metrics_by_action_kind() -> None:
    tok = builtin_tokenizer()
    prompt = tok.encode("Question: where?\n")
    search = tok.encode("<search> city </search>")
    info = tok.encode("\n\n<information>Doc 1</information>\n\n")
    answer = tok.encode("<answer> Paris </answer>")
    parts = [(prompt, PR), (search, P), (info, T), (answer, P)]
    tokens = torch.tensor([[t for ids, _ in parts for t in ids]])
    sources = torch.tensor([[src for ids, src in parts for _ in ids]])
    masks = probe_masks(tokens, sources, tok.token_bytes)
    a, b = len(prompt), len(prompt) + len(search)
    c = b + len(info)
    assert masks["first"][0].nonzero().flatten().tolist() == list(range(a, b))
    assert torch.equal(masks["search"], masks["first"])
    assert masks["answer"][0].nonzero().flatten().tolist() == list(range(c, c + len(answer)))
    assert int(masks["all"].sum()) == len(search) + len(answer)
    logp = torch.where(masks["search"], -1.0, -3.0)
    m = probe_metrics(logp, masks)
    assert m["probe_logp_search"] == -1.0 and m["probe_logp_answer"] == -3.0 and m["probe_logp_first"] == -1.0
    n_s, n_a = len(search), len(answer)
    assert close(m["probe_logp"], (-1.0 * n_s - 3.0 * n_a) / (n_s + n_a))
    assert set(m) == {"probe_logp"} | {f"probe_logp_{k}" for k in PROBE_ACTIONS}
