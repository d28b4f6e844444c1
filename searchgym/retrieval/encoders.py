"""Text encoders for dense retrieval: any Hugging Face encoder by folder, or a seeded tiny one.

An :class:`Encoder` embeds queries and passages into L2-normalised float32 vectors (mean or CLS pooling
over the last hidden states), so the inner product of two embeddings is their cosine similarity. e5 models
expect a ``"query: "`` / ``"passage: "`` prefix on each side; those are the defaults. torch and
transformers (the ``dense`` extra) are imported when an encoder is made, not with this module.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from searchgym.data.types import Passage
from searchgym.errors import ConfigError, MissingDependencyError

__all__ = ["DEFAULT_PREFIXES", "POOLINGS", "TINY", "Encoder", "Pooling", "load_encoder", "tiny_encoder"]

Pooling = Literal["mean", "cls"]
POOLINGS: tuple[str, ...] = get_args(Pooling)
#: e5's ``(query, passage)`` prefixes.
DEFAULT_PREFIXES = ("query: ", "passage: ")
#: The name of the seeded random encoder (see :func:`tiny_encoder`).
TINY = "tiny"
#: A fixed query whose embedding (see :meth:`Encoder.identity`) tells encoders apart.
PROBE = "Who wrote the song that gave the searchgym probe its name?"
#: Config keys that change with the transformers version or the save path, not with the model.
_VOLATILE_CONFIG_KEYS = frozenset(
    {"transformers_version", "torch_dtype", "dtype", "architectures", "name_or_path", "output_hidden_states"}
)


def _import_torch_transformers(purpose: str) -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as e:
        raise MissingDependencyError(e.name or "transformers", "dense", purpose) from e
    return torch, transformers


def _check_device(device: str) -> Any:
    """The ``torch.device`` for ``device``, checked before any model is loaded onto it.

    Raises:
        ConfigError: torch does not know the device, or it is a CUDA device this torch cannot use.
    """
    import torch

    try:
        found = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ConfigError(f"cannot use device {device!r} for the encoder: {e}") from None
    if found.type == "cuda" and not torch.cuda.is_available():
        why = (
            f"this torch ({torch.__version__}) is a CPU-only build; install a CUDA build from pytorch.org"
            if torch.version.cuda is None
            else "torch sees no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
        )
        raise ConfigError(f"cannot use device {device!r} for the encoder: {why}, or use --device cpu")
    return found


class Encoder:
    """A Hugging Face encoder that embeds queries and passages into L2-normalised float32 vectors.

    Thread-safe: one lock guards the tokenizer and the model (a fast tokenizer's padding settings are
    shared state), so a server's worker threads may call :meth:`encode` at once.

    Args:
        model: A ``transformers`` encoder (``AutoModel``): its output's ``last_hidden_state`` is pooled.
        tokenizer: Its ``transformers`` tokenizer.
        name: ``"tiny"`` or the encoder's folder: how the index finds it again.
        pooling: ``"mean"`` (average over the non-padding tokens; e5's) or ``"cls"`` (the first token).
        query_prefix: Put before every query (e5: ``"query: "``).
        passage_prefix: Put before every passage (e5: ``"passage: "``).
        max_length: Longest input in tokens (longer ones are cut); at most the model's positions.
        device: Torch device of the model (``"cpu"``, ``"cuda"``, ``"cuda:1"`` …).
        batch_size: Texts per forward pass.

    Raises:
        ConfigError: an unknown pooling, a non-positive ``max_length`` or ``batch_size``, or a device torch
            cannot use.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str,
        pooling: str = "mean",
        query_prefix: str = DEFAULT_PREFIXES[0],
        passage_prefix: str = DEFAULT_PREFIXES[1],
        max_length: int = 512,
        device: str = "cpu",
        batch_size: int = 64,
    ) -> None:
        torch, _ = _import_torch_transformers("Dense encoding")
        if pooling not in POOLINGS:
            raise ConfigError(f"unknown pooling {pooling!r}; choose one of {list(POOLINGS)}")
        if not isinstance(max_length, int) or max_length < 1:
            raise ConfigError(f"max_length must be a positive integer, got {max_length!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        positions = getattr(model.config, "max_position_embeddings", None)
        if isinstance(positions, int) and positions > 0:
            max_length = min(max_length, positions)
        self.device = _check_device(device)
        try:
            model = model.to(self.device)
        except (RuntimeError, AssertionError, ValueError) as e:
            raise ConfigError(f"cannot use device {device!r} for the encoder: {e}") from None
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.pooling: Pooling = pooling  # type: ignore[assignment]
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.max_length = max_length
        self.batch_size = batch_size
        self._lock = threading.Lock()
        hidden = getattr(model.config, "hidden_size", None)
        self.dim: int = int(hidden) if hidden else int(self._embed([PROBE]).shape[1])

    @property
    def config_hash(self) -> str:
        """A SHA-256 of the model's configuration (architecture and sizes; not the weights)."""
        config = {
            k: v
            for k, v in self.model.config.to_dict().items()
            if not k.startswith("_") and k not in _VOLATILE_CONFIG_KEYS
        }
        return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()

    def identity(self) -> dict[str, Any]:
        """What the index records about its encoder: name, config hash, pooling, prefixes, dim and the
        embedding of a fixed probe query (which tells two encoders with equal configs apart)."""
        return {
            "name": self.name,
            "config_hash": self.config_hash,
            "pooling": self.pooling,
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
            "max_length": self.max_length,
            "dim": self.dim,
            "probe": [float(x) for x in self.encode_queries([PROBE])[0]],
        }

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` normalised embeddings of one batch."""
        import torch

        with self._lock, torch.inference_mode():
            batch = self.tokenizer(
                list(texts),
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
                return_token_type_ids=False,
            )
            batch = {k: v.to(self.device) for k, v in batch.items()}
            hidden = self.model(**batch).last_hidden_state.float()
            if self.pooling == "cls":
                pooled = hidden[:, 0]
            else:
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
            return np.ascontiguousarray(pooled.cpu().numpy(), dtype=np.float32)

    def encode(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """``(len(texts), dim)`` float32 unit vectors, in the order of ``texts`` (no prefix is added).

        Texts are batched by length (less padding); the result is in the input order.
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(texts), desc="encoding", unit="text", unit_scale=True)
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            out[rows] = self._embed([texts[i] for i in rows])
            if bar is not None:
                bar.update(len(rows))
        if bar is not None:
            bar.close()
        return out

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """Query embeddings (the query prefix added)."""
        return self.encode([self.query_prefix + q for q in queries])

    def passage_text(self, passage: Passage) -> str:
        """What is embedded for a passage: the prefix and its FlashRAG ``contents`` (as Search-R1's e5)."""
        return self.passage_prefix + passage.contents

    def encode_passages(self, passages: Sequence[Passage], *, progress: bool = False) -> np.ndarray:
        """Passage embeddings (the passage prefix added)."""
        return self.encode([self.passage_text(p) for p in passages], progress=progress)

    def __repr__(self) -> str:
        return f"Encoder(name={self.name!r}, dim={self.dim}, pooling={self.pooling!r})"


def _builtin_hf_tokenizer() -> Any:
    """searchgym's built-in tokenizer as a fresh ``transformers`` fast tokenizer.

    Fresh, not the cached :func:`~searchgym.tokenization.builtin_tokenizer`'s backend: batching turns on
    padding and truncation in the backend, which must not leak into the environment's tokenizer.
    """
    from tokenizers import Tokenizer as BackendTokenizer
    from transformers import PreTrainedTokenizerFast

    from searchgym.tokenization import EOS_TOKEN, PAD_TOKEN

    data = resources.files("searchgym").joinpath("assets/tokenizer.json").read_text(encoding="utf-8")
    return PreTrainedTokenizerFast(
        tokenizer_object=BackendTokenizer.from_str(data),
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        model_max_length=512,
    )


def tiny_encoder(
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    device: str = "cpu",
    **options: Any,
) -> Encoder:
    """A small randomly initialised BERT encoder over the built-in tokenizer, the same for a seed.

    It needs no download, so tests and examples can build and query real indexes; its rankings are those of
    random features (a plumbing check, not a retriever to train with).

    Args:
        hidden: Embedding size (the index's ``dim``).
        layers: Transformer blocks.
        heads: Attention heads (``hidden`` must be divisible by it).
        seed: Seed of the initialisation (the global torch RNG is left untouched).
        device: Torch device.
        **options: :class:`Encoder` options (``pooling``, ``query_prefix``, ``passage_prefix``,
            ``max_length``, ``batch_size``).
    """
    torch, transformers = _import_torch_transformers("The tiny encoder")
    tokenizer = _builtin_hf_tokenizer()
    config = transformers.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=512,
        type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.BertModel(config)
    return Encoder(model, tokenizer, name=TINY, device=device, **options)


def load_encoder(spec: str | Encoder, device: str = "cpu", **options: Any) -> Encoder:
    """Resolves an encoder argument.

    Args:
        spec: An :class:`Encoder` (returned as is); ``"tiny"`` (see :func:`tiny_encoder`); or the local
            folder of a Hugging Face encoder checkpoint (``config.json``, weights and tokenizer files, as
            ``save_pretrained`` or ``huggingface-cli download`` write them), such as e5-base-v2.
        device: Torch device of the model.
        **options: :class:`Encoder` options (``pooling``, ``query_prefix``, ``passage_prefix``,
            ``max_length``, ``batch_size``).

    Raises:
        ConfigError: ``spec`` is not ``"tiny"`` nor a folder that holds a checkpoint.
        MissingDependencyError: torch or transformers is not installed.
    """
    if isinstance(spec, Encoder):
        return spec
    if spec == TINY:
        return tiny_encoder(device=device, **options)
    _, transformers = _import_torch_transformers("Loading an encoder")
    _check_device(device)  # before a model of hundreds of MB is read
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"encoder {spec!r} is neither 'tiny' nor a local folder holding a checkpoint (config.json, "
            "weights, tokenizer); download one first, e.g. "
            "`huggingface-cli download intfloat/e5-base-v2 --local-dir e5-base-v2`, and pass that folder"
        )
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
        model = transformers.AutoModel.from_pretrained(str(path))
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"cannot load the encoder in {path}: {e}") from None
    return Encoder(model, tokenizer, name=str(path.resolve()), device=device, **options)
