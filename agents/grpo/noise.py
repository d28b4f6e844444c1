"""The gradient noise scale of GRPO updates (McCandlish et al. 2018, "An Empirical Model of Large-Batch
Training"), in groups: how many groups an update needs before its gradient is more signal than noise.

With ``g_i`` the gradient of group ``i`` (its token-mean GRPO loss), ``G = E g`` and ``Σ`` the per-group
covariance, an update of ``B`` groups has ``E|g_B|² = |G|² + tr Σ / B``, and the *simple noise scale*
``B_noise = tr Σ / |G|²`` is the batch at which the noise term equals the signal. Two estimators:

* :func:`noise_scale_from_samples`: from ``n`` per-group gradients (``searchgym bench gns``): the sample
  covariance's trace and the unbiased ``|G|² = |ḡ|² - tr Σ / n``;
* :func:`noise_scale_two_batch`: from the squared norms of gradients at two batch sizes (micro- and
  mini-batch, ``train grpo --log-gns``): unbiased ``|G|²`` and ``tr Σ`` from the two equations above.

Both are noisy ratios: a ``|G|²`` estimate at or below zero means the signal is below what the samples can
resolve, and the noise scale is reported as ``inf``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "GradientMoments",
    "MicroGradients",
    "flat_grad",
    "noise_scale_from_samples",
    "noise_scale_two_batch",
]


def _ratio(trace_cov: float, grad_sq: float) -> float:
    if not (math.isfinite(trace_cov) and math.isfinite(grad_sq)):
        return math.nan
    return trace_cov / grad_sq if grad_sq > 0 else math.inf


def noise_scale_from_samples(grads: Tensor) -> dict[str, float]:
    """``grad_sq`` (unbiased ``|E g|²``), ``trace_cov`` (``tr Σ``, per sample) and ``noise_scale``
    (``tr Σ / |E g|²``, in samples) of ``n >= 2`` gradient samples ``grads`` of shape ``(n, P)``.
    """
    if grads.dim() != 2:
        raise ValueError(f"need (n, P) gradient samples, got shape {tuple(grads.shape)}")
    moments = GradientMoments()
    for g in grads:
        moments.add(g)
    return moments.noise_scale()


class GradientMoments:
    """Streaming first and second moments of gradient samples: the sum of the samples (one vector) and the
    sum of their squared norms, enough for :meth:`noise_scale` without holding the samples."""

    def __init__(self) -> None:
        self.total: Tensor | None = None
        self.sq_norms = 0.0
        self.n = 0

    def add(self, grad: Tensor) -> None:
        g = grad.detach().reshape(-1).double()
        self.total = g.clone() if self.total is None else self.total + g
        self.sq_norms += float(g.pow(2).sum())
        self.n += 1

    def noise_scale(self) -> dict[str, float]:
        """``tr Σ = (Σ|g_i|² - n|ḡ|²) / (n - 1)`` and ``|G|² = |ḡ|² - tr Σ / n``, their ratio."""
        if self.total is None or self.n < 2:
            raise ValueError(f"need at least 2 gradient samples, got {self.n}")
        mean_sq = float((self.total / self.n).pow(2).sum())
        trace_cov = max(self.sq_norms - self.n * mean_sq, 0.0) / (self.n - 1)
        grad_sq = mean_sq - trace_cov / self.n
        return {"grad_sq": grad_sq, "trace_cov": trace_cov, "noise_scale": _ratio(trace_cov, grad_sq)}


def noise_scale_two_batch(small_sq: float, big_sq: float, b_small: float, b_big: float) -> dict[str, float]:
    """The same three figures from ``E|g_b|²`` measured at two batch sizes ``b_small < b_big``:
    ``|G|² = (b_big |g_big|² - b_small |g_small|²) / (b_big - b_small)`` and
    ``tr Σ = (|g_small|² - |g_big|²) / (1/b_small - 1/b_big)``.
    """
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got {b_small} and {b_big}")
    grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace_cov = (small_sq - big_sq) / (1 / b_small - 1 / b_big)
    return {"grad_sq": grad_sq, "trace_cov": trace_cov, "noise_scale": _ratio(trace_cov, grad_sq)}


def flat_grad(params: Sequence[Tensor]) -> Tensor:
    """The gradients of ``params`` as one float64 vector (zeros for a parameter without a gradient)."""
    return torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).double()
            for p in params
        ]
    )


class MicroGradients:
    """Collects, during one gradient-accumulated update, each micro-batch's own gradient norm.

    Call :meth:`add` after each micro-batch's ``backward()``: the micro-batch's contribution is the change
    of the accumulated gradient, rescaled by its token share to the gradient of its own token mean.
    :meth:`sizes` then gives ``(E|g_small|², |g_big|², b_small, b_big)`` in groups, with ``1 / b_small``
    the mean of the micro-batches' ``1 / b`` (what ``E|g_b|²`` averages over unequal micro-batches).
    """

    def __init__(self, params: Sequence[Tensor], group_size: int) -> None:
        self.params = list(params)
        self.group_size = group_size
        self.total: Tensor | None = None
        self.small_sq: list[float] = []
        self.inverse_sizes: list[float] = []
        self.responses = 0

    def add(self, responses: int, token_share: float) -> None:
        """Records the micro-batch of ``responses`` responses holding ``token_share`` of the update's tokens."""
        now = flat_grad(self.params)
        own = now if self.total is None else now - self.total
        self.total = now
        self.responses += responses
        if token_share > 0:
            self.small_sq.append(float(own.pow(2).sum()) / token_share**2)
            self.inverse_sizes.append(self.group_size / responses)

    def sizes(self) -> dict[str, float]:
        """``gns_small_sq``, ``gns_big_sq``, ``gns_small_groups``, ``gns_big_groups`` of this update."""
        if self.total is None or len(self.small_sq) < 2:
            return {}
        return {
            "gns_small_sq": sum(self.small_sq) / len(self.small_sq),
            "gns_big_sq": float(self.total.pow(2).sum()),
            "gns_small_groups": len(self.inverse_sizes) / sum(self.inverse_sizes),
            "gns_big_groups": self.responses / self.group_size,
        }
