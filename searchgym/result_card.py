"""The result card: the settings that decide whether two evaluation figures may be compared.

Two exact-match figures compare only when the agents answered the same questions (split hash and name),
searched the same corpus (its hash) with the same retriever (its spec and index hash, its injected faults,
top-k), within the same episode (env id, turn budget, prompt style), scored by the same reward and answer
normaliser (the hash of ``searchgym/rewards.py``), sampled the same way (temperature, samples per question)
from the same seeds. ``searchgym eval --out`` writes the card into its manifest, ``searchgym benchmark``
into each dataset of its report, and refuses to pair agents whose cards differ. An agent's own sizes (turn
and context tokens, its tokenizer) are not on the card: they are part of the agent being compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from searchgym.errors import ConfigError

__all__ = [
    "CARD_FIELDS",
    "NOT_AUDITED",
    "card_audit",
    "card_differences",
    "card_table",
    "check_cards",
    "result_card",
    "with_audit",
]

CARD_FIELDS = (
    "env",
    "split",
    "questions_sha256",
    "corpus_sha256",
    "retriever",
    "index_sha256",
    "retriever_faults",
    "topk",
    "max_turns",
    "prompt_style",
    "reward",
    "normaliser_sha256",
    "temperature",
    "samples",
    "seed",
)
"""Every field of a card, in order; two cards compare on all of them."""


def _played_retriever(spec: Any) -> Any:
    """The retriever whose results the episodes got: a recording cassette's inner spec (the cassette file
    grows as it records, and what it records is that spec's results), else ``spec``."""
    if isinstance(spec, str) and spec.startswith("cassette:"):
        _, _, option = spec.partition(";")
        mode, sep, inner = option.partition("=")
        if sep and mode.startswith("record"):
            return inner
    return spec


def result_card(
    record: Mapping[str, Any], *, env: str, temperature: float, samples: int, seed: int
) -> dict[str, Any]:
    """The card of a run whose environment's spec has the record ``record`` (``EnvSpec.to_record()``: every
    field given) on env id ``env``.

    Raises:
        ConfigError: ``record`` lacks a field the card reads, or the dataset cannot be found.
    """
    from searchgym import rewards
    from searchgym.manifest import ENV_RECORD_KEYS, dataset_fingerprint, file_digest, retriever_fingerprint

    missing = sorted({*ENV_RECORD_KEYS, "max_turns", "prompt_style"} - set(record))
    if missing:
        raise ConfigError(
            f"the env record of a result card lacks {missing}: give EnvSpec.to_record()'s whole"
        )
    data = dataset_fingerprint(record["dataset"], str(record["split"]), int(record["world_seed"]))
    spec = _played_retriever(record["retriever"])
    retriever = retriever_fingerprint(spec, record["topk"], record["retriever_faults"])
    card = {
        "env": env,
        "split": data["split"],
        "questions_sha256": data["questions_sha256"],
        "corpus_sha256": data["corpus_sha256"],
        "retriever": retriever["spec"],
        "index_sha256": retriever["index_sha256"],
        "retriever_faults": retriever["faults"],
        "topk": record["topk"],
        "max_turns": record["max_turns"],
        "prompt_style": record["prompt_style"],
        "reward": record["reward"],
        "normaliser_sha256": file_digest(rewards.__file__),
        "temperature": float(temperature),
        "samples": int(samples),
        "seed": int(seed),
    }
    return {name: card[name] for name in CARD_FIELDS}


NOT_AUDITED = "not audited"
"""A card's ``audit`` when its questions were not audited."""

AUDIT_KEYS = (
    "questions",
    "topk",
    "unanswerable",
    "answer_absent",
    "gold_missing",
    "unreachable",
    "unanswerable_count",
    "answer_absent_count",
    "gold_missing_count",
    "unreachable_count",
)
"""The audit figures a card carries (:func:`searchgym.audit.audit_shares`, less the per-kind ones)."""


def with_audit(card: Mapping[str, Any], shares: Mapping[str, Any] | None) -> dict[str, Any]:
    """``card`` carrying the audited shares of its questions (:func:`searchgym.audit.audit_shares`), or
    :data:`NOT_AUDITED` for ``None``. The audit is not a field two cards compare on: it follows from the
    fields (the questions, corpus, retriever and top-k)."""
    audit: Any = NOT_AUDITED if shares is None else {k: shares[k] for k in AUDIT_KEYS}
    return {**card, "audit": audit}


def card_audit(card: Mapping[str, Any]) -> dict[str, Any] | None:
    """The audited shares a card carries (:func:`with_audit`), or ``None`` when it was not audited."""
    audit = card.get("audit")
    return dict(audit) if isinstance(audit, Mapping) else None


def card_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The card fields on which ``a`` and ``b`` differ (a field one lacks counts as differing)."""
    return [name for name in CARD_FIELDS if a.get(name, ...) != b.get(name, ...)]


def check_cards(cards: Mapping[str, Mapping[str, Any]], what: str) -> None:
    """Checks every card of ``cards`` (by agent) equals the first one.

    Args:
        cards: Each agent's card, the baseline first.
        what: What the figures are of, for the message (``"dataset nq"``).

    Raises:
        ConfigError: two cards differ; the message names the agents, the first differing field and both
            values.
    """
    names = list(cards)
    for name in names[1:]:
        differ = card_differences(cards[names[0]], cards[name])
        if differ:
            field = differ[0]
            more = f" (and {', '.join(differ[1:])})" if len(differ) > 1 else ""
            raise ConfigError(
                f"cannot pair {name} with {names[0]} on {what}: their result cards differ in {field}{more} "
                f"({cards[names[0]].get(field)!r:.80} vs {cards[name].get(field)!r:.80}); play both with the same "
                "settings (a cached pair is played again once its folder under pairs/ is removed)"
            )


def card_table(cards: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Markdown lines of one card per row (by dataset), its hashes cut to 12 hex digits."""

    def cell(value: Any) -> str:
        if isinstance(value, str) and value.startswith("sha256:"):
            return value[len("sha256:") :][:12]
        if isinstance(value, dict):
            return ",".join(f"{k}={v}" for k, v in value.items())
        return "–" if value is None else str(value)

    lines = ["| dataset | " + " | ".join(CARD_FIELDS) + " |", "|---" * (1 + len(CARD_FIELDS)) + "|"]
    for name, card in cards.items():
        lines.append(f"| {name} | " + " | ".join(cell(card.get(f)) for f in CARD_FIELDS) + " |")
    return lines
