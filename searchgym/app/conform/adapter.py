"""What a conformance adapter is given and gives back (:class:`Setup`, :class:`TrainBatch`,
:class:`LossOutput`, the :class:`Adapter` protocol), the outcome of a check (:class:`Result`), a build
(:class:`Built`), and the references the checks hold a stack to (the advantage estimators and loss
aggregations). :mod:`.runner` runs the checks; ``docs/conform.md`` shows how to write an adapter."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

try:
    from torch import Tensor
except ImportError as e:  # pragma: no cover - depends on the installation
    from searchgym.errors import MissingDependencyError

    raise MissingDependencyError("torch", "train", "searchgym conform") from e

from searchgym.agents.grpo.advantages import group_advantages, mean_advantages, sign_advantages
from searchgym.envs.spec import EnvSpec
from searchgym.tokenization import Tokenizer

from .episodes import (
    Episode,
)

__all__ = [
    "AGGREGATIONS",
    "CHECKS",
    "CLIP_EPS",
    "ENGINES",
    "ENTROPY_COEF",
    "ESTIMATORS",
    "KL_COEF",
    "VOCAB_PADDING",
    "Adapter",
    "Built",
    "LossOutput",
    "Result",
    "Setup",
    "TrainBatch",
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
        env: The episodes' environment (:data:`~.episodes.ENV`).
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
    env: EnvSpec
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


@dataclass
class Built:
    """One build of a batch and, when asked, its loss evaluated with gradients (see :func:`.runner.run_conformance`)."""

    batch: TrainBatch | None = None
    error: BaseException | None = None
    loss: LossOutput | None = None
    logp_grad: Tensor | None = None
    entropy_grad: Tensor | None = None
    loss_error: BaseException | None = None
    embedded: list[int] = field(default_factory=list)
