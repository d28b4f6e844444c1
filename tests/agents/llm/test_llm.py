"""The LLM policy on the tiny offline model: stops, log-probabilities, vocabulary masking, acting."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import searchgym  # noqa: F401 - registers the environments
from searchgym.agents.evaluate import run_episode
from searchgym.agents.llm import LLMPolicy, ScoringOptions, tiny_causal_lm, token_logprobs
from searchgym.errors import ConfigError, MissingDependencyError, install_command
from searchgym.protocol import Source
from searchgym.tokenization import builtin_tokenizer

TOK = builtin_tokenizer()
VOCAB = TOK.vocab_size


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_causal_lm(VOCAB, seed=0, eos_token_id=TOK.eos_token_id, pad_token_id=TOK.pad_token_id)


def force(model: Any, scripts: Sequence[Sequence[int]]) -> Any:
    """Makes ``model`` write ``scripts[b]`` for row ``b``, one id per forward call (prefill included)."""
    calls = {"n": 0}

    def hook(_module: Any, _inputs: Any, logits: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(logits, -1e4)
        for b, script in enumerate(scripts):
            out[b, -1, script[min(calls["n"], len(script) - 1)]] = 1e4
        calls["n"] += 1
        return out

    return model.get_output_embeddings().register_forward_hook(hook)


def right_padded(seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(list(s))
        mask[i, : len(s)] = 1
    return ids, mask


def test_tiny_model_shape_and_determinism(model: Any) -> None:
    assert model.config.vocab_size == VOCAB
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    again = tiny_causal_lm(VOCAB, seed=0, eos_token_id=TOK.eos_token_id, pad_token_id=TOK.pad_token_id)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))


def test_generation_logprobs_match_scoring(model: Any) -> None:
    policy = LLMPolicy(model, TOK, temperature=0.7, max_turn_tokens=12, seed=3)
    contexts = [
        TOK.encode("Question: who wrote it?\n"),
        TOK.encode("hi"),
        TOK.encode("a longer context " * 4),
    ]
    segments = policy.generate_segments(contexts)
    assert [len(s.tokens) for s in segments] == [len(s.logprobs) for s in segments]
    assert all(1 <= len(s.tokens) <= 12 for s in segments)
    ids, mask = right_padded([c + s.tokens for c, s in zip(contexts, segments, strict=True)])
    logp, entropy = policy.token_logprobs(ids, mask, with_entropy=True)
    assert (
        entropy is not None and (entropy[:, 1:][mask[:, 1:].bool()] > 0).all() and (entropy[:, 0] == 0).all()
    )
    for i, (context, seg) in enumerate(zip(contexts, segments, strict=True)):
        got = logp[i, len(context) : len(context) + len(seg.tokens)]
        assert torch.allclose(got, seg.logprobs, atol=1e-4)
    # Left padding gives the same numbers as right padding.
    seqs = [c + s.tokens for c, s in zip(contexts, segments, strict=True)]
    width = ids.shape[1]
    left = torch.stack(
        [torch.cat([torch.zeros(width - len(s), dtype=torch.long), torch.tensor(s)]) for s in seqs]
    )
    left_mask = torch.stack(
        [torch.cat([torch.zeros(width - len(s)), torch.ones(len(s))]) for s in seqs]
    ).long()
    logp_left, _ = token_logprobs(model, left, left_mask, vocab_size=VOCAB, temperature=0.7)
    for i, s in enumerate(seqs):
        assert torch.allclose(logp_left[i, width - len(s) :], logp[i, : len(s)], atol=1e-4)
    # Sampling is reproducible through the policy's generator.
    policy.reset({}, seed=3)
    assert [s.tokens for s in policy.generate_segments(contexts)] == [s.tokens for s in segments]


def test_segments_stop_exactly_where_the_env_stops(model: Any) -> None:
    search = TOK.encode("<think>x</think><search> who </search> junk after")
    answer = TOK.encode("<answer> Paris </answer> and more")
    plain = TOK.encode(" word" * 30)
    assert TOK.eos_token_id is not None
    eos = [*TOK.encode(" bye"), TOK.eos_token_id, *TOK.encode(" more")]

    def ends_at(ids: list[int], tag: bytes) -> int:
        return next(k for k in range(len(ids)) if tag in TOK.decode_bytes(ids[: k + 1]))

    policy = LLMPolicy(model, TOK, greedy=True, max_turn_tokens=24)
    assert max(len(search), len(answer)) < 24 < len(plain)
    handle = force(model, [search, answer, plain, eos])
    try:
        segs = policy.generate_segments([TOK.encode("q1"), TOK.encode("question two"), [5], [7, 8]])
    finally:
        handle.remove()
    assert segs[0].stop == "</search>" and segs[0].tokens == search[: ends_at(search, b"</search>") + 1]
    assert segs[1].stop == "</answer>" and segs[1].tokens == answer[: ends_at(answer, b"</answer>") + 1]
    assert segs[2].stop == "max_turn_tokens" and segs[2].tokens == plain[:24]
    assert segs[3].stop == "eos" and segs[3].tokens == eos[: eos.index(TOK.eos_token_id) + 1]

    handle = force(model, [plain])
    try:
        (seg,) = policy.generate_segments([TOK.encode("ctx")], max_context_tokens=len(TOK.encode("ctx")) + 3)
    finally:
        handle.remove()
    assert seg.stop == "context_limit" and len(seg.tokens) == 3


def test_rollout_segments_continue_a_started_turn(model: Any) -> None:
    """Policy tokens already written in the turn count towards its closing tag and its cap."""
    prompt, tool = TOK.encode("Question: q\n"), TOK.encode("<information>doc</information>")
    started = TOK.encode("<search> q </sea")
    rest = TOK.encode("rch> tail tail")
    ids = prompt + tool + started
    size = 64
    obs = {
        "tokens": np.zeros(size, dtype=np.int64),
        "sources": np.zeros(size, dtype=np.int8),
        "length": np.array([len(ids)], dtype=np.int64),
    }
    obs["tokens"][: len(ids)] = ids
    obs["sources"][: len(prompt)] = Source.PROMPT
    obs["sources"][len(prompt) : len(prompt) + len(tool)] = Source.TOOL
    obs["sources"][len(prompt) + len(tool) : len(ids)] = Source.POLICY
    policy = LLMPolicy(model, TOK, greedy=True, max_turn_tokens=len(started) + 5)
    handle = force(model, [rest])
    try:
        (seg,) = policy.rollout_segments([obs])
    finally:
        handle.remove()
    assert seg.stop == "</search>" and TOK.decode(started + seg.tokens).endswith("</search>")
    policy.max_turn_tokens = len(started) + 1
    handle = force(model, [rest])
    try:
        assert policy.generate([obs], [{}]) == [rest[:1]]
    finally:
        handle.remove()


def test_ids_beyond_the_real_vocabulary_are_never_sampled() -> None:
    padded = tiny_causal_lm(VOCAB + 64, seed=1)

    def hook(_m: Any, _i: Any, logits: torch.Tensor) -> torch.Tensor:
        out = logits.clone()
        out[..., VOCAB:] = 1e4  # the padded ids would win every draw if they were allowed
        return out

    handle = padded.get_output_embeddings().register_forward_hook(hook)
    try:
        for greedy in (False, True):
            policy = LLMPolicy(padded, TOK, greedy=greedy, max_turn_tokens=8, seed=0)
            segs = policy.generate_segments([TOK.encode("a b c"), TOK.encode("d")])
            assert all(0 <= t < VOCAB for s in segs for t in s.tokens)
            assert all(torch.isfinite(s.logprobs).all() for s in segs)
            obs = {"tokens": np.array(TOK.encode("a b c")), "length": np.array([3])}
            assert 0 <= policy.act(obs, {}) < VOCAB
        ids, mask = right_padded([TOK.encode("a b c") + segs[0].tokens])
        logp, _ = token_logprobs(padded, ids, mask, vocab_size=VOCAB)
        assert torch.isfinite(logp).all() and (logp <= 0).all()
        assert torch.allclose(logp[0, 3:], segs[0].logprobs, atol=1e-4)
    finally:
        handle.remove()
    with pytest.raises(ConfigError, match="logits"):
        LLMPolicy(tiny_causal_lm(VOCAB - 1), TOK)


def test_act_with_kv_cache_matches_batched_generation(model: Any) -> None:
    policy = LLMPolicy(model, TOK, greedy=True, max_turn_tokens=6)
    context = TOK.encode("Question: where is the tower?\n")
    (segment,) = policy.generate_segments([context])
    policy.reset({})
    fed: list[int] = []  # how many new tokens each forward call received
    handle = model.get_input_embeddings().register_forward_hook(lambda _m, i, _o: fed.append(i[0].shape[1]))
    try:
        ids = list(context)
        for expected in segment.tokens:
            obs = {"tokens": np.array(ids + [0] * 5), "length": np.array([len(ids)])}
            token = policy.act(obs, {})
            assert token == expected
            ids.append(token)
        # Tool text appended after a turn extends the cache by several tokens at once.
        tool = TOK.encode("\n\n<information>Doc 1 x</information>\n\n")
        ids += tool
        token = policy.act({"tokens": np.array(ids), "length": np.array([len(ids)])}, {})
    finally:
        handle.remove()
    assert fed == [len(context)] + [1] * (len(segment.tokens) - 1) + [1 + len(tool)]
    policy.reset({})
    fresh = policy.act({"tokens": np.array(ids), "length": np.array([len(ids)])}, {})
    assert token == fresh


def test_tiny_policy_plays_an_episode_token_by_token() -> None:
    env = gym.make("SearchQA-v0", max_turns=2, max_turn_tokens=12)
    policy = LLMPolicy.tiny(seed=0)
    record = run_episode(env, policy, seed=0)
    assert record.info["end_reason"] in ("answered", "turn_budget", "context_limit")
    assert 1 <= record.steps <= 24 and record.info["policy_tokens"] == record.steps
    env.close()


def test_from_pretrained_loads_a_saved_model(model: Any, tmp_path: Path) -> None:
    model.save_pretrained(tmp_path)
    TOK.to_transformers().save_pretrained(tmp_path)
    loaded = LLMPolicy.from_pretrained(str(tmp_path), greedy=True, max_turn_tokens=5)
    assert loaded.tokenizer.vocab_size == VOCAB and loaded.tokenizer.eos_token_id == TOK.eos_token_id
    context = TOK.encode("same weights, same tokens")
    original = LLMPolicy(model, TOK, greedy=True, max_turn_tokens=5)
    assert loaded.generate_segments([context])[0].tokens == original.generate_segments([context])[0].tokens


def test_missing_transformers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingDependencyError, match=re.escape(install_command("train"))):
        LLMPolicy.from_pretrained("some/model")


def test_bad_arguments() -> None:
    model = tiny_causal_lm(VOCAB)
    with pytest.raises(ConfigError, match="temperature"):
        LLMPolicy(model, TOK, temperature=0.0)
    with pytest.raises(ConfigError, match="max_turn_tokens"):
        LLMPolicy(model, TOK, max_turn_tokens=0)
    assert LLMPolicy(model, TOK).generate_segments([]) == []


# -- the fused log-prob and entropy of the output layer ----------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_logprob_and_entropy_match_plain_autograd(temperature: float) -> None:
    """The hand-written backward is the gradient of the plain formula: values and gradients of every input,
    for any mix of weights on the picked log-prob and on the entropy, with ids beyond ``vocab`` dropped."""
    from searchgym.agents.llm.scoring import _picked_logprobs, _picked_logprobs_reference, _PickedLogProb

    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 7, 40, generator=gen, dtype=torch.float64)).requires_grad_()
    target = torch.randint(0, 33, (2, 7), generator=gen)
    g_picked, g_entropy = (
        torch.randn(2, 7, generator=gen, dtype=torch.float64),
        torch.randn(2, 7, generator=gen),
    )

    def run(fn: Any) -> tuple[torch.Tensor, ...]:
        logits.grad = None
        picked, entropy = fn(logits, target, 33, temperature, True)
        (picked * g_picked + entropy * g_entropy).sum().backward()
        return picked.detach(), entropy.detach(), logits.grad.clone()

    fused, plain = run(_picked_logprobs), run(_picked_logprobs_reference)
    for a, b in zip(fused, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # both compute in float32
    assert fused[2][..., 33:].abs().max() == 0  # ids beyond the vocabulary take no gradient
    # The backward itself, against finite differences in float64.
    z = (logits.detach()[..., :33] / temperature).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: _PickedLogProb.apply(x, target), (z,))


def test_fused_scoring_equals_plain_scoring_without_gradients() -> None:
    """No-grad and entropy-free calls skip the autograd function: the same values, and the picked log-prob
    bit for bit equal to the gradient path's (``pi_old`` may come from a forward with or without grad)."""
    from searchgym.agents.llm.scoring import _picked_logprobs, _picked_logprobs_reference

    gen = torch.Generator().manual_seed(1)
    logits = 4 * torch.randn(64, 50, generator=gen)
    target = torch.randint(0, 48, (64,), generator=gen)
    for with_entropy in (False, True):
        with torch.no_grad():
            picked, entropy = _picked_logprobs(logits, target, 48, 1.0, with_entropy)
            ref_picked, ref_entropy = _picked_logprobs_reference(logits, target, 48, 1.0, with_entropy)
        torch.testing.assert_close(picked, ref_picked)
        assert (entropy is None) == (ref_entropy is None) == (not with_entropy)
        if entropy is not None and ref_entropy is not None:
            torch.testing.assert_close(entropy, ref_entropy)
    graded, _ = _picked_logprobs(logits.clone().requires_grad_(), target, 48, 1.0, True)
    with torch.inference_mode():
        scored, _ = _picked_logprobs(logits, target, 48, 1.0, False)
    assert torch.equal(graded.detach(), scored)


def test_token_logprobs_gradients_match_the_plain_path() -> None:
    """Through the whole model, with and without ``score_mask``: the fused output layer gives the same
    log-probs, entropies and parameter gradients as autograd through ``log_softmax`` (an embedding padded
    beyond the tokenizer's vocabulary, with such an id in a sequence)."""
    model = tiny_causal_lm(VOCAB + 64, seed=3)

    ids, mask = right_padded([[5, 9, 120, 7, 3, 2000], [11, 12, 13], [40, VOCAB + 3, 41, 42]])
    score = torch.zeros_like(mask, dtype=torch.bool)
    score[:, 2:] = True

    def run(score_mask: torch.Tensor | None, fused: bool) -> list[torch.Tensor]:
        model.zero_grad()
        logp, entropy = token_logprobs(
            model,
            ids,
            mask,
            vocab_size=VOCAB,
            temperature=0.9,
            with_entropy=True,
            score_mask=score_mask,
            scoring=ScoringOptions(fused=fused),
        )
        assert entropy is not None
        (logp.sum() + 0.1 * entropy.sum()).backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return [logp.detach(), entropy.detach(), *grads]

    for score_mask in (None, score):
        fused = run(score_mask, fused=True)
        plain = run(score_mask, fused=False)
        assert len(fused) == len(plain) > 2
        for a, b in zip(fused, plain, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
