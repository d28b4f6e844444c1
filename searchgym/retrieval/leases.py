"""Named retrievers shared by the environments on one dataset: built once, counted, closed by the last holder.

An environment, the macro env, the TRL tool env and the verl tool each take a retriever for a backend name or
URL with :func:`acquire_retriever` and give it back with :func:`release_retriever`; the lease lives on the
dataset (``Dataset.retrievers``), so it never outlives the corpus it indexes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from searchgym.retrieval import make_retriever
from searchgym.retrieval.base import Retriever

if TYPE_CHECKING:
    from searchgym.data import Dataset

__all__ = ["acquire_retriever", "release_retriever"]

_LEASES_LOCK = threading.Lock()


@dataclass
class _Lease:
    """A named retriever shared by the environments on one dataset, and how many of them hold it."""

    retriever: Retriever
    users: int = 0


def _lease_key(spec: Any, patience: float) -> str:
    name = "bm25" if spec is None else spec
    return f"{name} (patience {patience:g}s)" if patience else name


def acquire_retriever(dataset: Dataset, spec: Any, patience: float = 0.0) -> tuple[Retriever, bool]:
    """The retriever for ``spec`` over ``dataset``, and whether the caller must release it.

    A named backend or URL (a ``str`` or ``None``) is built once and shared by every environment on the
    dataset that holds it: it is stored on the dataset (so it never outlives it) with a count of holders,
    and :func:`release_retriever` by the last holder closes and drops it. A :class:`Retriever` object is
    returned as is and stays the caller's (``False``: nothing to release). ``patience`` is a URL's wait
    for a server that stops answering (see :func:`~searchgym.retrieval.make_retriever`).
    """
    if not isinstance(spec, str | None):
        return make_retriever(spec, dataset.passages), False
    key = _lease_key(spec, patience)
    with _LEASES_LOCK:
        lease = dataset.retrievers.get(key)
        if not isinstance(lease, _Lease):
            retriever = make_retriever(
                spec, dataset.passages, patience=patience, questions=lambda: _question_texts(dataset)
            )
            lease = dataset.retrievers[key] = _Lease(retriever)
        lease.users += 1
        return lease.retriever, True


def _question_texts(dataset: Dataset) -> list[str]:
    """Every question text of every split of ``dataset`` (the ``shuffled`` ablation's other questions)."""
    return [q.question for split in dataset.splits for q in dataset.splits[split]]


def release_retriever(dataset: Dataset, spec: Any, patience: float = 0.0) -> None:
    """Gives back a retriever taken with :func:`acquire_retriever`; the last holder closes and drops it."""
    key = _lease_key(spec, patience)
    with _LEASES_LOCK:
        lease = dataset.retrievers.get(key)
        if not isinstance(lease, _Lease):
            return
        lease.users -= 1
        if lease.users > 0:
            return
        del dataset.retrievers[key]
    lease.retriever.close()
