"""Conformance of a training stack's multi-turn bookkeeping, checked against the token-exact environment.

Scripted SearchQA episodes with known transcripts — searches, several turns, a turn cut at its closing tag
with text after it, a group whose rewards are all equal, a group with mixed rewards, an id beyond the
vocabulary — are handed to an **adapter**: a function that runs them through a stack's own batch building
and returns what the stack would train on (a :class:`TrainBatch`: token ids, loss mask, ``pi_old``,
advantages, and the stack's loss as a callable). :func:`run_conformance` then checks it against what the
environment recorded, token by token (:mod:`.checks`):

* ``masks``: prompt and tool tokens get exactly zero gradient, also from the KL and entropy terms;
* ``log-probs``: the loss's log-probabilities are the policy's own tokens', and the ratio is 1 at the first
  update;
* ``stops``: nothing the sampler wrote after a turn's closing tag is trained on;
* ``transcript``: the trained transcript is the sampled one, token for token;
* ``vocabulary``: an id beyond the real vocabulary is refused or masked, never embedded;
* ``advantages``: each group's advantages equal the declared estimator's;
* ``aggregation``: the loss weighs tokens and responses as the declared aggregation does.

Three adapters ship: ``native`` (:mod:`.native`, ``train grpo``'s rollouts and loss), ``trl``
(:mod:`.trl`, TRL's ``GRPOTrainer``) and ``verl`` (:mod:`.verl`, verl's agent-loop worker
and ``ppo_loss``). ``docs/conform.md`` shows how to write one for another stack.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import torch
    from torch import Tensor
except ImportError as e:  # pragma: no cover - depends on the installation
    from searchgym.errors import MissingDependencyError

    raise MissingDependencyError("torch", "train", "searchgym conform") from e

from searchgym.agents.llm import tiny_causal_lm
from searchgym.errors import ConfigError, SearchGymError
from searchgym.tokenization import Tokenizer, load_tokenizer

from .adapter import (
    AGGREGATIONS,
    CHECKS,
    CLIP_EPS,
    ENGINES,
    ENTROPY_COEF,
    ESTIMATORS,
    KL_COEF,
    VOCAB_PADDING,
    Adapter,
    Built,
    LossOutput,
    Result,
    Setup,
    TrainBatch,
)
from .episodes import (
    ENV,
    GROUP_SIZE,
    ConformError,
    Episode,
    ScriptedTurns,
    Turn,
    scripted_episodes,
)

__all__ = [
    "AGGREGATIONS",
    "CHECKS",
    "ENGINES",
    "ENV",
    "ESTIMATORS",
    "Adapter",
    "ConformError",
    "Episode",
    "LossOutput",
    "Result",
    "Scenario",
    "ScriptedTurns",
    "Setup",
    "TrainBatch",
    "Turn",
    "load_adapter",
    "prepare",
    "run_conformance",
]

# -- running the checks -----------------------------------------------------------------------------------


def load_adapter(spec: str) -> Adapter:
    """The adapter ``spec`` names: ``native``, ``trl``, ``verl``, ``MODULE:FUNCTION`` (an importable module)
    or ``FILE.py:FUNCTION``.

    Raises:
        ConfigError: ``spec`` is none of these, its module does not import, or it names no callable.
    """
    target = ENGINES.get(spec, spec)
    source, sep, attr = target.rpartition(":")
    if not sep or not source or not attr:
        raise ConfigError(
            f"unknown engine {spec!r}; choose one of {sorted(ENGINES)}, MODULE:ADAPTER or FILE.py:ADAPTER"
        )
    try:
        if source.endswith(".py"):
            path = Path(source)
            if not path.is_file():
                raise ConfigError(f"no file {source!r} for --engine {spec}")
            loader = importlib.util.spec_from_file_location(path.stem, path)
            assert loader is not None and loader.loader is not None
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(source)
    except ImportError as e:
        if isinstance(e, SearchGymError):
            raise
        raise ConfigError(f"cannot import {source!r} for --engine {spec}: {e}") from None
    adapter = getattr(module, attr, None)
    if not callable(adapter):
        raise ConfigError(f"{source} has no callable {attr!r} for --engine {spec}")
    return adapter


def default_model(tokenizer: Tokenizer, vocab_size: int | None = None) -> Any:
    """The tiny policy of the checks (seeded), with ``vocab_size`` output rows (default the tokenizer's)."""
    return tiny_causal_lm(
        vocab_size or tokenizer.vocab_size,
        layers=2,
        hidden=64,
        seed=0,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _padded(model: Any, tokenizer: Tokenizer) -> Any:
    """``model`` if its embedding already has rows beyond the vocabulary, else a copy with
    :data:`VOCAB_PADDING` more (an id there is embedded silently, as in a padded vocabulary)."""
    if model.get_input_embeddings().num_embeddings > tokenizer.vocab_size:
        return model
    padded = copy.deepcopy(model)
    padded.resize_token_embeddings(tokenizer.vocab_size + VOCAB_PADDING, mean_resizing=False)
    return padded


def _reference(model: Any, seed: int = 0) -> Any:
    """A frozen copy of ``model`` with every weight moved by 20% of its tensor's spread (seeded)."""
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ref.parameters():
            noise = torch.randn(p.shape, generator=generator).to(p.device, p.dtype)
            p.add_(noise * 0.2 * float(p.float().std()))
    return ref


def _evaluate(built: Built, model: Any) -> None:
    """Computes the batch's loss and backpropagates it, keeping the gradients of its log-probs and entropies."""
    assert built.batch is not None
    model.zero_grad(set_to_none=True)
    try:
        out = built.batch.loss()
        if not out.logp.requires_grad:
            raise ConformError(
                "the log-probs the loss returned carry no gradient: return the tensor the loss is computed from"
            )
        out.logp.retain_grad()
        if out.entropy is not None and out.entropy.requires_grad:
            out.entropy.retain_grad()
        out.loss.backward()
    except Exception as e:  # reported by each check that needs the loss, naming the error
        built.loss_error = e
        return
    built.loss = out
    built.logp_grad = out.logp.grad if out.logp.grad is not None else torch.zeros_like(out.logp)
    if out.entropy is not None:
        grad = out.entropy.grad
        built.entropy_grad = grad if grad is not None else torch.zeros_like(out.entropy)
    model.zero_grad(set_to_none=True)


def _build(adapter: Adapter, episodes: Sequence[Episode], setup: Setup) -> Built:
    """Builds the batch and evaluates its loss, recording every id beyond the vocabulary that reaches the
    model's embedding."""
    built = Built()
    vocab = setup.tokenizer.vocab_size

    def watch(_: Any, args: tuple[Any, ...]) -> None:
        ids = args[0] if args else None
        if isinstance(ids, Tensor) and ids.numel():
            built.embedded.extend(sorted({int(x) for x in ids[ids >= vocab].flatten().tolist()}))

    handle = setup.model.get_input_embeddings().register_forward_pre_hook(watch)
    try:
        try:
            batch = adapter(list(episodes), setup)
        except Exception as e:  # the stack's refusal, or its failure: judged by the checks
            built.error = e
            return built
        if not isinstance(batch, TrainBatch):
            name = getattr(adapter, "__qualname__", None) or type(adapter).__name__
            raise ConfigError(
                f"the adapter {getattr(adapter, '__module__', '?')}:{name} returned "
                f"{type(batch).__name__}, not a TrainBatch (docs/conform.md says what an adapter returns)"
            )
        built.batch = batch
        _evaluate(built, setup.model)
    finally:
        handle.remove()
    return built


@dataclass
class Scenario:
    """The policy, its tokenizer and the scripted episodes played with them (:func:`prepare`).

    Attributes:
        tokenizer: The policy's tokenizer.
        model: The policy.
        padded: The model of the out-of-vocabulary group: ``model``, or a copy with
            :data:`VOCAB_PADDING` more embedding rows when ``model`` has none beyond the vocabulary.
        main: The 8 episodes of every check but ``vocabulary``.
        out_of_vocabulary: The 4 episodes of ``vocabulary``.
        junk: The ids the sampler wrote after closing tags.
    """

    tokenizer: Tokenizer
    model: Any
    padded: Any
    main: list[Episode]
    out_of_vocabulary: list[Episode]
    junk: tuple[int, ...]


def prepare(model: Any | None = None, tokenizer: Tokenizer | None = None) -> Scenario:
    """Plays the scripted episodes with ``model`` as the sampler (default: a tiny seeded model over the
    built-in tokenizer)."""
    tok = tokenizer if tokenizer is not None else load_tokenizer(None)
    policy = model if model is not None else default_model(tok)
    padded = _padded(policy, tok)
    main, oov, junk = scripted_episodes(tok, policy, padded)
    return Scenario(tok, policy, padded, main, oov, junk)


def run_conformance(
    adapter: Adapter, scenario: Scenario | None = None, *, workdir: str | Path | None = None
) -> list[Result]:
    """Runs the scripted episodes through ``adapter`` and every check; one :class:`Result` per check.

    Three builds: the main episodes with a KL term (against a reference that differs from the policy) and
    an entropy bonus, for ``masks``; the main episodes with neither, for ``log-probs``, ``stops``,
    ``transcript``, ``advantages`` and ``aggregation``; the out-of-vocabulary group, for ``vocabulary``.

    Args:
        adapter: The stack under test (:class:`Adapter`).
        scenario: The policy and episodes (default: :func:`prepare`'s).
        workdir: Where the temporary folder the stacks may write to is made (default: the system's).
    """
    from . import checks, loss_checks

    sc = scenario if scenario is not None else prepare()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:

        def setup(name: str, model: Any, terms: bool) -> Setup:
            folder = Path(tmp) / name
            folder.mkdir()
            return Setup(
                tokenizer=sc.tokenizer,
                env=ENV,
                group_size=GROUP_SIZE,
                model=model,
                reference=_reference(model) if terms else None,
                kl_coef=KL_COEF if terms else 0.0,
                entropy_coef=ENTROPY_COEF if terms else 0.0,
                clip_eps=CLIP_EPS,
                workdir=folder,
            )

        with_terms = _build(adapter, sc.main, setup("terms", sc.model, True))
        plain = _build(adapter, sc.main, setup("plain", sc.model, False))
        oov = _build(adapter, sc.out_of_vocabulary, setup("vocabulary", sc.padded, False))
    tok = sc.tokenizer
    runs: list[tuple[str, Callable[[], Result]]] = [
        ("masks", lambda: checks.check_masks(with_terms, sc.main, tok)),
        ("log-probs", lambda: checks.check_logprobs(plain, sc.main, tok)),
        ("stops", lambda: checks.check_stops(plain, sc.main, tok, sc.junk)),
        ("transcript", lambda: checks.check_transcript(plain, sc.main, tok, sc.junk)),
        ("vocabulary", lambda: checks.check_vocabulary(oov, sc.out_of_vocabulary, tok)),
        ("advantages", lambda: loss_checks.check_advantages(plain, sc.main)),
        ("aggregation", lambda: loss_checks.check_aggregation(plain, CLIP_EPS)),
    ]
    results = []
    for name, check in runs:
        try:
            results.append(check())
        except Exception as e:  # a batch the check cannot read: its line says why
            results.append(Result(name, "fail", f"cannot read the batch: {type(e).__name__}: {e}", None))
    return results
