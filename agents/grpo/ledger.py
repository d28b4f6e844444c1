"""The cross-step ledger: past successes and the log-likelihood each had right after its own step.

Within-step diagnostics (``lld/delta_adv_*``) and LLDS see only how a step's updates move that step's own
responses. The ledger keeps the last ``capacity`` positively rewarded responses with their *anchor* — the
per-token log-likelihood right after the updates of the step that produced them — so that every later step
can measure how much of that success later updates displaced (``lld/ledger_*``), and ledger-LLDS can
penalise it (:func:`searchgym.agents.grpo.losses.ledger_llds_loss`).
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..training.rollout import RolloutBatch, pad_transcripts
from .config import LLDSConfig
from .losses import ledger_llds_loss

__all__ = ["Ledger", "LedgerEntry", "ledger_llds_backward"]


@dataclass(frozen=True)
class LedgerEntry:
    """One past success: its transcript, who wrote each token, its anchor, and the step that produced it.

    Attributes:
        tokens: ``(L,)`` int64 token ids of the transcript (no padding).
        sources: ``(L,)`` int64 :class:`Source` of each token.
        anchor: ``(L,)`` float32 log-probability of each policy token right after its step (0 elsewhere).
        step: The training step that sampled it.
    """

    tokens: Tensor
    sources: Tensor
    anchor: Tensor
    step: int


class Ledger:
    """A first-in, first-out store of the last ``capacity`` positively rewarded responses.

    Args:
        capacity: The most responses kept (the oldest go first).
        pad_token_id: Padding of :meth:`batch`.
    """

    def __init__(self, capacity: int, pad_token_id: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.pad_token_id = pad_token_id
        self.entries: deque[LedgerEntry] = deque(maxlen=capacity)
        self._padded: tuple[RolloutBatch, Tensor] | None = None

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, batch: RolloutBatch, logp_after: Tensor, step: int) -> int:
        """Records the batch's positively rewarded responses with ``logp_after`` as their anchors.

        Args:
            batch: The step's rollout batch.
            logp_after: ``(B, T)`` the batch's log-probabilities after all of the step's updates.
            step: The step.

        Returns:
            The number of responses added.
        """
        lengths = batch.attention_mask.sum(dim=1).tolist()
        rows = [i for i in range(len(batch)) if float(batch.rewards[i]) > 0]
        for i in rows:
            n = int(lengths[i])
            self.entries.append(
                LedgerEntry(
                    batch.tokens[i, :n].clone(),
                    batch.sources[i, :n].clone(),
                    logp_after[i, :n].float().clone(),
                    step,
                )
            )
        if rows:
            self._padded = None
        return len(rows)

    def batch(self) -> tuple[RolloutBatch, Tensor]:
        """The ledger as a right-padded :class:`RolloutBatch` and its ``(R, T)`` anchors (cached until it
        changes). The batch's ``logp_old`` holds the anchors too; its rewards are 1."""
        if self._padded is None:
            tokens, mask, sources = pad_transcripts(
                [e.tokens.numpy() for e in self.entries],
                [e.sources.numpy() for e in self.entries],
                self.pad_token_id,
            )
            anchor = torch.zeros(tokens.shape, dtype=torch.float32)
            for i, e in enumerate(self.entries):
                anchor[i, : len(e.anchor)] = e.anchor
            n = len(self.entries)
            batch = RolloutBatch(tokens, mask, sources, anchor, torch.ones(n), [{} for _ in range(n)])
            self._padded = (batch, anchor)
        return self._padded

    def state_dict(self) -> dict[str, Any]:
        """The entries as plain tensors and ints (what a checkpoint stores)."""
        return {
            "capacity": self.capacity,
            "tokens": [e.tokens for e in self.entries],
            "sources": [e.sources for e in self.entries],
            "anchor": [e.anchor for e in self.entries],
            "step": [e.step for e in self.entries],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict`'s entries.

        Raises:
            ValueError: the state is malformed (lists of different lengths, tensors of different lengths).
        """
        tokens, sources, anchor, steps = state["tokens"], state["sources"], state["anchor"], state["step"]
        if not len(tokens) == len(sources) == len(anchor) == len(steps):
            raise ValueError("ledger state: tokens, sources, anchor and step have different lengths")
        self.entries.clear()
        for t, s, a, k in zip(tokens, sources, anchor, steps, strict=True):
            if not (isinstance(t, Tensor) and isinstance(s, Tensor) and isinstance(a, Tensor)):
                raise ValueError("ledger state: entries must be tensors")
            if not t.shape == s.shape == a.shape or t.dim() != 1:
                raise ValueError("ledger state: an entry's tokens, sources and anchor differ in shape")
            if not bool(torch.isfinite(a).all()):
                raise ValueError("ledger state: a non-finite anchor")
            self.entries.append(LedgerEntry(t.long(), s.long(), a.float(), int(k)))
        self._padded = None


def ledger_llds_backward(
    policy: Any,
    ledger: RolloutBatch,
    anchor: Tensor,
    micro_batches: list[Tensor],
    llds: LLDSConfig,
    device: Any,
) -> tuple[Tensor, dict[str, float]]:
    """Backpropagates ``ledger_lambda`` × ledger-LLDS (:func:`~searchgym.agents.grpo.losses.ledger_llds_loss`,
    with LLDS's gate) over the ledger responses of ``micro_batches`` (``ledger`` and ``anchor`` from
    :meth:`Ledger.batch`), one token mean over them all; returns the scaled loss and its metrics, stopping
    at the first micro-batch whose loss is not finite (before its backward)."""
    rows = torch.cat(micro_batches)
    num_tokens = float(ledger.loss_mask[rows].sum().clamp(min=1))
    total = torch.zeros(())
    sums: dict[str, float] = defaultdict(float)
    for idx in micro_batches:
        mb = ledger.select(idx).to(device)
        logp, _ = policy.token_logprobs(mb.tokens, mb.attention_mask, score_mask=mb.loss_mask)
        width = mb.tokens.shape[1]
        anchored = anchor[idx, :width].to(device)
        loss, m = ledger_llds_loss(logp, anchored, mb.loss_mask, llds.measured_gate, None, num_tokens)
        loss = llds.ledger_lambda * loss
        if not bool(torch.isfinite(loss)):
            return loss.detach().cpu(), dict(sums)
        loss.backward()
        total = total + loss.detach().cpu()
        share = float(mb.loss_mask.sum()) / num_tokens
        sums["ledger_llds_loss"] += m["ledger_llds_loss"]
        sums["ledger_gate_open"] += m["ledger_gate_open"] * share
    return total, dict(sums)
