"""A loss term of your own, added to GRPO's loss with a coefficient: ``--loss-term module:function`` and
``--loss-term-coef`` (``loss_term`` / ``loss_term_coef`` in a study protocol's arm).

The function is called on every micro-batch of every update, after GRPO's own terms (clipped surrogate,
LLDS, KL, entropy, SAPO), with one :class:`LossTermInputs` and returns ``(value, metrics)``:

* ``value``: a scalar tensor, the term's mean over the micro-batch's policy tokens (or over its responses,
  as the term sees fit), differentiable through ``logp`` or ``entropy`` when it is to move the weights;
* ``metrics``: a mapping of names to numbers, logged as ``train/loss_term/NAME``.

The trainer adds ``loss_term_coef * share * value`` to the micro-batch's loss, ``share`` being its share of
the mini-batch's policy tokens, so the micro-batches of an update add up to the coefficient times the
token-weighted mean of the term, whatever the micro-batch size (GRPO's own terms are normalised the same
way). ``train/loss_term`` logs ``loss_term_coef * value``, averaged the same way.

Loading runs code: the module is imported with :mod:`importlib` (the current directory first, as
``python -m`` does, then the installed packages), and only when a run is started with the option on the
command line or in a protocol, never because a checkpoint's config names one. This module is torch-free at
import, so that :class:`~searchgym.agents.grpo.config.GRPOConfig` can check the option's form.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from searchgym.errors import ConfigError

if TYPE_CHECKING:
    from torch import Tensor

    from ..training.rollout import RolloutBatch

__all__ = ["LossTerm", "LossTermInputs", "apply_loss_term", "check_loss_term_spec", "load_loss_term"]

SPEC = re.compile(r"(?P<module>[A-Za-z_][\w.]*):(?P<function>[A-Za-z_]\w*)")


@dataclass(frozen=True)
class LossTermInputs:
    """One micro-batch, as a loss term sees it. ``B`` responses, ``T`` token positions (right-padded).

    Attributes:
        logp: ``(B, T)`` float log-probability of each token under the policy being trained, with gradient;
            meaningful on ``loss_mask`` only (always multiply by it).
        logp_old: ``(B, T)`` float log-probability under ``pi_old``, the policy that sampled the batch (a
            constant).
        advantages: ``(B,)`` float advantage of each response.
        loss_mask: ``(B, T)`` bool, the tokens the policy wrote (never prompt, tool output or padding).
        entropy: ``(B, T)`` float entropy of the policy's next-token distribution at each position, with
            gradient; meaningful on ``loss_mask`` only.
        ref_logp: ``(B, T)`` float log-probability under the frozen reference (the initial policy), or
            ``None`` when the run has no KL term (``kl_coef`` 0).
        tokens: ``(B, T)`` int64 token ids.
        sources: ``(B, T)`` int64 who wrote each token (:class:`searchgym.protocol.Source`).
        rewards: ``(B,)`` float episode rewards.
        step: The training step (1 for the first rollout batch).
    """

    logp: Tensor
    logp_old: Tensor
    advantages: Tensor
    loss_mask: Tensor
    entropy: Tensor
    ref_logp: Tensor | None
    tokens: Tensor
    sources: Tensor
    rewards: Tensor
    step: int

    @classmethod
    def of(
        cls,
        mb: RolloutBatch,
        logp: Tensor,
        logp_old: Tensor,
        advantages: Tensor,
        entropy: Tensor,
        ref_logp: Tensor | None,
        step: int,
    ) -> LossTermInputs:
        """The inputs of a micro-batch ``mb``: its tokens, sources, rewards and mask, with the scores given."""
        return cls(
            logp=logp,
            logp_old=logp_old,
            advantages=advantages,
            loss_mask=mb.loss_mask,
            entropy=entropy,
            ref_logp=ref_logp,
            tokens=mb.tokens,
            sources=mb.sources,
            rewards=mb.rewards,
            step=step,
        )


LossTerm = Callable[[LossTermInputs], "tuple[Tensor, Mapping[str, float]]"]
"""A loss term's signature."""


def check_loss_term_spec(spec: str) -> tuple[str, str]:
    """The module and function a ``module:function`` option names, checked for form only (nothing imported).

    Raises:
        ConfigError: ``spec`` is not ``module:function``.
    """
    m = SPEC.fullmatch(spec)
    if m is None:
        raise ConfigError(f"loss_term must be module:function (e.g. mypkg.terms:my_term), got {spec!r}")
    return m.group("module"), m.group("function")


def load_loss_term(spec: str) -> LossTerm:
    """Imports the function ``spec`` names (the current directory is importable for this import only).

    Raises:
        ConfigError: the form is wrong, the module cannot be imported, it has no such attribute, or the
            attribute is not callable.
    """
    module_name, function = check_loss_term_spec(spec)
    saved = list(sys.path)
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # the user's module may fail any way while it is imported
        raise ConfigError(
            f"cannot import the loss term's module {module_name!r}: {type(e).__name__}: {e}"
        ) from None
    finally:
        sys.path[:] = saved
    term = getattr(module, function, None)
    if term is None:
        raise ConfigError(f"loss term {spec!r}: module {module_name!r} has no attribute {function!r}")
    if not callable(term):
        raise ConfigError(f"loss term {spec!r} is a {type(term).__name__}, not a function")
    return term


def apply_loss_term(
    term: LossTerm, inputs: LossTermInputs, coef: float, share: float, spec: str
) -> tuple[Tensor, dict[str, float]]:
    """Calls ``term`` and returns its contribution to the micro-batch's loss, ``coef * share * value``, and
    its metrics: ``loss_term`` (``coef * value``) and each of its own as ``loss_term/NAME``.

    Raises:
        ConfigError: it did not return a scalar tensor and a mapping of names to numbers.
    """
    import torch

    name = f"loss term {spec}"
    out = term(inputs)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ConfigError(f"{name} must return (value, metrics), got {type(out).__name__}")
    value, metrics = out
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ConfigError(f"{name} must return a scalar tensor as its value, got {shape}")
    if not isinstance(metrics, Mapping) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
        for k, v in metrics.items()
    ):
        raise ConfigError(f"{name} must return a mapping of names to numbers as its metrics, got {metrics!r}")
    value = value.reshape(())
    logged = {"loss_term": coef * float(value.detach())}
    logged |= {f"loss_term/{k}": float(v) for k, v in metrics.items()}
    return coef * share * value, logged
