"""``searchgym doctor``'s checks of a ``--tokenizer`` and a ``--model``: loaded offline as the commands load
them, the protocol's tags tokenising as the env reads them, a search and an answer turn played in the env."""

from __future__ import annotations

import contextlib
import importlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from searchgym.app.doctor.report import Check, fail, ok
from searchgym.errors import SearchGymError, install_command

__all__ = [
    "MODEL_FIX",
    "TAGS",
    "TOKENIZER_FIX",
    "check_model",
    "check_tokenizer",
    "offline",
    "quiet_transformers",
]

TAGS = (
    "<search>",
    "</search>",
    "<answer>",
    "</answer>",
    "<information>",
    "</information>",
    "<think>",
    "</think>",
)
"""The protocol's tags (:mod:`searchgym.protocol`): the policy writes them and the env writes the tool's."""
SEARCH_TURN = "<search> Lyku Works </search>"
ANSWER_TURN = "<answer> Drelmont </answer>"
TOKENIZER_FIX = (
    "pass a local folder holding a fast tokenizer (tokenizer.json), or a Hub name already in the Hugging Face "
    "cache (the load runs with HF_HUB_OFFLINE=1)"
)
MODEL_FIX = (
    "pass a local model folder (config.json and weights) that AutoModelForCausalLM loads, or a Hub name "
    "already in the Hugging Face cache (the load runs with HF_HUB_OFFLINE=1)"
)


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """``HF_HUB_OFFLINE=1`` for the duration: loads read local folders and the cache, never the network.

    ``huggingface_hub`` reads the variable when it is imported, so its module constant is set too.
    """
    saved = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants: Any = None
    with contextlib.suppress(ImportError):
        constants = importlib.import_module("huggingface_hub.constants")
    previous = getattr(constants, "HF_HUB_OFFLINE", None)
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        if constants is not None:
            constants.HF_HUB_OFFLINE = previous
        if saved is None:
            del os.environ["HF_HUB_OFFLINE"]
        else:
            os.environ["HF_HUB_OFFLINE"] = saved


def _missing_path(name: str) -> bool:
    """``name`` is written as a file system path (not a Hub ``org/name``) and nothing is there."""
    return name.startswith(("/", "./", "../", "~", os.sep)) and not Path(name).expanduser().exists()


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No ``transformers`` progress bar (its weight-loading bar) for the duration."""
    from transformers.utils import logging

    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            logging.enable_progress_bar()


def check_tokenizer(name: str | None, loaded: list[Any]) -> Check:
    """Loads a tokenizer offline as ``--tokenizer`` does and checks the protocol's tags in it.

    The env finds tags in the bytes of the policy's tokens (``Tokenizer.token_bytes``), never in re-decoded
    text, so each tag must encode to tokens whose bytes are the tag again (a special or unknown token has
    other bytes, or none); and a search turn, then an answer turn, played token by token in SearchQA-v0
    with this tokenizer must end where their closing tags complete.

    Args:
        name: Tokenizer name or path (``None``: skipped).
        loaded: The loaded tokenizer is appended here, for :func:`check_model`.
    """
    if name is None:
        return Check("tokenizer", "skip", False, "skipped: no --tokenizer or --model given")
    from searchgym.errors import ConfigError, MissingDependencyError
    from searchgym.tokenization import load_tokenizer

    if _missing_path(name):
        return fail("tokenizer", f"{name}: no such folder", "pass a folder that holds a tokenizer")
    try:
        with offline():
            tok = load_tokenizer(name)
    except MissingDependencyError as e:
        return fail("tokenizer", str(e).split(".")[0], install_command("train"))
    except ConfigError as e:
        return fail(
            "tokenizer",
            str(e),
            "pass a local folder holding a fast tokenizer (tokenizer.json), or a Hub name already in the "
            "Hugging Face cache (the load runs with HF_HUB_OFFLINE=1)",
        )
    loaded.append(tok)
    problems = [
        f"{tag} -> {got!r}"
        for tag in TAGS
        if (got := tok.decode_bytes(tok.encode(tag))).strip() != tag.encode()
    ]
    if problems:
        return fail(
            "tokenizer",
            f"{name}: tags that do not decode to themselves (the env would not see them): {', '.join(problems)}",
            "use a tokenizer in which the tags are plain text, not special or unknown tokens (remove added "
            "tag tokens, or keep them with special=False)",
        )
    turn = _play_turns(tok)
    if turn:
        return fail("tokenizer", f"{name}: {turn}", "use the tokenizer the model was trained with")
    eos = (
        f"EOS id {tok.eos_token_id}"
        if tok.eos_token_id is not None
        else "no EOS token (turns end at tags only)"
    )
    return ok(
        "tokenizer",
        f"{tok.name}: {tok.vocab_size} ids, {eos}; the {len(TAGS)} tags round-trip and SearchQA-v0 ends a "
        "search turn and an answer turn at their closing tags",
    )


def _play_turns(tok: Any) -> str | None:
    """Plays a search turn, then an answer turn, in SearchQA-v0 with ``tok``; what went wrong, or ``None``."""
    import gymnasium as gym

    import searchgym  # noqa: F401 - registers the env ids

    env = gym.make("SearchQA-v0", tokenizer=tok, max_context_tokens=8192)
    try:
        env.reset(seed=0)
        for text, kind in ((SEARCH_TURN, "search"), (ANSWER_TURN, "answer")):
            ids = tok.encode(text)
            for i, token in enumerate(ids):
                _, _, terminated, truncated, info = env.step(token)
                if truncated:
                    return f"the transcript filled the context during {text!r}"
                if info.get("turn_end", False) != (i == len(ids) - 1):
                    return f"{text!r} ({len(ids)} tokens) ended its turn at token {i + 1}"
            if kind == "search" and info["queries"] != ["Lyku Works"]:
                return f"{text!r} searched {info['queries']!r}"
            if kind == "answer" and not (terminated and info["answer"] == "Drelmont"):
                return f"{text!r} answered {info['answer']!r} (episode over: {terminated})"
    finally:
        env.close()
    return None


def check_model(name: str | None, tok: Any) -> Check:
    """Loads a model offline (:func:`~searchgym.agents.llm.model.load_pretrained`, on the CPU) and builds the
    LLM policy over it and the tokenizer, which checks that the model has a logit for every token id."""
    if name is None:
        return Check("model", "skip", False, "skipped: no --model given")
    try:
        from searchgym.agents.llm.model import load_pretrained
        from searchgym.agents.llm.policy import LLMPolicy
    except ImportError as e:
        return fail("model", f"the LLM agents cannot be imported ({e})", install_command("train"))
    if _missing_path(name):
        return fail("model", f"{name}: no such folder", "pass a folder that holds a model")
    start = time.perf_counter()
    try:
        with offline(), quiet_transformers():
            model = load_pretrained(name)
    except (OSError, ValueError) as e:  # not found, not in the cache, not a model folder
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        return fail(
            "model",
            f"{name} cannot be loaded offline: {first}",
            "pass a local model folder (config.json and weights), or a Hub name already in the Hugging Face "
            "cache (the load runs with HF_HUB_OFFLINE=1)",
        )
    took = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    loaded = f"{name}: {model.config.model_type}, {params / 1e6:.1f}M parameters, loaded in {took:.1f}s"
    if tok is None:
        return ok("model", f"{loaded}; its logits not checked: no tokenizer (see its line)")
    try:
        LLMPolicy(model, tok)
    except SearchGymError as e:
        return fail("model", f"{name}: {e}", "pass --tokenizer with the model's own tokenizer")
    return ok("model", f"{loaded}; a logit for each of the tokenizer's {tok.vocab_size} ids")
