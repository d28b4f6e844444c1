"""An LLM policy over any ``transformers`` causal language model: token-level acting and batched turns.

The offline default is a tiny Qwen2-style model built from a config (random weights, the built-in
tokenizer's 8192 ids, about 1.3 M parameters: small enough to train on two CPU cores). A real model is one
``LLMPolicy.from_pretrained("Qwen/Qwen2.5-0.5B")`` away.

Three ways to use the policy:

* :meth:`LLMPolicy.act` — one token per call with a KV cache carried across calls, so it plays
  ``SearchQA-v0`` through :func:`searchgym.agents.evaluate.evaluate` like any :class:`Agent`;
* :meth:`LLMPolicy.generate_segments` — one turn for many contexts at once (left padding, attention mask,
  KV cache), each stopped exactly where the environment stops it (a :class:`StopScanner` per sequence, the
  per-turn cap, the context size), returning the sampled ids and the rollout policy's log-probabilities;
* :func:`token_logprobs` — per-token log-probabilities (and entropies) of given sequences, with gradients:
  what a trainer recomputes for the ratio ``pi_theta / pi_old``.

Ids beyond the tokenizer's real vocabulary (a model's embedding is often padded to a multiple of 64 or
128) are never sampled: every distribution here is over ``Tokenizer.vocab_size`` ids only.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    import torch
    from torch import Tensor
except ImportError as e:  # pragma: no cover - depends on the installation
    from searchgym.errors import MissingDependencyError

    raise MissingDependencyError("torch", "train", "The LLM policy") from e

from searchgym.envs.episode import Source
from searchgym.errors import ConfigError, MissingDependencyError
from searchgym.protocol import StopScanner
from searchgym.tokenization import Tokenizer, load_tokenizer

from ..base import Observation, SegmentAgent

__all__ = [
    "DEFAULT_SCORING",
    "LLMPolicy",
    "ScoringOptions",
    "Segment",
    "sample_tokens",
    "tiny_causal_lm",
    "token_logprobs",
]


# -- models --------------------------------------------------------------------------------------------


def _import_transformers(purpose: str) -> Any:
    try:
        import transformers
    except ImportError as e:
        raise MissingDependencyError("transformers", "train", purpose) from e
    return transformers


def tiny_causal_lm(
    vocab_size: int = 8192,
    *,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    max_positions: int = 4096,
    seed: int = 0,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> Any:
    """A small randomly initialised Qwen2-style causal LM (tied embeddings), reproducible for a seed.

    Args:
        vocab_size: Embedding and output size (may exceed the tokenizer's vocabulary, like padded models).
        layers: Transformer blocks.
        hidden: Hidden size.
        heads: Attention heads (``hidden`` must be divisible by it).
        kv_heads: Key/value heads (grouped-query attention, as in Qwen2).
        intermediate: MLP size (default ``2 * hidden``).
        max_positions: ``max_position_embeddings`` of the config.
        seed: Seed of the initialisation (the global torch RNG is left untouched).
        eos_token_id: Written into the config (e.g. ``Tokenizer.eos_token_id``).
        pad_token_id: Written into the config.

    Returns:
        A ``transformers.Qwen2ForCausalLM`` in eval mode.
    """
    tf = _import_transformers("Building the tiny model")
    config = tf.Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,  # the embedding dominates a tiny model's size; tying halves it
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.Qwen2ForCausalLM(config)
    return model.eval()


def _output_size(model: Any) -> int:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


class _ModelIO:
    """Keyword names that changed across ``transformers`` versions, looked up once per policy.

    transformers 5 renamed ``past_key_values`` to ``cache`` (the old name still works with a warning);
    ``logits_to_keep`` lets generation compute the last position's logits only.
    """

    def __init__(self, model: Any) -> None:
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.keep_last = "logits_to_keep" in params

    def forward(self, model: Any, cache: Any, last_only: bool, **inputs: Any) -> tuple[Tensor, Any]:
        kwargs = {**inputs, "use_cache": True}
        if cache is not None:
            kwargs[self.cache_kw] = cache
        if last_only and self.keep_last:
            kwargs["logits_to_keep"] = 1
        out = model(**kwargs)
        return out.logits[:, -1], _cache_of(out)


def _cache_of(out: Any) -> Any:
    """The KV cache a model returned (its name changed across ``transformers`` versions), or ``None``."""
    keys = out.keys() if hasattr(out, "keys") else ()
    return next((out[k] for k in ("cache", "past_key_values") if k in keys), None)


# -- log-probabilities ---------------------------------------------------------------------------------


def _scaled_logits(logits: Tensor, vocab_size: int, temperature: float) -> Tensor:
    # Dropping the ids beyond the real vocabulary is the same as setting their logits to -inf, and cheaper.
    z = logits[..., :vocab_size].float()
    return z if temperature == 1.0 else z / temperature


def _log_probs(logits: Tensor, vocab_size: int, temperature: float) -> Tensor:
    return torch.log_softmax(_scaled_logits(logits, vocab_size, temperature), dim=-1)


class _PickedLogProb(torch.autograd.Function):
    """``log softmax(z)[target]`` and the entropy of ``softmax(z)``, row by row, with a hand-written backward.

    Autograd through ``log_softmax``, ``exp`` and the entropy's product keeps several vocabulary-wide
    tensors and makes about ten passes over them backwards; the output layer's softmax is most of a small
    model's element-wise work. Here the forward keeps ``t = log_softmax(z)`` and ``p = exp(t)`` and the
    backward is two passes. With ``H = -sum(p * t)``::

        d t[y] / d z = onehot(y) - p          d H / d z = -p * (t + H)

    so ``dL/dz = onehot(y) * g_y - p * (g_y + g_H * H + g_H * t)``. The picked log-probs are bit for bit
    :func:`_picked_logprobs_reference`'s; the entropies and the gradients agree to float rounding (tested,
    and the backward checked against finite differences in float64).
    """

    @staticmethod
    def forward(ctx: Any, z: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        t = torch.log_softmax(z, dim=-1)
        p = t.exp()
        entropy = -torch.linalg.vecdot(p, t)
        ctx.save_for_backward(t, p, entropy, target)
        return t.gather(-1, target.unsqueeze(-1)).squeeze(-1), entropy

    @staticmethod
    def backward(ctx: Any, g_picked: Tensor, g_entropy: Tensor) -> tuple[Tensor, None]:
        t, p, entropy, target = ctx.saved_tensors
        g_y, g_h = g_picked.unsqueeze(-1), g_entropy.unsqueeze(-1)
        grad = torch.addcmul(-(g_y + g_h * entropy.unsqueeze(-1)), t, g_h, value=-1).mul_(p)
        return grad.scatter_add_(-1, target.unsqueeze(-1), g_y), None


def _picked_logprobs(
    logits: Tensor, target: Tensor, vocab_size: int, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """``log p(target)`` under ``logits`` (over the first ``vocab_size`` ids, at ``temperature``) and, if
    asked, the distribution's entropy. ``target`` must lie below ``vocab_size``. The picked log-prob is
    the same bits with or without gradients (``pi_old`` may come from either)."""
    z = _scaled_logits(logits, vocab_size, temperature)
    if with_entropy and torch.is_grad_enabled() and z.requires_grad:
        picked, entropy = _PickedLogProb.apply(z, target)
        return picked, entropy
    t = torch.log_softmax(z, dim=-1)
    picked = t.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return picked, -torch.linalg.vecdot(t.exp(), t) if with_entropy else None


def _picked_logprobs_reference(
    logits: Tensor, target: Tensor, vocab_size: int, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """:func:`_picked_logprobs` by plain autograd through ``log_softmax``: the test oracle, and the update
    path as it was when issue 13 was filed (``searchgym bench update``'s *before*)."""
    logp = _log_probs(logits, vocab_size, temperature)
    picked = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return picked, -(logp.exp() * logp).sum(-1) if with_entropy else None


@dataclass(frozen=True)
class ScoringOptions:
    """How log-probabilities are computed. The defaults are the fast path; the other values give the
    reference paths that ``searchgym bench update`` times as its *before*, and that tests compare against.

    Attributes:
        fused: The output layer's log-softmax and entropy through the fused autograd function with its
            hand-written backward (``False``: plain autograd through ``log_softmax``).
        shared_prefix_min: :func:`token_logprobs` with a ``score_mask`` reads a prefix every row shares
            once when it is at least this long (0: never; each row reads it) and saves at least
            :data:`_SHARED_PREFIX_SAVING` of the batch's token slots (else a second forward call is not
            worth it).
        inference_mode: Gradient-free scoring (a trainer's ``pi_old``, reference and diagnostics) runs
            under ``torch.inference_mode`` (``False``: ``torch.no_grad``). See :meth:`no_grad`.
    """

    fused: bool = True
    shared_prefix_min: int = 16
    inference_mode: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.shared_prefix_min, bool) or self.shared_prefix_min < 0:
            raise ConfigError(f"shared_prefix_min must be an integer >= 0, got {self.shared_prefix_min!r}")

    def pick(
        self, logits: Tensor, target: Tensor, vocab_size: int, temperature: float, with_entropy: bool
    ) -> tuple[Tensor, Tensor | None]:
        """``log p(target)`` (and the entropy, if asked) by the chosen output-layer path."""
        fn = _picked_logprobs if self.fused else _picked_logprobs_reference
        return fn(logits, target, vocab_size, temperature, with_entropy)

    def no_grad(self) -> Any:
        """The context manager of gradient-free scoring: ``torch.inference_mode()`` or ``torch.no_grad()``."""
        return torch.inference_mode() if self.inference_mode else torch.no_grad()


DEFAULT_SCORING = ScoringOptions()
"""The options every scoring call takes unless given others: fused, shared prefixes read once."""


def sample_tokens(
    logits: Tensor,
    vocab_size: int,
    *,
    temperature: float = 1.0,
    greedy: bool = False,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Draws one id per row of ``logits``: greedy, tempered, and nucleus (top-p) sampling in one place.

    Sampling inverts the cumulative distribution: one uniform draw per row, located with ``searchsorted`` in
    the row's cumulative probabilities. That is the same categorical distribution ``torch.multinomial``
    samples, at a fraction of its cost (it needs one random number per row, not a pass that normalises and
    draws over the whole vocabulary). An id of probability 0 is never drawn: the search returns the first
    index whose cumulative sum exceeds the draw, and a zero-probability id never raises the sum.

    Args:
        logits: ``(B, V_model)`` next-token logits (any float dtype).
        vocab_size: Only ids below it are ever drawn (the tokenizer's real vocabulary).
        temperature: Logits are divided by it (> 0).
        greedy: Take the most likely id (``temperature`` and ``top_p`` then play no part in the choice).
        top_p: Nucleus sampling: draw from the smallest set of most likely ids whose probability reaches
            ``top_p`` (1.0: the whole distribution).
        generator: The random generator (on ``logits``' device); default torch's global one.

    Returns:
        ``(ids, logp)``: ``(B,)`` int64 ids and ``(B,)`` float32 ``log p(id)`` under the tempered distribution
        over the whole vocabulary, the quantity :func:`token_logprobs` recomputes (with ``top_p < 1`` the
        draw comes from the truncated distribution, so these are not the behaviour policy's exact
        probabilities).
    """
    logp = _log_probs(logits, vocab_size, temperature)
    if greedy:
        ids = logp.argmax(dim=-1)
    else:
        probs = logp.exp()
        order: Tensor | None = None
        if top_p < 1.0:
            probs, order = probs.sort(dim=-1, descending=True)
            # Keep an id when the mass before it is below top_p (the most likely id is always kept).
            before = probs.cumsum(dim=-1) - probs
            probs = torch.where(before < top_p, probs, 0.0)
        cdf = probs.cumsum(dim=-1)
        u = torch.rand((logp.shape[0], 1), generator=generator, device=logp.device) * cdf[:, -1:]
        ids = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=logp.shape[-1] - 1)
        if order is not None:
            ids = order.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return ids, logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def token_logprobs(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    vocab_size: int | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    score_mask: Tensor | None = None,
    scoring: ScoringOptions = DEFAULT_SCORING,
) -> tuple[Tensor, Tensor | None]:
    """Log-probability of every token given its prefix, under ``model`` (differentiable).

    Padding may be on either side: positions come from the attention mask, as during generation, so the
    values match those :meth:`LLMPolicy.generate_segments` returned for the same tokens.

    Args:
        model: A causal LM.
        input_ids: ``(B, T)`` token ids.
        attention_mask: ``(B, T)`` 1 on real tokens, 0 on padding.
        vocab_size: The tokenizer's real vocabulary size (distributions are over these ids only);
            default the model's output size.
        temperature: The sampling temperature the tokens were drawn with (logits are divided by it).
        with_entropy: Also return the entropy of each position's predictive distribution.
        score_mask: ``(B, T)`` bool: score only these tokens (others hold 0). The output layer then runs on
            the selected positions only, which is most of the cost when the vocabulary is large and few
            tokens count (a trainer's policy tokens). Needs a model with ``base_model`` and output
            embeddings (every ``transformers`` causal LM without logit post-processing).
        scoring: How the output layer and shared prefixes are computed (:class:`ScoringOptions`).

    Returns:
        ``(logp, entropy)``: ``(B, T)`` float32 each (``entropy`` is ``None`` unless requested). Position
        ``t`` holds ``log p(x_t | x_<t)`` and the entropy of that distribution; each sequence's first token, padding,
        and ids outside the vocabulary hold 0.
    """
    vocab = vocab_size if vocab_size is not None else _output_size(model)
    mask = attention_mask.to(torch.long)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    if score_mask is not None:
        return _selected_logprobs(
            model, input_ids, mask, positions, score_mask, vocab, temperature, with_entropy, scoring
        )
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
    target = input_ids[:, 1:]
    # A token is scored when it and its predecessor are real: the first real token has no prefix.
    real = mask[:, 1:].bool() & mask[:, :-1].bool()
    valid = real & (target < vocab)
    picked, ent_inner = scoring.pick(
        logits[:, :-1], torch.where(valid, target, 0), vocab, temperature, with_entropy
    )
    logp = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    logp[:, 1:] = torch.where(valid, picked, 0.0)
    if ent_inner is None:
        return logp, None
    entropy = torch.zeros_like(logp)
    entropy[:, 1:] = torch.where(real, ent_inner, 0.0)
    return logp, entropy


#: A prefix every row shares is read once by :func:`_hidden_states` only if that saves at least this share
#: of the batch's token slots (and it is at least :attr:`ScoringOptions.shared_prefix_min` long).
_SHARED_PREFIX_SAVING = 0.05


def _shared_prefix(input_ids: Tensor, mask: Tensor) -> int:
    """How many leading tokens every row has, identical and real (0 for a single row)."""
    if input_ids.shape[0] < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(dim=0) & mask.bool().all(dim=0)
    return int(same.long().cumprod(dim=0).sum())


def _outputs(out: Any) -> tuple[Tensor, Any]:
    """The last hidden states and the cache of a base model's output (any ``transformers`` version)."""
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    return hidden, _cache_of(out)


def _checkpointing(model: Any) -> bool:
    flag = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5.x's name
    return bool(flag if flag is not None else getattr(model, "is_gradient_checkpointing", False))


def _hidden_states(
    base: Any, input_ids: Tensor, mask: Tensor, positions: Tensor, shared_prefix_min: int
) -> Tensor:
    """``(B, T, H)`` last hidden states of right-padded rows, differentiable.

    When the rows start with the same tokens (a GRPO group's prompt, or a shared instruction template), that
    prefix is read once, for one row, and its keys and values are repeated for every row through the KV
    cache: the prefix's work is not done ``B`` times, and its gradient is the sum over the rows, as autograd
    takes it through the repeat. The result equals one forward over the whole batch up to float rounding
    (tested, gradients included). Models without a row-selectable cache, or with gradient checkpointing,
    take the whole batch in one forward, and so does a prefix shorter than ``shared_prefix_min`` (0: always).
    """
    prefix = _shared_prefix(input_ids, mask)
    rows, width = input_ids.shape
    shareable = (
        shared_prefix_min
        and shared_prefix_min <= prefix < width
        and prefix * (rows - 1) >= _SHARED_PREFIX_SAVING * rows * width
        and not _checkpointing(base)
    )
    if shareable:
        cache_kw = _ModelIO(base).cache_kw
        head, cache = _outputs(
            base(input_ids=input_ids[:1, :prefix], position_ids=positions[:1, :prefix], use_cache=True)
        )
        index = torch.zeros(rows, dtype=torch.long, device=input_ids.device)
        cache = _select_rows(cache, index) if cache is not None else None
        if cache is not None:
            tail, _ = _outputs(
                base(
                    input_ids=input_ids[:, prefix:],
                    attention_mask=mask,
                    position_ids=positions[:, prefix:],
                    use_cache=True,
                    **{cache_kw: cache},
                )
            )
            return torch.cat([head.expand(rows, -1, -1), tail], dim=1)
    hidden, _ = _outputs(
        base(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False)
    )
    return hidden


def _selected_logprobs(
    model: Any,
    input_ids: Tensor,
    mask: Tensor,
    positions: Tensor,
    score_mask: Tensor,
    vocab: int,
    temperature: float,
    with_entropy: bool,
    scoring: ScoringOptions,
) -> tuple[Tensor, Tensor | None]:
    """:func:`token_logprobs` restricted to ``score_mask``: the output layer runs on those positions only."""
    hidden = _hidden_states(model.base_model, input_ids, mask, positions, scoring.shared_prefix_min)
    # Token t is predicted from the hidden state at t - 1; the first token has no prefix.
    real = mask[:, 1:].bool() & mask[:, :-1].bool() & score_mask[:, 1:].bool()
    target = input_ids[:, 1:]
    valid = real & (target < vocab)
    logits = model.get_output_embeddings()(hidden[:, :-1][real])
    picked, ent_sel = scoring.pick(
        logits, torch.where(valid, target, 0)[real], vocab, temperature, with_entropy
    )
    logp = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    inner = torch.zeros(real.shape, dtype=torch.float32, device=input_ids.device)
    inner = inner.masked_scatter(real, torch.where(valid[real], picked, 0.0))
    logp = torch.cat([logp[:, :1], inner], dim=1)
    if ent_sel is None:
        return logp, None
    ent = torch.zeros(real.shape, dtype=torch.float32, device=input_ids.device)
    ent = ent.masked_scatter(real, ent_sel)
    return logp, torch.cat([torch.zeros_like(logp[:, :1]), ent], dim=1)


# -- the policy ----------------------------------------------------------------------------------------


@dataclass
class _Session:
    """A KV cache kept between turns: row ``r`` holds ``tokens[r]`` in the columns where ``mask[r]`` is 1."""

    cache: Any
    mask: Tensor
    tokens: list[list[int]]
    version: tuple[tuple[int, int], ...]


def _parameter_version(model: Any) -> tuple[tuple[int, int], ...]:
    """Changes whenever a parameter is modified in place (an optimizer step, ``load_state_dict``) or
    replaced: a cache computed before is then stale."""
    return tuple((id(p), p._version) for p in model.parameters())


def _select_rows(cache: Any, index: Tensor) -> Any:
    """The cache with its batch rows ``index`` (repeats allowed), or ``None`` if this cache cannot do that."""
    if hasattr(cache, "reorder_cache"):  # transformers' Cache classes (DynamicCache and friends)
        try:
            cache.reorder_cache(index)
        except (NotImplementedError, AttributeError, TypeError):
            return None
        return cache
    if isinstance(cache, tuple) and all(isinstance(layer, tuple) for layer in cache):  # legacy format
        return tuple(tuple(t.index_select(0, index) for t in layer) for layer in cache)
    return None


@dataclass
class Segment:
    """One generated turn.

    Attributes:
        tokens: The sampled ids, up to and including the token where the turn ends.
        logprobs: ``(len(tokens),)`` float32 log-probabilities of those ids under the rollout policy (at the
            sampling temperature).
        stop: Why generation stopped, with the environment's names: ``"</search>"``, ``"</answer>"``,
            ``"eos"``, ``"max_turn_tokens"`` or ``"context_limit"``.
    """

    tokens: list[int]
    logprobs: Tensor
    stop: str


def _trailing_policy_run(observation: Observation) -> tuple[list[int], int]:
    """The observation's context ids and how many of its last tokens the policy wrote in this turn."""
    n = int(observation["length"][0])
    tokens = observation["tokens"][:n]
    sources = observation["sources"][:n]
    not_policy = np.flatnonzero(sources != Source.POLICY)
    run = n - (int(not_policy[-1]) + 1 if len(not_policy) else 0)
    return [int(t) for t in tokens], run


class LLMPolicy(SegmentAgent):
    """A language-model policy for SearchQA environments.

    Args:
        model: A ``transformers`` causal LM (or anything with the same ``forward``); its output size must be
            at least the tokenizer's vocabulary size.
        tokenizer: The env's tokenizer (default: the built-in one).
        temperature: Sampling temperature (> 0); log-probabilities are of the tempered distribution.
        greedy: Take the most likely token instead of sampling.
        max_turn_tokens: The env's per-turn token cap (``SearchQAEnv(max_turn_tokens=...)``).
        seed: Seed of the policy's own sampling generator (re-seeded by ``reset(seed=...)``).
        top_p: Nucleus sampling threshold (1.0, the default: the whole tempered distribution, which is what
            a trainer's ratio assumes).
        reuse_cache: Keep each sequence's KV cache across :meth:`rollout_segments` calls, so a turn after a
            tool observation feeds the model only the new tokens (see :meth:`generate_segments`).
        scoring: How :meth:`token_logprobs` computes log-probabilities (a trainer scores through it too).
    """

    name = "llm"

    def __init__(
        self,
        model: Any,
        tokenizer: Tokenizer | None = None,
        *,
        temperature: float = 1.0,
        greedy: bool = False,
        max_turn_tokens: int = 512,
        seed: int = 0,
        top_p: float = 1.0,
        reuse_cache: bool = True,
        scoring: ScoringOptions = DEFAULT_SCORING,
    ) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(None)
        if temperature <= 0:
            raise ConfigError(f"temperature must be > 0 (use greedy=True for argmax), got {temperature}")
        if max_turn_tokens < 1:
            raise ConfigError(f"max_turn_tokens must be >= 1, got {max_turn_tokens}")
        if not 0.0 < top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {top_p}")
        size = _output_size(model)
        if size < self.tokenizer.vocab_size:
            raise ConfigError(
                f"the model outputs {size} logits but tokenizer {self.tokenizer.name!r} has "
                f"{self.tokenizer.vocab_size} ids; pass the tokenizer the model was trained with"
            )
        self.temperature = temperature
        self.greedy = greedy
        self.max_turn_tokens = max_turn_tokens
        self.top_p = top_p
        self.reuse_cache = reuse_cache
        self.scoring = scoring
        self._session: _Session | None = None
        self._rows_selectable = True  # becomes False for a model whose cache rows cannot be selected
        self._io = _ModelIO(model)
        self._generator = torch.Generator(device=self.device)
        self._generator.manual_seed(seed)
        self._cache: Any = None
        self._cached_ids = np.zeros(0, dtype=np.int64)

    # -- construction ------------------------------------------------------------------------------------

    @classmethod
    def tiny(cls, tokenizer: Tokenizer | None = None, *, model_seed: int = 0, **kwargs: Any) -> LLMPolicy:
        """The offline default: :func:`tiny_causal_lm` over the (built-in) tokenizer's vocabulary.

        Args:
            tokenizer: Default: the built-in tokenizer.
            model_seed: Seed of the model's initialisation.
            **kwargs: Passed to :class:`LLMPolicy`.
        """
        tok = tokenizer if tokenizer is not None else load_tokenizer(None)
        model = tiny_causal_lm(
            tok.vocab_size, seed=model_seed, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
        )
        return cls(model, tok, **kwargs)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        tokenizer: Any = None,
        *,
        dtype: Any = None,
        device: str | None = None,
        **kwargs: Any,
    ) -> LLMPolicy:
        """Loads a model (and, unless given, its tokenizer) by Hugging Face name or local path.

        Args:
            name_or_path: For ``AutoModelForCausalLM.from_pretrained``.
            tokenizer: Anything :func:`searchgym.tokenization.load_tokenizer` accepts; default the same
                name or path.
            dtype: Model dtype (e.g. ``torch.bfloat16``); default the checkpoint's.
            device: Where to put the model (``"cuda"``, ``"cpu"``…); default where it loads.
            **kwargs: Passed to :class:`LLMPolicy`.

        Raises:
            MissingDependencyError: ``transformers`` is not installed (the ``train`` extra).
        """
        tf = _import_transformers(f"Loading model {name_or_path!r}")
        model = tf.AutoModelForCausalLM.from_pretrained(name_or_path, **({"dtype": dtype} if dtype else {}))
        if device is not None:
            model = model.to(device)
        tok = load_tokenizer(tokenizer if tokenizer is not None else name_or_path)
        return cls(model.eval(), tok, **kwargs)

    @property
    def device(self) -> torch.device:
        """The device of the model's parameters."""
        return next(self.model.parameters()).device

    @property
    def vocab_size(self) -> int:
        """The tokenizer's real vocabulary size: the only ids the policy ever writes."""
        return self.tokenizer.vocab_size

    # -- sampling ----------------------------------------------------------------------------------------

    def _sample(self, logits: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Draws one id per row of ``logits`` (B, V_model); returns ids (B,) and their log-probs (B,)."""
        return sample_tokens(
            logits,
            self.vocab_size,
            temperature=self.temperature,
            greedy=self.greedy,
            top_p=self.top_p,
            generator=generator or self._generator,
        )

    # -- Agent API (token level, KV cache) ---------------------------------------------------------------

    def reset(self, info: dict[str, Any], seed: int | None = None) -> None:
        """Starts an episode: drops the KV cache; ``seed`` re-seeds sampling."""
        super().reset(info, seed)
        self._pending = []
        self._cache = None
        self._cached_ids = np.zeros(0, dtype=np.int64)
        self._session = None
        if seed is not None:
            self._generator.manual_seed(seed)

    @torch.no_grad()
    def act(self, observation: Observation, info: dict[str, Any]) -> int:
        """Samples the next token, feeding the model only the tokens it has not seen yet.

        The cache holds the context of the previous call; the new context normally extends it by the last
        sampled token plus any tool text. Anything else (a new episode without ``reset``) rebuilds it.
        """
        n = int(observation["length"][0])
        context = np.asarray(observation["tokens"][:n], dtype=np.int64)
        seen = len(self._cached_ids)
        if self._cache is not None and n > seen and np.array_equal(context[:seen], self._cached_ids):
            new = context[seen:]
        else:
            self._cache, new = None, context
        was_training = self.model.training
        self.model.eval()
        try:
            ids = torch.as_tensor(new, device=self.device).unsqueeze(0)
            logits, self._cache = self._io.forward(self.model, self._cache, True, input_ids=ids)
        finally:
            self.model.train(was_training)
        self._cached_ids = context.copy()
        return int(self._sample(logits)[0][0])

    # -- SegmentAgent API (batched turns) ----------------------------------------------------------------

    def generate(
        self, observations: Sequence[Observation], infos: Sequence[dict[str, Any]]
    ) -> list[list[int]]:
        """One turn per observation (see :meth:`rollout_segments`), ids only."""
        return [s.tokens for s in self.rollout_segments(observations)]

    def rollout_segments(self, observations: Sequence[Observation]) -> list[Segment]:
        """One turn per env observation, with log-probabilities.

        The context size comes from the observation's fixed length (``max_context_tokens``), and policy
        tokens already written in the current turn (after the last prompt or tool token) count towards the
        turn's cap and its closing tag, so each segment ends exactly where the env will end the turn.
        """
        if not observations:
            return []
        contexts, written = zip(*(_trailing_policy_run(o) for o in observations), strict=True)
        sizes = {int(o["tokens"].shape[0]) for o in observations}
        if len(sizes) != 1:
            raise ConfigError(f"observations of different context sizes {sorted(sizes)} in one batch")
        return self.generate_segments(
            list(contexts),
            turn_tokens=list(written),
            max_context_tokens=sizes.pop(),
            keep_cache=self.reuse_cache,
        )

    def clear_cache(self) -> None:
        """Drops the KV cache kept across turns (:meth:`generate_segments` with ``keep_cache``)."""
        self._session = None

    @torch.no_grad()
    def generate_segments(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        turn_tokens: Sequence[int] | None = None,
        max_context_tokens: int | None = None,
        generator: torch.Generator | None = None,
        keep_cache: bool = False,
    ) -> list[Segment]:
        """Generates one turn for every context at once.

        Contexts are left-padded into one batch; after one forward over the whole batch (identical contexts,
        such as the prompt a GRPO group shares, are read once), each step feeds one token per sequence
        through the KV cache. A sequence stops, with the env's rules and in the env's order, at the token
        where ``</search>`` or ``</answer>`` completes or at EOS, else when the turn reaches
        ``max_turn_tokens``, else when the context reaches ``max_context_tokens``. Finished sequences ride
        along (their tokens are discarded and masked out of attention) until all are done.

        With ``keep_cache``, the cache survives the call: when every context of the next call extends one
        of this call's sequences (its context plus the tokens it generated, then tool output), only the new
        tokens are fed, in a chunk whose padding is masked out, with each token's position counted as in
        a fresh forward; the tokens drawn and their log-probabilities are those of a fresh forward up to
        float rounding. Anything else (a context that extends nothing, a model whose parameters changed
        since, a model without a row-selectable cache) falls back to reading the contexts whole.

        Args:
            contexts: Token ids of each context (the whole transcript so far).
            turn_tokens: For each context, how many of its last tokens the policy already wrote in the
                current turn (default 0: every context ends with prompt or tool text).
            max_context_tokens: The env's context size; ``None`` for no limit.
            generator: Sampling generator (default the policy's own).
            keep_cache: Reuse the cache kept by the previous call where it applies, and keep this call's.

        Returns:
            One :class:`Segment` per context.
        """
        if not contexts:
            return []
        if any(len(c) == 0 for c in contexts):
            raise ConfigError("every context needs at least one token")
        ctx: list[list[int]] = [[int(t) for t in c] for c in contexts]
        batch = len(ctx)
        written = list(turn_tokens) if turn_tokens is not None else [0] * batch
        scanners = [StopScanner(self.tokenizer.token_bytes, self.tokenizer.eos_token_id) for _ in ctx]
        for scanner, context, k in zip(scanners, ctx, written, strict=True):
            for prior in context[len(context) - k :] if k else ():
                scanner.feed(prior)
        budgets = []
        for context, k in zip(ctx, written, strict=True):
            budget = self.max_turn_tokens - k
            if max_context_tokens is not None:
                budget = min(budget, max_context_tokens - len(context))
            budgets.append(budget)

        out_ids: list[list[int]] = [[] for _ in ctx]
        out_logp: list[Tensor] = []
        stops = ["" for _ in ctx]
        for i, context in enumerate(ctx):
            if budgets[i] <= 0:  # the env would not ask for this turn; report why it is empty
                full = max_context_tokens is not None and len(context) >= max_context_tokens
                stops[i] = "context_limit" if full else "max_turn_tokens"

        session = self._session if keep_cache else None
        self._session = None  # consumed (its cache is updated in place), or stale
        was_training = self.model.training
        self.model.eval()
        try:
            rows = self._match(session, ctx) if session is not None else None
            extended = self._extend(session, rows, ctx) if session is not None and rows else None
            logits, cache, mask = extended if extended is not None else self._prefill(ctx)
            next_pos = torch.tensor([[len(c)] for c in ctx], device=mask.device)
            fed = [len(c) for c in ctx]  # tokens of each row held in the cache
            for step in range(max(budgets)):
                if all(stops):
                    break
                token, logp = self._sample(logits, generator)
                out_logp.append(logp)
                for i, t in enumerate(token.tolist()):
                    if stops[i]:
                        continue
                    out_ids[i].append(t)
                    n = len(out_ids[i])
                    stops[i] = self._stop_reason(
                        scanners[i], t, written[i] + n, len(ctx[i]) + n, max_context_tokens
                    )
                if all(stops):
                    break
                # A row that had stopped before this token rides along, masked out.
                alive = [len(out_ids[i]) == step + 1 for i in range(batch)]
                for i in range(batch):
                    fed[i] += alive[i]
                column = torch.tensor(alive, dtype=mask.dtype, device=mask.device).unsqueeze(-1)
                mask = torch.cat([mask, column], dim=1)
                logits, cache = self._io.forward(
                    self.model,
                    cache,
                    True,
                    input_ids=token.unsqueeze(-1),
                    attention_mask=mask,
                    position_ids=next_pos,
                )
                next_pos = next_pos + 1
        finally:
            self.model.train(was_training)
        if keep_cache and cache is not None:
            held = [c + ids[: fed[i] - len(c)] for i, (c, ids) in enumerate(zip(ctx, out_ids, strict=True))]
            self._session = _Session(cache, mask, held, _parameter_version(self.model))
        logps = torch.stack(out_logp, dim=1).float().cpu() if out_logp else torch.zeros((batch, 0))
        return [
            Segment(tokens=t, logprobs=logps[i, : len(t)].clone(), stop=s)
            for i, (t, s) in enumerate(zip(out_ids, stops, strict=True))
        ]

    def _prefill(self, contexts: list[list[int]]) -> tuple[Tensor, Any, Tensor]:
        """Reads the contexts whole (each distinct one once); returns last logits, cache and mask per row."""
        unique: dict[tuple[int, ...], int] = {}
        inverse = [unique.setdefault(tuple(c), len(unique)) for c in contexts]
        if len(unique) < len(contexts) and self._rows_selectable:
            logits, cache, mask = self._forward_left_padded([list(c) for c in unique])
            index = torch.tensor(inverse, device=mask.device)
            selected = _select_rows(cache, index)
            if selected is not None:
                return logits[index], selected, mask[index]
            self._rows_selectable = False
        return self._forward_left_padded(contexts)

    def _forward_left_padded(self, contexts: list[list[int]]) -> tuple[Tensor, Any, Tensor]:
        device = self.device
        width = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), width), dtype=torch.long)
        for i, context in enumerate(contexts):
            ids[i, width - len(context) :] = torch.as_tensor(context, dtype=torch.long)
            mask[i, width - len(context) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        logits, cache = self._io.forward(
            self.model, None, True, input_ids=ids, attention_mask=mask, position_ids=positions
        )
        return logits, cache, mask

    def _match(self, session: _Session, contexts: list[list[int]]) -> list[int] | None:
        """For each context, the session row it extends by at least one token (``None`` if one extends none)."""
        if session.version != _parameter_version(self.model) or not self._rows_selectable:
            return None
        held = session.tokens
        rows: list[int] = []
        start = 0
        for context in contexts:
            # Active episodes keep their order from turn to turn: look after the last match first.
            order = [*range(start, len(held)), *range(start)]
            row = next(
                (r for r in order if len(held[r]) < len(context) and context[: len(held[r])] == held[r]), None
            )
            if row is None:
                return None
            rows.append(row)
            start = row + 1
        return rows

    def _extend(
        self, session: _Session, rows: list[int], contexts: list[list[int]]
    ) -> tuple[Tensor, Any, Tensor] | None:
        """Feeds each context's tokens beyond its cached row, right-aligned in one chunk (padding masked)."""
        device = session.mask.device
        index = torch.tensor(rows, device=device)
        cache = _select_rows(session.cache, index)
        if cache is None:
            self._rows_selectable = False
            return None
        mask = session.mask[index]
        new = [c[len(session.tokens[r]) :] for c, r in zip(contexts, rows, strict=True)]
        width = max(len(n) for n in new)
        ids = torch.full((len(new), width), self.tokenizer.pad_token_id, dtype=torch.long)
        chunk = torch.zeros((len(new), width), dtype=torch.long)
        positions = torch.zeros((len(new), width), dtype=torch.long)
        for i, (tokens, row) in enumerate(zip(new, rows, strict=True)):
            n, start = len(tokens), len(session.tokens[row])
            ids[i, width - n :] = torch.as_tensor(tokens, dtype=torch.long)
            chunk[i, width - n :] = 1
            positions[i, width - n :] = torch.arange(start, start + n)
            positions[i, : width - n] = start  # padding: masked out; any position will do
        mask = torch.cat([mask, chunk.to(device)], dim=1)
        logits, cache = self._io.forward(
            self.model,
            cache,
            True,
            input_ids=ids.to(device),
            attention_mask=mask,
            position_ids=positions.to(device),
        )
        return logits, cache, mask

    def _stop_reason(
        self, scanner: StopScanner, token: int, turn_length: int, context_length: int, max_context: int | None
    ) -> str:
        """Why the turn ends at ``token`` ("" if it goes on), checked in :meth:`Episode.feed`'s order."""
        if scanner.feed(token):
            return scanner.stop
        if turn_length >= self.max_turn_tokens:
            return "max_turn_tokens"
        if max_context is not None and context_length >= max_context:
            return "context_limit"
        return ""

    # -- scoring -----------------------------------------------------------------------------------------

    def token_logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        *,
        with_entropy: bool = False,
        score_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """:func:`token_logprobs` under this policy's model, vocabulary, temperature and scoring options."""
        return token_logprobs(
            self.model,
            input_ids,
            attention_mask,
            vocab_size=self.vocab_size,
            temperature=self.temperature,
            with_entropy=with_entropy,
            score_mask=score_mask,
            scoring=self.scoring,
        )
