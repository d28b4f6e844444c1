"""The KV cache kept across tool turns is token-exact: same seed, same transcripts and log-probabilities.

Checked on a tiny Llama- and a tiny Qwen2-architecture model built from ``transformers`` configs, through
the GRPO rollout path (:func:`collect_rollouts`: turns, tool observations, groups sharing a prompt).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from searchgym.agents.llm import LLMPolicy, ScoringOptions, tiny_causal_lm
from searchgym.agents.training.rollout import collect_rollouts
from searchgym.envs.vector import SearchQAVectorEnv
from searchgym.tokenization import builtin_tokenizer

transformers = pytest.importorskip("transformers")

TOK = builtin_tokenizer()


def tiny_llama() -> Any:
    config = transformers.LlamaConfig(
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
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return transformers.LlamaForCausalLM(config).eval()


def tiny_qwen2() -> Any:
    return tiny_causal_lm(
        TOK.vocab_size,
        layers=2,
        hidden=64,
        seed=2,
        eos_token_id=TOK.eos_token_id,
        pad_token_id=TOK.pad_token_id,
    )


class CountingModel(torch.nn.Module):
    """Wraps a causal LM and counts the input tokens of every forward (to see what the cache saves)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.inner = model
        self.fed = 0

    def forward(self, input_ids: torch.Tensor, cache: Any = None, **kwargs: Any) -> Any:
        self.fed += int(input_ids.numel())
        return self.inner(input_ids=input_ids, **({"cache": cache} if cache is not None else {}), **kwargs)

    def get_output_embeddings(self) -> Any:
        return self.inner.get_output_embeddings()

    @property
    def config(self) -> Any:  # type: ignore[override]
        return self.inner.config


def rollout(model: Any, reuse_cache: bool, greedy: bool, seed: int = 7) -> Any:
    policy = LLMPolicy(
        model, TOK, temperature=0.9, greedy=greedy, max_turn_tokens=20, reuse_cache=reuse_cache
    )
    env = SearchQAVectorEnv(
        6, autoreset_mode="Disabled", tokenizer=TOK, max_turn_tokens=20, max_context_tokens=400, max_turns=3
    )
    policy.reset({}, seed=seed)
    batch = collect_rollouts(env, policy, seed=seed, group_size=3)
    env.close()
    return batch


@pytest.mark.parametrize("build", [tiny_llama, tiny_qwen2], ids=["llama", "qwen2"])
@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_cross_turn_cache_gives_the_same_transcripts_and_logprobs(build: Any, greedy: bool) -> None:
    model = build()
    fresh = rollout(model, reuse_cache=False, greedy=greedy)
    cached = rollout(model, reuse_cache=True, greedy=greedy)
    assert torch.equal(fresh.tokens, cached.tokens) and torch.equal(fresh.sources, cached.sources)
    assert torch.equal(fresh.rewards, cached.rewards)
    mask = fresh.loss_mask
    assert torch.allclose(fresh.logp_old[mask], cached.logp_old[mask], atol=1e-4)
    # Several turns with tool output in between were played, so the cache was reused, not only built.
    assert max(i["turn"] for i in fresh.infos) >= 2


def test_the_cache_feeds_only_new_tokens_and_reads_a_shared_prompt_once() -> None:
    counts = {}
    for reuse in (False, True):
        model = CountingModel(tiny_qwen2())
        rollout(model, reuse_cache=reuse, greedy=True)
        counts[reuse] = model.fed
    assert counts[True] < counts[False]


@pytest.mark.parametrize("build", [tiny_llama, tiny_qwen2], ids=["llama", "qwen2"])
def test_equal_contexts_are_extended_once_with_the_same_results(build: Any) -> None:
    """Greedy responses of a group write the same turn and get the same tool output, so their next contexts
    are equal: they are read once, and the transcripts and log-probs are those of reading each one."""
    batches, fed = {}, {}
    for share in (False, True):
        model = CountingModel(build())
        policy = LLMPolicy(model, TOK, greedy=True, max_turn_tokens=20)
        policy._prefill.share_extensions = share
        env = SearchQAVectorEnv(
            6,
            autoreset_mode="Disabled",
            tokenizer=TOK,
            max_turn_tokens=20,
            max_context_tokens=400,
            max_turns=3,
        )
        policy.reset({}, seed=7)
        batches[share] = collect_rollouts(env, policy, seed=7, group_size=3)
        env.close()
        fed[share] = model.fed
    assert torch.equal(batches[False].tokens, batches[True].tokens)
    assert torch.equal(batches[False].logp_old, batches[True].logp_old)
    assert max(i["turn"] for i in batches[True].infos) >= 2 and fed[True] < fed[False]


def test_a_parameter_update_invalidates_the_kept_cache() -> None:
    model = tiny_qwen2()
    policy = LLMPolicy(model, TOK, greedy=True, max_turn_tokens=4)
    context = TOK.encode("Question: who built the tower?\n")
    (first,) = policy.generate_segments([context], keep_cache=True)
    follow = context + first.tokens + TOK.encode("\n\n<information>Doc 1 x</information>\n\n")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    (kept,) = policy.generate_segments([follow], keep_cache=True)
    policy.clear_cache()
    (fresh,) = policy.generate_segments([follow])
    assert kept.tokens == fresh.tokens
    assert torch.allclose(kept.logprobs, fresh.logprobs, atol=1e-4)


# -- scoring: a prefix the rows share is read once ----------------------------------------------------


@pytest.mark.parametrize("build", [tiny_llama, tiny_qwen2])
@pytest.mark.parametrize("rows", [4, 1])
def test_scoring_reads_a_shared_prefix_once_with_the_same_values_and_gradients(build: Any, rows: int) -> None:
    """Right-padded rows that start with the same 40 tokens (a group's prompt): log-probs, entropies and
    every parameter's gradient equal the whole-batch forward's, and the prefix runs through the model once."""
    import searchgym.agents.llm as llm

    model = build()
    gen = torch.Generator().manual_seed(5)
    lengths = [90, 71, 64, 55][:rows]
    ids = torch.full((rows, 90), TOK.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    prefix = torch.randint(0, TOK.vocab_size, (40,), generator=gen)
    for i, n in enumerate(lengths):
        ids[i, :40] = prefix
        ids[i, 40:n] = torch.randint(0, TOK.vocab_size, (n - 40,), generator=gen)
        mask[i, :n] = 1
    score = mask.bool().clone()
    score[:, :30] = False  # policy tokens start inside the shared prefix, as a first "<search>" may
    seen: list[int] = []
    hook = model.base_model.register_forward_pre_hook(
        lambda _m, args, kwargs: seen.append(int(kwargs["input_ids"].numel())), with_kwargs=True
    )

    def run(scoring: ScoringOptions) -> list[torch.Tensor]:
        model.zero_grad()
        logp, entropy = llm.token_logprobs(
            model, ids, mask, with_entropy=True, score_mask=score, scoring=scoring
        )
        assert entropy is not None
        (logp.sum() + 0.1 * entropy.sum()).backward()
        return [
            logp.detach(),
            entropy.detach(),
            *(p.grad.clone() for p in model.parameters() if p.grad is not None),
        ]

    shared = run(ScoringOptions())
    shared_tokens = sum(seen)
    seen.clear()
    whole = run(ScoringOptions(shared_prefix_min=0))
    hook.remove()
    assert sum(seen) == ids.numel()
    # One row: nothing to share. Several: the 40-token prefix is read once, not once per row.
    assert shared_tokens == (ids.numel() if rows == 1 else ids.numel() - 40 * (rows - 1))
    assert len(shared) == len(whole) > 2
    for a, b in zip(shared, whole, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_shared_prefix_length() -> None:
    from searchgym.agents.llm.scoring import _shared_prefix

    ids = torch.tensor([[1, 2, 3, 4, 0], [1, 2, 3, 5, 6], [1, 2, 3, 4, 7]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert _shared_prefix(ids, mask) == 3
    assert _shared_prefix(ids[[0, 2]], mask[[0, 2]]) == 4  # the pad at 4 is not shared
    assert _shared_prefix(ids[:1], mask[:1]) == 0
    assert _shared_prefix(ids[:, 1:], mask[:, 1:]) == 2
