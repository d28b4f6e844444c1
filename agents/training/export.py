"""Trained models out of searchgym: load one as a policy, or write it as a standard Hugging Face folder.

A searchgym checkpoint (``RUN_DIR/checkpoint.pt`` of ``train sft`` / ``train grpo``) holds the model's
weights and the architecture needed to rebuild it. :func:`export_pretrained` turns it into a folder that
``transformers.AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load with no
searchgym import (``save_pretrained`` of the model and of its tokenizer, plus a provenance note).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import Any

from searchgym.envs.spec import TRAINING, EnvSpec, make_spec
from searchgym.errors import CheckpointError, ConfigError

from ..llm import LLMPolicy
from .config import ModelConfig
from .policy import build_policy

__all__ = [
    "checkpoint_env_spec",
    "export_pretrained",
    "load_policy",
    "loadable_in_run",
]

EXPORT_NOTE = "searchgym_export.json"
"""The provenance note :func:`export_pretrained` writes beside the model files."""


def loadable_in_run(folder: str | Path) -> list[Path]:
    """What :func:`load_policy` loads inside a run folder: its ``checkpoint.pt`` (``train sft`` / ``grpo``),
    its ``model/`` (``train trl``'s final model); ``[]`` for a folder holding neither."""
    root = Path(folder)
    found = [root / "checkpoint.pt"] if (root / "checkpoint.pt").is_file() else []
    return found + ([root / "model"] if (root / "model" / "config.json").is_file() else [])


def load_policy(
    path: str | Path,
    *,
    tokenizer: Any = None,
    device: str = "cpu",
    greedy: bool = True,
    max_turn_tokens: int = TRAINING.max_turn_tokens,
    temperature: float = 1.0,
) -> LLMPolicy:
    """A trained model as a policy: a searchgym checkpoint file or a saved Hugging Face folder.

    Args:
        path: ``checkpoint.pt`` written by a searchgym trainer, or a folder holding ``config.json`` (e.g. from
            :func:`export_pretrained` or any ``save_pretrained``).
        tokenizer: Override the tokenizer (default: the checkpoint's, or the folder's own).
        device: Torch device of the model.
        greedy: Take the most likely token (evaluation) instead of sampling.
        max_turn_tokens: The env's per-turn token cap (default: the trainers' env's, ``TRAINING``).
        temperature: Sampling temperature when not greedy.

    Raises:
        CheckpointError: the file is not a readable searchgym checkpoint, or the folder's weights cannot be
            loaded safely (e.g. a ``pytorch_model.bin`` pickle holding code, refused by ``weights_only``).
        ConfigError: the path is neither a file nor a Hugging Face folder.
    """
    p = Path(path)
    kwargs: dict[str, Any] = {
        "greedy": greedy,
        "max_turn_tokens": max_turn_tokens,
        "temperature": temperature,
    }
    if p.is_dir():
        if not (p / "config.json").is_file():
            inside = loadable_in_run(p)
            hint = f"; did you mean {' or '.join(str(q) for q in inside)}?" if inside else ""
            raise ConfigError(f"{p} is a folder without config.json: not a Hugging Face model folder{hint}")
        try:
            return LLMPolicy.from_pretrained(str(p), tokenizer, device=device, **kwargs)
        except (OSError, ValueError, RuntimeError, pickle.UnpicklingError, EOFError) as e:
            # transformers reads .bin weights with torch.load(weights_only=True): a pickle holding code (or
            # any damage) fails there, as an UnpicklingError or another of these, never by running it.
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            raise CheckpointError(
                f"{p}: the Hugging Face model folder cannot be loaded safely ({type(e).__name__}: {first}); its "
                "weights hold more than plain tensors or are damaged. Prefer model.safetensors for files you did "
                "not make"
            ) from None
    if not p.is_file():
        raise CheckpointError(f"no checkpoint at {p}")
    policy, _ = build_policy(ModelConfig(init=str(p), tokenizer=tokenizer), device=device, **kwargs)
    policy.model.eval()
    return policy


def export_pretrained(checkpoint: str | Path, out_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Writes a searchgym checkpoint as a Hugging Face folder: model, tokenizer, provenance.

    Args:
        checkpoint: A ``checkpoint.pt`` written by ``train sft`` or ``train grpo``.
        out_dir: Destination folder (created).
        overwrite: Replace the model files of an existing, non-empty folder.

    Returns:
        ``out_dir``.

    Raises:
        ConfigError: ``out_dir`` is not empty and ``overwrite`` is not set.
    """
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"{out} exists and is not empty; choose another folder or pass --overwrite")
    policy = load_policy(checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(out)
    policy.tokenizer.to_transformers().save_pretrained(out)
    digest = hashlib.sha256(Path(checkpoint).read_bytes()).hexdigest()
    note = {
        "exported_from": str(Path(checkpoint).resolve()),
        "sha256": digest,
        "tokenizer": policy.tokenizer.name,
        "env": spec.to_dict() if (spec := checkpoint_env_spec(checkpoint)) is not None else {},
    }
    (out / EXPORT_NOTE).write_text(json.dumps(note, indent=1) + "\n")
    _usual_modes(out)
    return out


def _usual_modes(folder: Path) -> None:
    """Gives every file of ``folder`` the mode a plain ``open`` would (0666 less the umask): safetensors
    writes its file private (0600), unlike the folder's other files, and a model folder is meant to be
    shared."""
    umask = os.umask(0)
    os.umask(umask)
    mode = 0o666 & ~umask
    for path in folder.iterdir():
        if path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o777 != mode:
            path.chmod(mode)


def checkpoint_env_spec(path: str | Path) -> EnvSpec | None:
    """The env spec a trained model was trained with: a checkpoint file's stored config's
    (:func:`~.checkpoint_checks.stored_config`, whatever the file's stored form), or the one an exported
    folder's note records; read without loading any weights.

    ``None`` when there is none to read: a folder without a note (``save_pretrained`` outside searchgym), or a
    file torch cannot read (loading it says why).

    Raises:
        CheckpointError: the stored config or the note is unreadable, or its spec is not valid (the message
            names the file and the field).
    """
    from .checkpoint import peek_checkpoint
    from .checkpoint_checks import stored_config

    p = Path(path)
    if p.is_dir():
        return _note_env_spec(p / EXPORT_NOTE)
    payload = peek_checkpoint(p)
    if payload is None:
        return None
    env: EnvSpec = stored_config(payload.get("config", {}), payload.get("kind"), p).env
    return env


def _note_env_spec(path: Path) -> EnvSpec | None:
    """The spec an export note (:data:`EXPORT_NOTE`) records; ``None`` without a note."""
    if not path.is_file():
        return None
    try:
        note = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, integer bombs, bad bytes
        raise CheckpointError(
            f"{path}: not a readable export note ({type(e).__name__}: {str(e)[:200]})"
        ) from None
    env = note.get("env", {}) if isinstance(note, dict) else None
    if not isinstance(env, dict):
        raise CheckpointError(f"{path}: field 'env' must be an object of EnvSpec fields, got {env!r:.80}")
    try:
        return make_spec(None, env)
    except (ValueError, TypeError) as e:  # ConfigError is a ValueError
        raise CheckpointError(f"{path}: field 'env' is not a valid env spec: {e}") from None
