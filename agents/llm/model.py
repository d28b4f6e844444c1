"""The causal language models the policy runs: building them, and calling them across versions.

:func:`tiny_causal_lm` is the offline default (a small Qwen2-style model with random weights);
:func:`causal_lm_from_config` gives random weights for any ``transformers`` architecture;
:func:`load_pretrained` loads a checkpoint by name or path. :class:`ModelIO`, :func:`cache_of` and
:func:`select_rows` hide what changed across ``transformers`` versions (keyword names, cache classes) from
the scoring and generation code.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from searchgym.errors import ConfigError, MissingDependencyError

__all__ = ["causal_lm_from_config", "load_pretrained", "tiny_causal_lm"]


def import_transformers(purpose: str) -> Any:
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
    tf = import_transformers("Building the tiny model")
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


def causal_lm_from_config(values: Mapping[str, Any], tokenizer: Any, seed: int) -> Any:
    """Random weights (seeded) for the architecture ``values`` describes, sized to ``tokenizer``'s vocabulary.

    Args:
        values: A ``transformers`` model config as a plain dict (with ``model_type``).
        tokenizer: The run's tokenizer: its vocabulary size and EOS/pad ids are written into the config.
        seed: Seed of the initialisation (the global torch RNG is left untouched).

    Raises:
        ConfigError: ``transformers`` cannot build a config of that type from ``values``.
    """
    tf = import_transformers("Building a model from a config")
    fields = {
        k: v for k, v in values.items() if k not in ("model_type", "architectures", "transformers_version")
    }
    fields |= {
        "vocab_size": tokenizer.vocab_size,  # the embedding must cover the tokenizer the run uses
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.eos_token_id,
    }
    try:
        config = tf.AutoConfig.for_model(values["model_type"], **fields)
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"model config of type {values['model_type']!r} is not usable: {e}") from None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.AutoModelForCausalLM.from_config(config)
    return model.eval()


def load_pretrained(name_or_path: str, *, dtype: Any = None, device: str | None = None) -> Any:
    """``AutoModelForCausalLM.from_pretrained``, moved to ``device`` (if given), in eval mode.

    Raises:
        MissingDependencyError: ``transformers`` is not installed (the ``train`` extra).
    """
    tf = import_transformers(f"Loading model {name_or_path!r}")
    model = tf.AutoModelForCausalLM.from_pretrained(name_or_path, **({"dtype": dtype} if dtype else {}))
    if device is not None:
        model = model.to(device)
    return model.eval()


# -- calling them across transformers versions ---------------------------------------------------------


def output_size(model: Any) -> int:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


class ModelIO:
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
        return out.logits[:, -1], cache_of(out)


def cache_of(out: Any) -> Any:
    """The KV cache a model returned (its name changed across ``transformers`` versions), or ``None``."""
    keys = out.keys() if hasattr(out, "keys") else ()
    return next((out[k] for k in ("cache", "past_key_values") if k in keys), None)


def select_rows(cache: Any, index: Tensor) -> Any:
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
