"""GRPO's advantages: how a response's reward becomes the weight of its tokens in the policy gradient.

``group`` (GRPO's group-normalised advantage), ``mean`` (Dr. GRPO's unscaled group baseline), ``sign`` (a
fixed reference, ``2r - 1``) and ``greedy`` (the self-critical baseline of SCST: the reward of the current
policy's greedy play on the same question), chosen by ``--advantage``; :func:`broadcast_advantages` spreads a
response's advantage over its policy tokens. The maths is in ``docs/grpo.md``.
"""

from __future__ import annotations

try:
    import torch
    from torch import Tensor
except ImportError as e:  # pragma: no cover - depends on the installation
    from searchgym.errors import MissingDependencyError

    raise MissingDependencyError("torch", "train", "GRPO training") from e

from searchgym.errors import ConfigError

from .config import ADVANTAGE_CHOICES

__all__ = [
    "ADVANTAGES",
    "broadcast_advantages",
    "compute_advantages",
    "group_advantages",
    "mean_advantages",
    "self_critical_advantages",
    "sign_advantages",
]


def _groups(rewards: Tensor, group_ids: Tensor | int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(r, inverse, count, mean)``: float rewards, each response's group index, and per-group size and
    mean reward (see :func:`group_advantages` for ``group_ids``)."""
    r = rewards.to(torch.float32) if not rewards.is_floating_point() else rewards
    if r.dim() != 1:
        raise ConfigError(f"rewards must have shape (B,), got {tuple(r.shape)}")
    n = r.shape[0]
    if isinstance(group_ids, int):
        if group_ids < 1 or n % group_ids:
            raise ConfigError(f"group size {group_ids} must be >= 1 and divide the batch size {n}")
        inverse = torch.arange(n, device=r.device) // group_ids
    else:
        if group_ids.shape != r.shape:
            raise ConfigError(f"group_ids must have shape {tuple(r.shape)}, got {tuple(group_ids.shape)}")
        inverse = torch.unique(group_ids, return_inverse=True)[1].to(r.device)
    groups = int(inverse.max()) + 1 if n else 0
    count = torch.zeros(groups, dtype=r.dtype, device=r.device).index_add_(0, inverse, torch.ones_like(r))
    mean = torch.zeros_like(count).index_add_(0, inverse, r) / count
    return r, inverse, count, mean


def group_advantages(rewards: Tensor, group_ids: Tensor | int, eps: float = 1e-6) -> Tensor:
    """GRPO's group-normalised advantages ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)``.

    ``std`` is the unbiased (Bessel-corrected) standard deviation, as in verl's and TRL's GRPO. A group
    with a single response has no relative signal and gets advantage 0; a group whose rewards are all
    equal gets 0 too (its numerator is 0).

    Args:
        rewards: ``(B,)`` one scalar reward per response.
        group_ids: ``(B,)`` integer group label of each response (any values; equal label = same
            question), or an int ``G``: responses come in consecutive groups of ``G`` (``B`` divisible by
            ``G``).
        eps: Added to the standard deviation.

    Returns:
        ``(B,)`` float advantages.
    """
    r, inverse, count, mean = _groups(rewards, group_ids)
    centred = r - mean[inverse]
    sq = torch.zeros_like(count).index_add_(0, inverse, centred**2)
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    # Singleton groups and groups of equal rewards carry no signal: 0, also when eps = 0 (no 0/0).
    informative = (count > 1) & (std > 0)
    adv = centred / torch.where(informative, std + eps, 1.0)[inverse]
    return torch.where(informative[inverse], adv, torch.zeros_like(adv))


def mean_advantages(rewards: Tensor, group_ids: Tensor | int) -> Tensor:
    """Dr. GRPO's unscaled advantages ``A_i = r_i - mean_g(r)``: the group baseline without dividing by the
    group's standard deviation, so a nearly-solved (or nearly-failed) question weighs less, not the same.

    A singleton group gets 0. Arguments as :func:`group_advantages`.
    """
    r, inverse, count, mean = _groups(rewards, group_ids)
    return torch.where(count[inverse] > 1, r - mean[inverse], torch.zeros_like(r))


def sign_advantages(rewards: Tensor) -> Tensor:
    """A fixed-reference advantage ``A_i = 2 r_i - 1``: +1 for a correct response, -1 for a wrong one
    (rewards in ``[0, 1]``; an F1 reward maps linearly onto ``[-1, 1]``). No group statistics: a group whose
    responses all fail still pushes them down, so zero-variance groups are not silent.
    """
    r = rewards.to(torch.float32) if not rewards.is_floating_point() else rewards
    if r.dim() != 1:
        raise ConfigError(f"rewards must have shape (B,), got {tuple(r.shape)}")
    return 2.0 * r - 1.0


def self_critical_advantages(rewards: Tensor, greedy_rewards: Tensor, group_ids: Tensor | int) -> Tensor:
    """The self-critical advantages of SCST (Rennie et al. 2017) ``A_i = r_i - r_greedy(q_i)``: each
    response's reward minus the reward greedy decoding of the current policy gets on its question.

    No standard-deviation scaling. A sample that beats the greedy answer is pushed up, one that does worse is
    pushed down, one that ties gets 0: the signal aims at changing what greedy play does. The baseline comes
    from outside the group, so a group of one response, or of equal rewards, still has a signal.

    Args:
        rewards: ``(B,)`` one scalar reward per sampled response.
        greedy_rewards: ``(Q,)`` the greedy reward of each group's question: with an int ``group_ids``, group
            ``k`` is responses ``k*G … (k+1)*G - 1``; with labels, the ``k``-th smallest label.
        group_ids: ``(B,)`` integer group label of each response, or an int ``G`` (consecutive groups of
            ``G``), as in :func:`group_advantages`.

    Returns:
        ``(B,)`` float advantages.

    Raises:
        ConfigError: ``rewards`` is not ``(B,)``, the groups do not fit ``B``, or ``greedy_rewards`` is not
            ``(Q,)`` for the ``Q`` groups.
    """
    r, inverse, count, _ = _groups(rewards, group_ids)
    if greedy_rewards.shape != count.shape:
        raise ConfigError(
            f"greedy_rewards must have shape ({count.shape[0]},), one reward per group, "
            f"got {tuple(greedy_rewards.shape)}"
        )
    baseline = greedy_rewards.to(device=r.device, dtype=r.dtype)
    return r - baseline[inverse]


ADVANTAGES = ADVANTAGE_CHOICES
"""``--advantage`` values: :func:`group_advantages`, :func:`mean_advantages`, :func:`sign_advantages`,
:func:`self_critical_advantages`."""


def compute_advantages(
    rewards: Tensor, group_ids: Tensor | int, kind: str = "group", *, greedy_rewards: Tensor | None = None
) -> Tensor:
    """The advantages of ``kind`` (one of :data:`ADVANTAGES`) for ``rewards`` in groups ``group_ids``.

    Args:
        rewards: ``(B,)`` one scalar reward per response.
        group_ids: ``(B,)`` group labels, or an int ``G`` (see :func:`group_advantages`).
        kind: Which advantage.
        greedy_rewards: ``(Q,)`` the greedy reward of each group's question: the baseline of ``greedy``
            (:func:`self_critical_advantages`), and only of ``greedy``.

    Raises:
        ConfigError: an unknown ``kind``; ``greedy`` without ``greedy_rewards``, or ``greedy_rewards`` with
            another kind.
    """
    if kind == "greedy":
        if greedy_rewards is None:
            raise ConfigError(
                "advantage 'greedy' needs greedy_rewards, the reward of greedy play on each group's question "
                "(train grpo plays them every step); choose another --advantage here"
            )
        return self_critical_advantages(rewards, greedy_rewards, group_ids)
    if greedy_rewards is not None and kind in ADVANTAGES:
        raise ConfigError(f"greedy_rewards is the baseline of advantage 'greedy', not of {kind!r}")
    if kind == "group":
        return group_advantages(rewards, group_ids)
    if kind == "mean":
        return mean_advantages(rewards, group_ids)
    if kind == "sign":
        return sign_advantages(rewards)
    raise ConfigError(f"unknown advantage {kind!r}; choose one of {list(ADVANTAGES)}")


def broadcast_advantages(advantages: Tensor, loss_mask: Tensor) -> Tensor:
    """Gives every policy token of response ``i`` the advantage ``A_i`` (0 elsewhere).

    Args:
        advantages: ``(B,)`` per-response advantages.
        loss_mask: ``(B, T)`` policy-token mask.

    Returns:
        ``(B, T)`` per-token advantages.
    """
    m = loss_mask if loss_mask.dtype == torch.bool else loss_mask != 0
    return torch.where(m, advantages[:, None].to(torch.float32).expand(m.shape), 0.0)
