"""Where a transcript's answer span lies, from its bytes."""

from __future__ import annotations

import torch

from searchgym.agents.grpo.spans import answer_span_mask, llds_ma_weights
from searchgym.protocol import Source
from searchgym.tokenization import builtin_tokenizer

P, T, PR = int(Source.POLICY), int(Source.TOOL), int(Source.PROMPT)


def test_answer_span_mask_finds_the_last_actions_answer() -> None:
    tok = builtin_tokenizer()
    prompt = tok.encode("For example, <answer> Beijing </answer>. Question: where?\n")
    search = tok.encode("<search> city </search>")
    info = tok.encode("\n\n<information>Doc 1 <answer> Rome </answer></information>\n\n")
    think = tok.encode("<think>ok</think> ")
    answer = tok.encode("<answer> Paris </answer>")
    rows = [
        [(prompt, PR), (search, P), (info, T), (think + answer, P)],
        [(prompt, PR), (answer, P), (info, T), (search, P)],  # last action searched (turn budget)
        [(prompt, PR), (think, P)],
    ]
    width = max(sum(len(ids) for ids, _ in r) for r in rows)
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    sources = torch.zeros(len(rows), width, dtype=torch.int8)
    for b, row in enumerate(rows):
        at = 0
        for ids, src in row:
            tokens[b, at : at + len(ids)] = torch.tensor(ids)
            sources[b, at : at + len(ids)] = src
            at += len(ids)
    mask = answer_span_mask(tokens, sources, tok.token_bytes)
    start = len(prompt) + len(search) + len(info) + len(think)
    expected = torch.zeros_like(mask)
    expected[0, start : start + len(answer)] = True
    assert torch.equal(mask, expected)
    assert tok.decode(tokens[0][mask[0]].tolist()) == "<answer> Paris </answer>"


def test_answer_span_covers_tokens_that_share_bytes_with_the_tags() -> None:
    tok = builtin_tokenizer()
    ids = tok.encode("so <answer> x </answer>")  # " <" holds the space before the tag
    tokens = torch.tensor([ids])
    mask = answer_span_mask(tokens, torch.full_like(tokens, P), tok.token_bytes)
    first = next(i for i in range(len(ids)) if b"<" in tok.token_bytes[ids[i]])
    assert mask[0, first:].all() and not mask[0, :first].any()


# -- diagnostics and the total -------------------------------------------------------------------------


def test_llds_ma_weights_put_beta_on_the_answer_span_only() -> None:
    tok = builtin_tokenizer()
    prompt, search = tok.encode("Question: where?\n"), tok.encode("<search> city </search>")
    info, answer = (
        tok.encode("\n\n<information>Doc 1</information>\n\n"),
        tok.encode("<answer> Paris </answer>"),
    )
    parts = [(prompt, PR), (search, P), (info, T), (answer, P)]
    tokens = torch.tensor([[t for ids, _ in parts for t in ids]])
    sources = torch.tensor([[src for ids, src in parts for _ in ids]])
    span = answer_span_mask(tokens, sources, tok.token_bytes)
    weights, beta = llds_ma_weights(tokens, sources, tok.token_bytes, mean_searches=3.0, beta=0.25)
    assert beta == 0.25 and torch.equal(weights, torch.where(span, 0.25, 1.0))
    # Adaptive: the released code's clip(V - 1, 0, 1) and the paper's min(V / 2, 1) at V = 1.5 searches
    assert llds_ma_weights(tokens, sources, tok.token_bytes, 1.5)[1] == 0.5
    assert llds_ma_weights(tokens, sources, tok.token_bytes, 1.5, schedule="paper")[1] == 0.75
