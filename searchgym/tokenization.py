"""Tokenizers: one small adapter over the built-in offline tokenizer and any Hugging Face tokenizer.

The environment never decodes and re-encodes the policy's tokens. It only needs, for every token id, the
bytes that token contributes to the text (:attr:`Tokenizer.token_bytes`), so that closing tags are found on
the byte stream at the exact token where they complete. Tool text and prompts are encoded once, when the
environment writes them.

The built-in tokenizer (``searchgym/assets/tokenizer.json``, built by ``scripts/build_tokenizer.py``) is a
byte-level BPE: any Unicode text encodes with no unknown token.

Tool text repeats: the G responses of a GRPO group retrieve the same passages, and an evaluation of several
agents or checkpoints reads them again. :meth:`Tokenizer.encode_parts` memoises the ids of each part of a
text in a bounded LRU cache (:attr:`Tokenizer.cache_size` parts), and returns exactly the ids
:meth:`Tokenizer.encode` gives for the whole text.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from searchgym.errors import ConfigError, MissingDependencyError

__all__ = ["EOS_TOKEN", "PAD_TOKEN", "Tokenizer", "builtin_tokenizer", "load_tokenizer"]

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
BUILTIN_NAME = "builtin"
CACHE_SIZE = 8192  # parts (a passage is one part): about 1.5 KiB each with its key, ~12 MiB when full
_ASCII_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of the byte-level BPE alphabet: each of the 256 bytes is drawn as one printable character.

    Printable Latin-1 bytes stand for themselves; the rest are shifted to code points from 256 upwards,
    in byte order. This is the alphabet GPT-2-style byte-level tokenizers use.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars: dict[int, str] = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shift)
            shift += 1
    return {c: b for b, c in chars.items()}


def _decoder_kinds(backend: Any) -> set[str]:
    """Names of the ``tokenizers`` decoder components of a backend tokenizer (e.g. ``{"ByteLevel"}``)."""
    spec = json.loads(backend.to_str()).get("decoder") or {}
    kinds = {spec.get("type", "")}
    for sub in spec.get("decoders", []) or []:
        kinds.add(sub.get("type", ""))
    return kinds


def _token_bytes_from_backend(backend: Any, vocab_size: int, special_ids: set[int]) -> list[bytes]:
    kinds = _decoder_kinds(backend)
    table: list[bytes] = []
    if "ByteLevel" in kinds:
        inverse = _byte_decoder()
        for i in range(vocab_size):
            piece = backend.id_to_token(i)
            if i in special_ids or piece is None:
                table.append(b"")
            elif all(ch in inverse for ch in piece):
                table.append(bytes(inverse[ch] for ch in piece))
            else:  # an added non-special token written in plain text
                table.append(piece.encode("utf-8"))
        return table
    sentencepiece = bool(kinds & {"Metaspace", "ByteFallback", "Replace"})
    for i in range(vocab_size):
        piece = backend.id_to_token(i)
        if i in special_ids or piece is None:
            table.append(b"")
        elif sentencepiece and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            table.append(bytes([int(piece[3:5], 16)]))
        elif sentencepiece:
            table.append(piece.replace("\u2581", " ").encode("utf-8"))
        else:  # unknown decoder: per-token decode is the best available approximation
            table.append(backend.decode([i], skip_special_tokens=True).encode("utf-8"))
    return table


def _splits_like_gpt2(spec: dict[str, Any]) -> bool:
    """Whether a backend spec is byte-level BPE over GPT-2's pre-tokenizer split, with no normaliser.

    For such a tokenizer a text's ids are the concatenation of the ids of its pre-tokens, and a space that
    follows an ASCII letter or digit always starts a new pre-token: the run of letters or digits stops
    there, and the space opens the next match whatever follows (GPT-2's pattern has no look-behind, and its
    only look-ahead, ``\\s+(?!\\S)``, never reaches across a letter or digit). So the text can be cut at
    such a space and the parts encoded separately with the same ids (:meth:`Tokenizer.encode_parts`).
    """
    pre = spec.get("pre_tokenizer") or {}
    model = spec.get("model") or {}
    return (
        spec.get("normalizer") is None
        and pre.get("type") == "ByteLevel"
        and pre.get("use_regex") is True
        and pre.get("add_prefix_space") is False
        and model.get("type") == "BPE"
        and model.get("dropout") is None
    )


def _safe_cut(left: str, right: str) -> bool:
    """Whether ``left + right`` may be encoded as two parts (see :func:`_splits_like_gpt2`)."""
    return bool(left) and left[-1] in _ASCII_ALNUM and right[:1] == " "


class Tokenizer:
    """The interface the environment and agents use, over a ``tokenizers`` or ``transformers`` tokenizer.

    Attributes:
        name: A label for logs (``"builtin"``, a model name, or a path).
        vocab_size: The tokenizer's real vocabulary size, added tokens included (not a model's padded size).
        token_bytes: For every id, the UTF-8 bytes it adds to decoded text (``b""`` for special tokens).
        eos_token_id: End-of-sequence id, or ``None``.
        pad_token_id: Padding id (falls back to the EOS id, then 0).
        cache_size: How many parts :meth:`encode_parts` keeps (least recently used dropped first).
    """

    def __init__(self, backend: Any, *, name: str, hf: Any = None) -> None:
        self._backend = backend
        self._hf = hf
        self.name = name
        self.vocab_size: int = len(hf) if hf is not None else backend.get_vocab_size(with_added_tokens=True)
        spec = json.loads(backend.to_str())
        special = self._special_ids(spec)
        self.token_bytes: list[bytes] = _token_bytes_from_backend(backend, self.vocab_size, special)
        self.eos_token_id: int | None = self._lookup(EOS_TOKEN) if hf is None else hf.eos_token_id
        pad = self._lookup(PAD_TOKEN) if hf is None else hf.pad_token_id
        self.pad_token_id: int = pad if pad is not None else (self.eos_token_id or 0)
        self._parts_exact = _splits_like_gpt2(spec)
        # Added tokens are matched in the raw text before pre-tokenisation; a text holding one is encoded
        # whole, so no part boundary can split such a match.
        self._added = tuple(t["content"] for t in spec.get("added_tokens", []) if t.get("content"))
        self.cache_size = CACHE_SIZE
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_lock = threading.Lock()

    def _lookup(self, token: str) -> int | None:
        found: int | None = self._backend.token_to_id(token)
        return found

    def _special_ids(self, spec: dict[str, Any]) -> set[int]:
        # Added tokens marked special in the backend (e.g. reserved tokens) never decode to text, even when
        # a transformers tokenizer does not list them among its special tokens.
        ids = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
        if self._hf is not None:
            ids |= set(self._hf.all_special_ids)
        return ids

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without any special tokens added."""
        if self._hf is not None:
            return list(self._hf.encode(text, add_special_tokens=False))
        return list(self._backend.encode(text, add_special_tokens=False).ids)

    def encode_parts(self, parts: Sequence[str]) -> np.ndarray:
        """Token ids of ``"".join(parts)``, equal to :meth:`encode` of the joined text, memoised.

        Each part's ids are kept in a bounded LRU cache (:attr:`cache_size` parts) keyed by the part's text,
        so a key holds its whole rendering (a passage's rank, a word cut). Parts are encoded separately only
        where that is provably token-exact: the tokenizer is a byte-level BPE with GPT-2's pre-tokenizer
        split (the built-in one, GPT-2's, RoBERTa's), every later part starts with a space that follows an
        ASCII letter or digit, and the text holds no added token. Otherwise the joined text is the one key.

        Returns:
            A read-only ``(n,)`` int32 array; a cached one is shared, never write to it.
        """
        text = "".join(parts)
        if (
            len(parts) < 2
            or not self._parts_exact
            or any(token in text for token in self._added)
            or not all(_safe_cut(left, right) for left, right in pairwise(parts))
        ):
            return self._encode_cached(text)
        return np.concatenate([self._encode_cached(part) for part in parts])

    def _encode_cached(self, text: str) -> np.ndarray:
        cache = self._cache
        with self._cache_lock:
            ids = cache.get(text)
            if ids is not None:
                cache.move_to_end(text)
                return ids
        ids = np.asarray(self.encode(text), dtype=np.int32)
        ids.flags.writeable = False
        with self._cache_lock:
            cache[text] = ids
            while len(cache) > self.cache_size:
                cache.popitem(last=False)
        return ids

    def clear_cache(self) -> None:
        """Empties the :meth:`encode_parts` cache (benchmarks start cold with it)."""
        with self._cache_lock:
            self._cache.clear()

    def decode_bytes(self, ids: Any) -> bytes:
        """The bytes the tokens contribute, special tokens dropped."""
        if isinstance(ids, np.ndarray):
            ids = ids.tolist()  # one conversion instead of a NumPy scalar per token
        return b"".join(map(self.token_bytes.__getitem__, map(int, ids)))

    def decode(self, ids: Any) -> str:
        """Decoded text, special tokens dropped; invalid UTF-8 (a split character) becomes U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def chat_prompt_ids(self, user_message: str) -> list[int]:
        """The ids of a one-message chat with the generation prompt, through the tokenizer's chat template.

        Raises:
            ConfigError: the tokenizer has no chat template (the built-in one has none).
        """
        hf = self._hf
        if hf is None or not getattr(hf, "chat_template", None):
            raise ConfigError(f"tokenizer {self.name!r} has no chat template; use prompt_style='base'")
        ids = hf.apply_chat_template(
            [{"role": "user", "content": user_message}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # newer transformers return a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def to_transformers(self) -> Any:
        """A ``transformers`` fast tokenizer equivalent to this one (for use with a model)."""
        if self._hf is not None:
            return self._hf
        try:
            from transformers import PreTrainedTokenizerFast
        except ImportError as e:
            raise MissingDependencyError("transformers", "train", "Using a language model") from e
        return PreTrainedTokenizerFast(
            tokenizer_object=self._backend, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, bos_token=EOS_TOKEN
        )

    def __repr__(self) -> str:
        return f"Tokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


@lru_cache(maxsize=1)
def builtin_tokenizer() -> Tokenizer:
    """The built-in offline byte-level BPE tokenizer shipped with the package (cached per process)."""
    from tokenizers import Tokenizer as BackendTokenizer

    data = resources.files("searchgym").joinpath("assets/tokenizer.json").read_text(encoding="utf-8")
    return Tokenizer(BackendTokenizer.from_str(data), name=BUILTIN_NAME)


@lru_cache(maxsize=8)
def _from_pretrained(name: str) -> Tokenizer:
    """A ``transformers`` tokenizer by local path or Hub name.

    Raises:
        ConfigError: in one line, when it is neither a readable local tokenizer folder nor cached nor
            downloadable (offline, or no such model).
    """
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise MissingDependencyError("transformers", "train", f"Loading tokenizer {name!r}") from e
    import logging

    # The Hub client logs each retry of an unreachable server; the one-line error below says it all.
    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)
    try:
        hf = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as e:  # huggingface_hub's errors derive from these
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        if Path(name).exists():
            raise ConfigError(
                f"tokenizer {name!r}: the folder holds no readable tokenizer ({first})"
            ) from None
        raise ConfigError(
            f"tokenizer {name!r} is not a local folder and not available offline (not in the Hugging Face "
            f"cache, and it cannot be downloaded now: {first}); pass a local tokenizer folder, or download it "
            "once with network access"
        ) from None
    finally:
        hub_logger.setLevel(level)
    return _wrap_hf(hf, name)


def _wrap_hf(hf: Any, name: str) -> Tokenizer:
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        raise ConfigError(f"tokenizer {name!r} is a slow (Python) tokenizer; pass a fast tokenizer")
    return Tokenizer(backend, name=name, hf=hf)


def load_tokenizer(spec: Any = None) -> Tokenizer:
    """Resolves a tokenizer argument.

    Args:
        spec: ``None`` or ``"builtin"`` for the built-in tokenizer; a :class:`Tokenizer`; a
            ``tokenizers.Tokenizer``; a ``transformers`` fast tokenizer object; or a local path / model name
            for ``transformers.AutoTokenizer.from_pretrained`` (needs the ``train`` extra).
    """
    if spec is None or spec == BUILTIN_NAME:
        return builtin_tokenizer()
    if isinstance(spec, Tokenizer):
        return spec
    if isinstance(spec, str):
        return _from_pretrained(spec)
    if hasattr(spec, "backend_tokenizer"):
        return _wrap_hf(spec, getattr(spec, "name_or_path", "") or type(spec).__name__)
    if hasattr(spec, "get_vocab_size") and hasattr(spec, "id_to_token"):
        return Tokenizer(spec, name="tokenizers")
    raise ConfigError(f"cannot use {type(spec).__name__} as a tokenizer; pass a path, a name, or a tokenizer")
