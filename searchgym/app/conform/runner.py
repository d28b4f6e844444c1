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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

try:
    import torch
    from torch import Tensor
except ImportError as e:  # pragma: no cover - depends on the installation
    from searchgym.errors import MissingDependencyError

    raise MissingDependencyError("torch", "train", "searchgym conform") from e

from searchgym.agents.grpo.advantages import group_advantages, mean_advantages, sign_advantages
from searchgym.agents.llm import tiny_causal_lm
from searchgym.errors import ConfigError, SearchGymError
from searchgym.tokenization import Tokenizer, load_tokenizer

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

CHECKS = ("masks", "log-probs", "stops", "transcript", "vocabulary", "advantages", "aggregation")
"""The checks, in report order."""

ENGINES: dict[str, str] = {
    "native": "searchgym.app.conform.native:native_adapter",
    "trl": "searchgym.app.conform.trl:trl_adapter",
    "verl": "searchgym.app.conform.verl:verl_adapter",
}
"""The shipped adapters, as ``MODULE:FUNCTION``."""

KL_COEF = 0.05
ENTROPY_COEF = 0.01
CLIP_EPS = 0.2
#: Extra embedding rows of the model that plays the out-of-vocabulary group, as padded vocabularies have.
VOCAB_PADDING = 64


@dataclass
class Setup:
    """What an adapter builds its stack with.

    Attributes:
        tokenizer: The env's tokenizer (the policy's).
        env_kwargs: SearchQA settings of the episodes (:data:`ENV`).
        group_size: Responses per question (consecutive episodes).
        model: The policy (a ``transformers`` causal LM) whose log-probs the sampler reported.
        reference: The KL reference (``None`` when ``kl_coef`` is 0); it differs from the policy, as it does
            after a few steps, so that a KL term over the wrong tokens has a gradient there.
        kl_coef: Weight of the KL-to-reference term (0: off).
        entropy_coef: Weight of the entropy bonus (0: off).
        clip_eps: PPO clip range.
        workdir: A temporary folder the stack may write to.
    """

    tokenizer: Tokenizer
    env_kwargs: dict[str, Any]
    group_size: int
    model: Any
    reference: Any | None
    kl_coef: float
    entropy_coef: float
    clip_eps: float
    workdir: Path


@dataclass
class LossOutput:
    """The stack's loss on the whole batch (one optimizer update), and the tensors it is built from.

    Attributes:
        loss: The scalar the stack backpropagates.
        logp: The log-probabilities the loss is computed from, with their gradients (any 2-d layout, see
            ``offset``).
        entropy: The per-token entropies of the entropy term, same layout (``None``: no entropy term).
        offset: ``logp[i, j]`` is the log-probability of token ``offset[i] + j`` of row ``i``'s transcript
            (``None``: all 0, the transcript's own positions). Entries that map outside the transcript are
            padding.
    """

    loss: Tensor
    logp: Tensor
    entropy: Tensor | None = None
    offset: Sequence[int] | None = None


@dataclass
class TrainBatch:
    """What a stack trains on, one row per response, each row its whole transcript (prompt included).

    Attributes:
        tokens: Each row's token ids as the stack trains on them (no padding).
        loss_mask: Per row, 1 where the token is trained on.
        old_logp: Per row, ``pi_old`` of each token (read where ``loss_mask`` is 1).
        advantages: Per row, one advantage, or one per token (read where ``loss_mask`` is 1).
        episodes: The :attr:`Episode.index` each row holds.
        estimator: The advantage estimator the stack uses (a key of :data:`ESTIMATORS`).
        aggregation: The loss aggregation the stack uses (a key of :data:`AGGREGATIONS`).
        loss: Computes the stack's loss on this batch (:class:`LossOutput`).
    """

    tokens: list[list[int]]
    loss_mask: list[list[int]]
    old_logp: list[list[float]]
    advantages: list[float] | list[list[float]]
    episodes: list[int]
    estimator: str
    aggregation: str
    loss: Callable[[], LossOutput]


class Adapter(Protocol):
    """A stack under test: its batch building and loss on the scripted episodes.

    Called with the episodes (whole groups, in order) and the :class:`Setup`; returns the
    :class:`TrainBatch` the stack builds from them, or raises when the stack refuses them (an id beyond the
    vocabulary: the error should name it).
    """

    def __call__(self, episodes: Sequence[Episode], setup: Setup) -> TrainBatch: ...


@dataclass(frozen=True)
class Result:
    """The outcome of one check: ``status`` ``"ok"``, ``"fail"`` or ``"skip"``, what was found, what to do."""

    name: str
    status: Literal["ok", "fail", "skip"]
    detail: str
    fix: str | None = None


# -- references ------------------------------------------------------------------------------------------


def _rloo(rewards: Tensor, group_size: int) -> Tensor:
    """Leave-one-out baseline: ``A_i = r_i - mean of the other rewards of the group``."""
    r = rewards.view(-1, group_size).float()
    others = (r.sum(dim=1, keepdim=True) - r) / max(group_size - 1, 1)
    return (r - others).flatten()


ESTIMATORS: dict[str, Callable[[Tensor, int], Tensor]] = {
    "grpo": group_advantages,
    "dr_grpo": mean_advantages,
    "rloo": _rloo,
    "sign": lambda rewards, _: sign_advantages(rewards),
}
"""Reference advantages per estimator, from the rewards ``(B,)`` in consecutive groups of ``G``:
``grpo`` ``(r - mean) / (std + eps)`` (unbiased std), ``dr_grpo`` ``r - mean``, ``rloo`` ``r`` minus the
mean of the other responses, ``sign`` ``2r - 1``."""

AGGREGATIONS: dict[str, Literal["token", "sequence"]] = {
    "token-mean": "token",
    "seq-mean-token-sum": "token",
    "seq-mean-token-sum-norm": "token",
    "seq-mean-token-mean": "sequence",
}
"""How each aggregation weighs a trained token relative to the others (the overall scale is the learning
rate's business and not checked): ``token`` — every token the same; ``sequence`` — every response the same,
shared by its tokens (a token of an ``n``-token response weighs ``1/n``)."""


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


@dataclass
class Built:
    """One build of a batch and, when asked, its loss evaluated with gradients (see :func:`_evaluate`)."""

    batch: TrainBatch | None = None
    error: BaseException | None = None
    loss: LossOutput | None = None
    logp_grad: Tensor | None = None
    entropy_grad: Tensor | None = None
    loss_error: BaseException | None = None
    embedded: list[int] = field(default_factory=list)


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
    from . import checks
    from . import loss_checks

    sc = scenario if scenario is not None else prepare()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:

        def setup(name: str, model: Any, terms: bool) -> Setup:
            folder = Path(tmp) / name
            folder.mkdir()
            return Setup(
                tokenizer=sc.tokenizer,
                env_kwargs=dict(ENV),
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
