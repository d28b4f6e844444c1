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
from searchgym.agents.llm.prefix_groups import PrefixLevels, prefix_levels
from searchgym.tokenization import builtin_tokenizer

transformers = pytest.importorskip("transformers")

TOK = builtin_tokenizer()


def _rows(rows: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    return ids, torch.tensor([len(r) for r in rows])


def _plan(rows: list[list[int]], min_prefix: int = 1, call_slots: float = 0.0) -> PrefixLevels | None:
    ids, lengths = _rows(rows)
    return prefix_levels(ids, lengths, min_prefix, call_slots)


def test_levels_read_the_template_once_and_each_groups_prefix_once_per_group() -> None:
    template = [1, 2, 3, 4]
    a, b = [*template, 5, 5, 5, 5, 5, 5], [*template, 6, 6, 6, 6]
    rows = [
        [*a, 10],
        [*b, 11, 12, 9],
        [*a, 13, 9],
        [*b, 14, 9, 9],
        [*a, 15],
        [*template, 7, 7, 7, 7, 7, 7, 7],
    ]
    plan = _plan(rows)
    assert plan is not None
    # the template (4 columns) once; the next 4 once for a's rows, once for b's, once for the row alone;
    # a's last 2 once for a's (b's two rows part there); then every row's own columns
    assert plan.cuts == [4, 8, 10]
    assert [len(f) for f in plan.first] == [1, 3, 4]
    assert plan.owner[2][0] == plan.owner[2][2] == plan.owner[2][4]
    assert len({int(plan.owner[2][r]) for r in (0, 1, 5)}) == 3 and plan.owner[1][1] == plan.owner[1][3]
    width = max(len(r) for r in rows)
    assert plan.slots(width) == 4 * 1 + 4 * 3 + 2 * 4 + 6 * (width - 10)
    for level in (1, 2):  # each distinct prefix extends its parent's
        for j, r in enumerate(plan.first[level].tolist()):
            parent_row = int(plan.first[level - 1][plan.parent(level)[j]])
            assert rows[r][: plan.cuts[level - 1]] == rows[parent_row][: plan.cuts[level - 1]]


def test_levels_weigh_a_further_forward_against_the_slots_it_saves() -> None:
    # Two rows share 10 tokens, all three share 4; 11 columns. Slots: [4, 10] 4 + 2*6 + 3 = 19 (two extra
    # forwards), [10] 2*10 + 3 = 23, [4] 4 + 3*7 = 25, every row whole 33 (one forward).
    shared = list(range(1, 11))
    rows = [[*shared, 20], [*shared, 21], [1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 22]]
    assert _plan(rows).cuts == [4, 10]  # type: ignore[union-attr]
    assert _plan(rows, call_slots=5).cuts == [10]  # type: ignore[union-attr]
    assert _plan(rows, call_slots=100) is None  # nothing saves a forward's cost
    assert _plan(rows, min_prefix=5).cuts == [10]  # type: ignore[union-attr]


def test_levels_need_a_shared_prefix_and_leave_every_row_a_token() -> None:
    assert _plan([[1, 2, 3], [4, 5, 6]]) is None
    assert _plan([[1, 2, 3]]) is None
    same = _plan([[1, 2, 3, 4], [1, 2, 3, 4]])
    assert same is not None and same.cuts == [3]  # equal rows still read their last token each
    # the cuts are the same columns for every row: the shortest row bounds them
    short = _plan([[1, 2], [1, 2, 3, 4, 5], [1, 2, 3, 4, 6]])
    assert short is not None and short.cuts == [1]


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
    """Three groups sharing prefixes of 170, 140 and 220 tokens (two rows of the second also share their
    next 30), a row alone, a 20-token template every row starts with, right padding; policy tokens from
    column 25 on, so most lie inside a shared prefix."""
    gen = torch.Generator().manual_seed(11)

    def rand(n: int) -> list[int]:
        return torch.randint(0, TOK.vocab_size, (n,), generator=gen).tolist()

    template = rand(20)
    g1, g2, g3 = template + rand(150), template + rand(120), template + rand(200)
    g2_sub = g2 + rand(30)
    rows = [
        g1 + rand(60),
        g2_sub + rand(60),
        g1 + rand(80),
        g3 + rand(30),
        template + rand(260),  # alone: shares only the template
        g2 + rand(120),
        g1 + rand(70),
        g2_sub + rand(65),
        g3 + rand(25),
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
    # a forward per level (here one: 140 columns, once per group and for the row alone), then every
    # row's own columns
    assert len(grouped_calls) >= 2 and sum(grouped_calls) < 0.8 * ids.numel()
    assert len(grouped) == len(whole) > 2
    assert bool(score.any()) and float(grouped[0].abs().sum()) > 0
    # float64: the log-softmax still runs in float32 (every log-prob is float32), so the gradients keep its
    # rounding; measured max |Δ|: log-probs 0, gradients 1.8e-6 (of a largest 14.8 and 92.4)
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
