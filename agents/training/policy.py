"""The policy a run starts from: a tiny model built from a config, a pretrained model, or a checkpoint."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from searchgym.errors import CheckpointError, ConfigError
from searchgym.tokenization import load_tokenizer

from ..llm import LLMPolicy, tiny_causal_lm
from ..llm.model import causal_lm_from_config
from .checkpoint import load_checkpoint
from .checkpoint_checks import check_arch
from .config import ModelConfig, TrainConfig

__all__ = ["CONFIG_PREFIX", "build_policy", "config_policy", "read_model_config"]

_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def build_policy(
    model: ModelConfig,
    *,
    device: str = "cpu",
    weights_seed: int = 0,
    max_context_tokens: int = 0,
    **policy_kwargs: Any,
) -> tuple[LLMPolicy, dict[str, Any]]:
    """The policy to train: ``model.init``'s checkpoint, else ``model.name``, else a fresh tiny model.

    Args:
        model: The run's model section (name, tokenizer, init, dtype, tiny sizes).
        device: The torch device the model goes to (the run's ``device``).
        weights_seed: Seed of a new model's random weights (the run's ``seed``; a checkpoint's or a
            pretrained model's weights are their own).
        max_context_tokens: The longest context the run's env makes; a tiny model has positions for it
            (and at least 4096).
        **policy_kwargs: Passed to :class:`LLMPolicy` (temperature, max_turn_tokens, seed).

    Returns:
        ``(policy, arch)``: ``arch`` describes the model so a checkpoint can rebuild it.

    Raises:
        CheckpointError: ``model.init`` is unreadable or holds no model.
        ConfigError: ``device`` is a CUDA device and this torch cannot use one.
    """
    # Checked first, before a multi-GB model is downloaded: torch's own error is a raw traceback.
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        if torch.version.cuda is None:
            raise ConfigError(
                f"--device {device}: this torch ({torch.__version__}) is a CPU-only build. Install a "
                "CUDA build, e.g. `pip install torch --index-url https://download.pytorch.org/whl/cu124` "
                "(pick the index of your CUDA version on pytorch.org); the Makefile's .venv pins the CPU "
                "build through constraints.txt, so install it outside `make` (or edit that pin)"
            )
        raise ConfigError(
            f"--device {device}: torch {torch.__version__} is built for CUDA {torch.version.cuda} "
            "but sees no GPU (check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES), or use --device cpu"
        )
    state = None
    if model.init is not None:
        payload = load_checkpoint(model.init)
        if "model" not in payload or "arch" not in payload:
            raise CheckpointError(f"{model.init} holds no model")
        arch, state = dict(payload["arch"]), payload["model"]
        if model.tokenizer is not None:
            arch["tokenizer"] = model.tokenizer
        check_arch(arch, state, model.init)  # again: --tokenizer may have replaced the saved one
    elif model.name is not None and model.name.startswith(CONFIG_PREFIX):
        arch = {
            "kind": "config",
            "config": read_model_config(model.name[len(CONFIG_PREFIX) :]),
            "tokenizer": model.tokenizer,
        }
    elif model.name is not None:
        arch = {"kind": "pretrained", "name": model.name, "tokenizer": model.tokenizer or model.name}
    else:
        arch = {
            "kind": "tiny",
            "layers": model.tiny_layers,
            "hidden": model.tiny_hidden,
            "tokenizer": model.tokenizer,
        }
    tokenizer = load_tokenizer(arch["tokenizer"])
    with _new_weights_dtype(model.dtype):
        net = _build_net(arch, model, tokenizer, weights_seed, max_context_tokens)
    if state is not None:
        try:
            net.load_state_dict(state)
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(
                f"{model.init}: the model state does not fit its architecture ({e})"
            ) from None
    net = net.to(device=device, dtype=_DTYPES[model.dtype])
    return LLMPolicy(net, tokenizer, **policy_kwargs), arch


@contextlib.contextmanager
def _new_weights_dtype(dtype: str) -> Iterator[None]:
    """Random weights of a float64 model are drawn in float64: torch's float32 normal sampler rounds
    differently on each CPU kernel (AVX-512, AVX2, scalar), so weights drawn in float32 and then widened
    would differ by machine. Other dtypes draw in float32, as torch does, and are cast after."""
    if dtype != "float64":
        yield
        return
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _build_net(
    arch: dict[str, Any], model: ModelConfig, tokenizer: Any, weights_seed: int, max_context_tokens: int
) -> Any:
    """The network ``arch`` describes, at new random weights (or a pretrained model's own)."""
    if arch["kind"] == "tiny":
        net = tiny_causal_lm(
            tokenizer.vocab_size,
            layers=int(arch["layers"]),
            hidden=int(arch["hidden"]),
            max_positions=max(4096, max_context_tokens),
            seed=weights_seed,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    elif arch["kind"] == "config":
        net = causal_lm_from_config(arch["config"], tokenizer, weights_seed)
    else:
        from ..llm.model import import_transformers

        tf = import_transformers(f"Loading model {arch['name']!r}")
        net = tf.AutoModelForCausalLM.from_pretrained(arch["name"], dtype=_DTYPES[model.dtype])
    return net


CONFIG_PREFIX = "config:"
"""``--model config:SPEC``: a model of that architecture with random weights (see :func:`read_model_config`)."""


def config_policy(config: TrainConfig, **policy_kwargs: Any) -> tuple[LLMPolicy, dict[str, Any]]:
    """The policy a training config starts from (:func:`build_policy`): its model section on the run's
    device, new weights seeded by the run's seed, sized for the env's context, turns of the env's
    ``max_turn_tokens``, sampling seeded by the run's seed. ``policy_kwargs`` add to or override what goes to
    :class:`LLMPolicy` (e.g. ``temperature``, ``seed``)."""
    defaults = {"max_turn_tokens": config.env.max_turn_tokens, "seed": config.run.seed}
    return build_policy(
        config.model,
        device=config.run.device,
        weights_seed=config.run.seed,
        max_context_tokens=config.env.max_context_tokens,
        **{**defaults, **policy_kwargs},
    )


def read_model_config(spec: str) -> dict[str, Any]:
    """A ``transformers`` model config as a plain dict: a ``config.json`` file, a folder holding one, or
    the name of one shipped with searchgym (``qwen2-0.5b``: Qwen2-0.5B's architecture).

    Raises:
        ConfigError: nothing readable there, or a config without ``model_type``.
    """
    assets = resources.files("searchgym").joinpath("assets")
    path: Any = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists() and assets.joinpath(f"model-{spec}.json").is_file():
        path = assets.joinpath(f"model-{spec}.json")
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        shipped = sorted(
            p.name.removeprefix("model-").removesuffix(".json")
            for p in assets.iterdir()
            if p.name.startswith("model-")
        )
        raise ConfigError(
            f"--model {CONFIG_PREFIX}{spec}: cannot read a model config there ({type(e).__name__}: {e}); give a "
            f"config.json, a folder holding one, or one of {shipped}"
        ) from None
    if not isinstance(values, dict) or not isinstance(values.get("model_type"), str):
        raise ConfigError(
            f"--model {CONFIG_PREFIX}{spec}: {path} has no 'model_type' (not a transformers config)"
        )
    return values
