"""Retriever faults: seeded, controlled failures of a search, for robustness studies.

Per search, each fault is drawn independently with its probability, always from the same number of draws
of a dedicated generator, so the faults of the j-th search depend only on the seed and j — never on the
agent, the results, or which other faults fired. The kinds, applied in this order:

* ``empty``: the search returns nothing (the other result faults have nothing to act on);
* ``replace``: ``replace_k`` of the results are replaced by passages drawn uniformly from the corpus;
* ``shuffle``: the results come in a random order;
* ``truncate``: every passage's text is cut to its first ``truncate_words`` words;
* ``latency``: the search takes ``latency_s`` seconds longer.

The environments take ``retriever_faults=`` (a :class:`RetrieverFaults`, a mapping, or a string such as
``"empty=0.1,shuffle=0.2,seed=3"``) and count the injected faults in ``info["retrieval_faults"]``;
:class:`FaultyRetriever` wraps any retriever with the same faults for use outside an environment.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from searchgym.data.types import Passage
from searchgym.errors import ConfigError
from searchgym.retrieval.base import Hit, Retriever

__all__ = ["FAULT_KINDS", "FaultyRetriever", "RetrieverFaults", "apply_faults", "parse_faults"]

#: The fault kinds, in the order they are drawn and applied.
FAULT_KINDS = ("empty", "replace", "shuffle", "truncate", "latency")

# Uniform draws per search: one per kind, and one that seeds the search's own choices (which results to
# replace, by what, the order of a shuffle), so the stream advances by the same amount on every search.
_DRAWS = len(FAULT_KINDS) + 1


@dataclass(frozen=True)
class RetrieverFaults:
    """Probabilities and sizes of the retriever faults (see the module docstring for each kind).

    Attributes:
        empty: Probability that a search returns nothing.
        replace: Probability that ``replace_k`` results are replaced by random corpus passages.
        replace_k: How many results a ``replace`` fault replaces (at most all of them).
        shuffle: Probability that the results come shuffled.
        truncate: Probability that every passage is cut to ``truncate_words`` words.
        truncate_words: Words kept by a ``truncate`` fault.
        latency: Probability that the search is slowed down by ``latency_s``.
        latency_s: Seconds a ``latency`` fault adds.
        seed: Seed of the fault draws (an env combines it with ``reset(seed=...)``).
    """

    empty: float = 0.0
    replace: float = 0.0
    replace_k: int = 1
    shuffle: float = 0.0
    truncate: float = 0.0
    truncate_words: int = 10
    latency: float = 0.0
    latency_s: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        for kind in FAULT_KINDS:
            p = getattr(self, kind)
            if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
                raise ConfigError(f"retriever fault probability {kind} must be in [0, 1], got {p!r}")
            object.__setattr__(self, kind, float(p))
        for name, low in (("replace_k", 1), ("truncate_words", 1), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
                raise ConfigError(f"retriever fault option {name} must be an integer >= {low}, got {value!r}")
            object.__setattr__(self, name, int(value))
        latency_s = self.latency_s
        if isinstance(latency_s, bool) or not isinstance(latency_s, int | float) or not latency_s >= 0:
            raise ConfigError(f"retriever fault option latency_s must be a number >= 0, got {latency_s!r}")
        object.__setattr__(self, "latency_s", float(latency_s))

    @property
    def probabilities(self) -> np.ndarray:
        """``(len(FAULT_KINDS),)`` float, the probability of each kind in :data:`FAULT_KINDS` order."""
        return np.array([getattr(self, kind) for kind in FAULT_KINDS])

    def to_dict(self) -> dict[str, Any]:
        """The options as a plain dict (for manifests and logs)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def parse_faults(spec: Any) -> RetrieverFaults | None:
    """Resolves a ``retriever_faults`` argument.

    Args:
        spec: ``None`` (no faults), a :class:`RetrieverFaults`, a mapping of its fields, or a string of
            ``name=value`` pairs separated by commas (``"empty=0.1,replace=0.2,replace_k=2,seed=3"``).

    Raises:
        ConfigError: an unknown name, a value of the wrong type, or a probability outside ``[0, 1]``.
    """
    if spec is None or isinstance(spec, RetrieverFaults):
        return spec
    valid = [f.name for f in fields(RetrieverFaults)]
    if isinstance(spec, str):
        values: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, sep, raw = part.partition("=")
            name = name.strip()
            if not sep or name not in valid:
                raise ConfigError(f"bad retriever fault {part!r}: write name=value with a name of {valid}")
            try:
                values[name] = int(raw) if name in ("replace_k", "truncate_words", "seed") else float(raw)
            except ValueError:
                raise ConfigError(f"bad retriever fault value in {part!r}: not a number") from None
        spec = values
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"retriever_faults must be None, a RetrieverFaults, a mapping or a 'name=value,...' string; "
            f"got {type(spec).__name__}"
        )
    unknown = sorted(set(spec) - set(valid))
    if unknown:
        raise ConfigError(f"unknown retriever fault options {unknown}; valid: {valid}")
    return RetrieverFaults(**spec)


def _truncate(hit: Hit, words: int) -> Hit:
    """``hit`` with its text cut to ``words`` words; the title line of its ``contents`` is kept as it is."""
    title_line, _, _ = hit.contents.partition("\n")
    text = " ".join(hit.text.split()[:words])
    return Hit(hit.passage_id, hit.title, text, hit.score, f"{title_line}\n{text}")


def apply_faults(
    hits: Sequence[Hit],
    faults: RetrieverFaults,
    rng: np.random.Generator,
    passages: Sequence[Passage] = (),
) -> tuple[list[Hit], tuple[str, ...], float]:
    """Draws the faults of one search and applies them to its results.

    Args:
        hits: The search's results, in rank order.
        faults: The fault probabilities and sizes.
        rng: The fault generator; exactly ``len(FAULT_KINDS) + 1`` uniforms are drawn from it.
        passages: The corpus ``replace`` draws from (without it, ``replace`` is drawn but changes nothing).

    Returns:
        The results after the faults, the kinds drawn (in :data:`FAULT_KINDS` order), and the latency in
        seconds that the caller should add (the caller sleeps, so a batch of searches waits once).
    """
    draws = rng.random(_DRAWS)
    fired = tuple(kind for kind, u, p in zip(FAULT_KINDS, draws, faults.probabilities, strict=False) if u < p)
    delay = faults.latency_s if "latency" in fired else 0.0
    out = list(hits)
    if not fired or fired == ("latency",):
        return out, fired, delay
    if "empty" in fired:
        return [], fired, delay
    choices = np.random.default_rng(int(draws[-1] * 2**53))
    if "replace" in fired and out and passages:
        taken = {h.passage_id for h in out}
        for position in sorted(choices.choice(len(out), min(faults.replace_k, len(out)), replace=False)):
            start = int(choices.integers(len(passages)))
            # The first passage from a random start that is not already shown (a corpus smaller than the
            # results leaves the rest as they are).
            for step in range(len(passages)):
                passage = passages[(start + step) % len(passages)]
                if passage.id not in taken:
                    taken.add(passage.id)
                    out[int(position)] = Hit.of(passage, out[int(position)].score)
                    break
    if "shuffle" in fired and len(out) > 1:
        out = [out[int(i)] for i in choices.permutation(len(out))]
    if "truncate" in fired:
        out = [_truncate(h, faults.truncate_words) for h in out]
    return out, fired, delay


class FaultyRetriever(Retriever):
    """Any retriever with seeded faults injected into its results (outside an environment).

    The environments inject faults themselves (``retriever_faults=``), with one generator per episode, so
    their faults follow ``reset(seed=...)`` and snapshots; this wrapper keeps one generator for all its
    searches, drawn in query order.

    Args:
        inner: The retriever whose results are faulted (closed by :meth:`close`).
        faults: A :class:`RetrieverFaults` or anything :func:`parse_faults` accepts.
        passages: The corpus ``replace`` draws from.

    Attributes:
        counts: How many times each kind was injected so far.
    """

    name = "faulty"

    def __init__(self, inner: Retriever, faults: Any, passages: Sequence[Passage] = ()) -> None:
        parsed = parse_faults(faults)
        if parsed is None:
            raise ConfigError("FaultyRetriever needs faults; pass the inner retriever itself for none")
        self.inner = inner
        self.faults = parsed
        self.passages = passages
        self.rng = np.random.default_rng(parsed.seed)
        self.counts = dict.fromkeys(FAULT_KINDS, 0)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        results = self.inner.search(queries, k)
        out, delay = [], 0.0
        for hits in results:
            faulted, fired, latency = apply_faults(hits, self.faults, self.rng, self.passages)
            for kind in fired:
                self.counts[kind] += 1
            delay = max(delay, latency)  # the batch's searches wait together
            out.append(faulted)
        if delay:
            time.sleep(delay)
        return out

    def close(self) -> None:
        self.inner.close()
