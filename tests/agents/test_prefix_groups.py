"""Scoring with each group's shared prefix read once (``ScoringOptions.group_prefixes``): the plan of the
groups, and log-probs, entropies and gradients equal to the whole-batch forward's."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from searchgym.agents.llm import ScoringOptions, token_logprobs
from searchgym.agents.llm.prefix_groups import prefix_groups
from searchgym.tokenization import builtin_tokenizer

transformers = pytest.importorskip("transformers")

TOK = builtin_tokenizer()


def _rows(rows: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    return ids, torch.tensor([len(r) for r in rows])


def test_prefix_groups_finds_each_groups_prefix_and_leaves_a_row_alone() -> None:
    a = [1, 2, 3, 4, 5, 6]
    b = [7, 8, 9, 9, 9]
    ids, lengths = _rows([[*a, 10], [*b, 1], [*a, 11, 12], [3, 3, 3], [*b, 2, 2], [*a, 10]])
    plan = prefix_groups(ids, lengths, min_prefix=3)
    assert plan is not None
    # rows 0, 2, 5 share a (6 tokens; rows 0 and 5 are equal, and alone would share 6 of their 7 too);
    # rows 1 and 4 share b (5); row 3 shares nothing: a group of its own, its prefix the whole row.
    assert plan.row_prefix.tolist() == [6, 5, 6, 3, 5, 6]
    assert plan.groups == 3
    g = plan.group.tolist()
    assert len({g[0], g[1], g[3]}) == 3 and g[0] == g[2] == g[5] and g[1] == g[4]
    assert [int(plan.prefix[g[r]]) for r in (0, 1, 3)] == [6, 5, 3]
    assert int(plan.first[g[0]]) in (0, 2, 5) and int(plan.first[g[1]]) in (1, 4) and plan.first[g[3]] == 3


def test_prefix_groups_splits_a_group_where_a_longer_shared_run_saves_more() -> None:
    # Five rows share 4 tokens; three of them share 20. {3 rows x 20} + {2 rows x 4} saves 2*20 + 4 = 44,
    # one group of five 4 * 4 = 16.
    head = [1, 2, 3, 4]
    long = head + list(range(10, 26))
    ids, lengths = _rows([[*long, 30], [*head, 5, 6], [*long, 31], [*head, 7, 8], [*long, 32]])
    plan = prefix_groups(ids, lengths, min_prefix=2)
    assert plan is not None
    assert plan.row_prefix.tolist() == [20, 4, 20, 4, 20]
    assert plan.groups == 2


def test_prefix_groups_needs_two_rows_sharing_min_prefix() -> None:
    ids, lengths = _rows([[1, 2, 3, 4], [1, 2, 5, 6]])
    assert prefix_groups(ids, lengths, min_prefix=3) is None
    assert prefix_groups(ids[:1], lengths[:1], min_prefix=1) is None
    plan = prefix_groups(ids, lengths, min_prefix=2)
    assert plan is not None and plan.row_prefix.tolist() == [2, 2]
    # two equal rows keep their last token each
    same = prefix_groups(ids[[0, 0]], lengths[[0, 0]], min_prefix=1)
    assert same is not None and same.row_prefix.tolist() == [3, 3]


def _tiny(arch: str) -> Any:
    kind = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[arch]
    config = kind(
        vocab_size=TOK.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=TOK.eos_token_id,
        pad_token_id=TOK.pad_token_id,
    )
    model_class = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}[arch]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        return model_class(config).eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three groups sharing prefixes of 50, 31 and 70 tokens (the second's two rows also share their next
    12), a row alone, a 20-token template every row starts with, right padding; policy tokens from column
    25 on, so some lie inside a group's prefix."""
    gen = torch.Generator().manual_seed(11)

    def rand(n: int) -> list[int]:
        return torch.randint(0, TOK.vocab_size, (n,), generator=gen).tolist()

    template = rand(20)
    g1, g2, g3 = template + rand(30), template + rand(11), template + rand(50)
    g2_sub = g2 + rand(12)
    rows = [
        g1 + rand(40),
        g2_sub + rand(9),
        g1 + rand(25),
        g3 + rand(30),
        template + rand(40),  # alone: shares only the template
        g2 + rand(50),
        g1 + rand(33),
        g2_sub + rand(4),
        g3 + rand(2),
    ]
    width = max(len(r) for r in rows) + 3  # a padded column past every row
    ids = torch.full((len(rows), width), TOK.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    score = mask.bool().clone()
    score[:, :25] = False
    return ids, mask, score


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_group_prefixes_give_the_whole_batch_log_probs_and_gradients(arch: str, dtype: torch.dtype) -> None:
    """Log-probs, entropies and every parameter's gradient equal the plain forward's over the whole batch,
    and the model reads fewer tokens: each group's prefix once."""
    model = _tiny(arch).to(dtype)
    ids, mask, score = _batch()
    seen: list[int] = []
    hook = model.base_model.register_forward_pre_hook(
        lambda _m, args, kwargs: seen.append(int(kwargs["input_ids"].numel())), with_kwargs=True
    )

    def run(scoring: ScoringOptions) -> list[torch.Tensor]:
        model.zero_grad()
        logp, entropy = token_logprobs(model, ids, mask, with_entropy=True, score_mask=score, scoring=scoring)
        assert entropy is not None
        weights = torch.linspace(0.5, 1.5, ids.shape[1], dtype=logp.dtype)
        ((logp * weights).sum() + 0.1 * entropy.sum()).backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return [logp.detach(), entropy.detach(), *grads]

    grouped = run(ScoringOptions(group_prefixes=True))
    grouped_calls = list(seen)
    seen.clear()
    whole = run(ScoringOptions(shared_prefix_min=0))
    hook.remove()
    assert seen == [ids.numel()]
    # two forwards: the groups' prefixes (and the row alone, whole), then the grouped rows' own tokens
    assert len(grouped_calls) == 2 and sum(grouped_calls) < 0.8 * ids.numel()
    assert len(grouped) == len(whole) > 2
    assert bool(score.any()) and float(grouped[0].abs().sum()) > 0
    # float64: the log-softmax still runs in float32 (every log-prob is float32), so the gradients keep its
    # rounding; measured max |Δ|: log-probs 0, gradients 1.1e-6 of a largest 15.9
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-6, "atol": 2e-6}
    for a, b in zip(grouped, whole, strict=True):
        torch.testing.assert_close(a, b, **tol)
    if dtype == torch.float64:
        assert torch.equal(grouped[0], whole[0])


def test_group_prefixes_fall_back_for_left_padding_and_a_single_row() -> None:
    """Left-padded rows and a batch of one row take the whole-batch path: the same values."""
    model = _tiny("qwen2")
    ids, mask, score = _batch()
    flipped = [ids.flip(1), mask.flip(1), score.flip(1)]
    for args in (flipped, [ids[:1], mask[:1], score[:1]]):
        a, _ = token_logprobs(
            model, *args[:2], score_mask=args[2], scoring=ScoringOptions(group_prefixes=True)
        )
        b, _ = token_logprobs(
            model, *args[:2], score_mask=args[2], scoring=ScoringOptions(shared_prefix_min=0)
        )
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_grpo_step_with_shared_prefix_logs_the_same_metrics(
    tmp_path: Path, grpo_config: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--shared-prefix``: the trainer's scoring reads each group's prefix once (the grouped path runs in
    its updates and re-scoring passes), and one step's metrics equal those of the plain path."""
    import searchgym.agents.llm.scoring as scoring
    from searchgym.agents.grpo.trainer import GRPOTrainer

    grouped_calls: list[bool] = []
    plain = scoring._grouped_hidden

    def counted(*args: Any) -> torch.Tensor | None:
        out = plain(*args)
        grouped_calls.append(out is not None)
        return out

    monkeypatch.setattr(scoring, "_grouped_hidden", counted)
    sizes = {"max_turns": 2, "max_turn_tokens": 8, "questions_per_step": 2, "group_size": 3}
    sizes |= {"minibatch_size": 6, "epochs": 2, "onpolicy_probe_size": 0, "ledger_size": 0, "probe_size": 4}
    metrics = {}
    for on in (False, True):
        trainer = GRPOTrainer(grpo_config(tmp_path / str(on), shared_prefix=on, **sizes))
        assert trainer.policy.scoring.group_prefixes is on
        metrics[on] = {k: v for k, v in trainer.train_step().items() if not k.startswith("time/")}
    assert any(grouped_calls) and all(grouped_calls)  # only the run with the option asked, and it applied
    assert metrics[True].keys() == metrics[False].keys()
    for key, value in metrics[False].items():
        assert math.isclose(metrics[True][key], value, rel_tol=1e-5, abs_tol=1e-5) or (
            math.isnan(value) and math.isnan(metrics[True][key])
        ), key
