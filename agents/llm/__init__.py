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

One job a module: :mod:`.model` builds and calls the models, :mod:`.scoring` computes log-probabilities,
:mod:`.sampling` draws tokens, :mod:`.session` reads contexts into the KV cache and keeps it between
turns, and :mod:`.policy` is the agent.
"""

try:
    import torch  # noqa: F401 - checked here, once, for every module of the package
except ImportError as e:  # pragma: no cover - depends on the installation
    from searchgym.errors import MissingDependencyError

    raise MissingDependencyError("torch", "train", "The LLM policy") from e

from .model import tiny_causal_lm
from .policy import LLMPolicy, Segment
from .sampling import sample_tokens
from .scoring import DEFAULT_SCORING, ScoringOptions, token_logprobs

__all__ = [
    "DEFAULT_SCORING",
    "LLMPolicy",
    "ScoringOptions",
    "Segment",
    "sample_tokens",
    "tiny_causal_lm",
    "token_logprobs",
]
