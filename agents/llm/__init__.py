"""An LLM policy over any ``transformers`` causal language model: token-level acting and batched turns.

One job a module: :mod:`.policy` is the agent (:class:`LLMPolicy`).
"""

from .policy import (
    DEFAULT_SCORING,
    LLMPolicy,
    ScoringOptions,
    Segment,
    sample_tokens,
    tiny_causal_lm,
    token_logprobs,
)

# Private names other modules and tests import from here (re-exported, so those imports keep working).
from .policy import _import_transformers as _import_transformers
from .policy import _log_probs as _log_probs
from .policy import _picked_logprobs as _picked_logprobs
from .policy import _picked_logprobs_reference as _picked_logprobs_reference
from .policy import _PickedLogProb as _PickedLogProb
from .policy import _shared_prefix as _shared_prefix

__all__ = [
    "DEFAULT_SCORING",
    "LLMPolicy",
    "ScoringOptions",
    "Segment",
    "sample_tokens",
    "tiny_causal_lm",
    "token_logprobs",
]
