"""What a benchmark score means, beside the score: how much of it comes from search (retriever reliance
under ablations), how many of its misses exact match may call wrong (near misses), and whether the questions
could be answered at all (the audit on each dataset's card, and the figures on the answerable questions).
The report's ``reliance`` rows are built here; :func:`searchgym.app.benchmark.markdown_report` adds these
sections' markdown."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from searchgym.errors import ConfigError
from searchgym.stats import RESAMPLES, Interval, bootstrap_mean, paired_difference, wilson

__all__ = ["answerable_lines", "audit_lines", "near_miss_lines", "reliance_lines", "reliance_rows"]


def _em(records: Sequence[Mapping[str, Any]], samples: int) -> np.ndarray:
    """Each question's exact match: the mean over its ``samples`` consecutive episodes."""
    return np.asarray([float(r["em"]) for r in records]).reshape(-1, samples).mean(axis=1)


def _proportion(values: np.ndarray) -> Interval:
    return wilson(float(values.sum()), len(values))


def _cell(interval: Mapping[str, float], digits: int = 3) -> str:
    return f"{interval['mean']:.{digits}f} [{interval['low']:.{digits}f}, {interval['high']:.{digits}f}]"


def _search_rate(records: Sequence[Mapping[str, Any]], samples: int) -> Interval:
    """The share of episodes that searched at least once (mean@K per question), with Wilson's interval."""
    searched = (
        np.asarray([float(r["searches"]) > 0 for r in records], dtype=float).reshape(-1, samples).mean(1)
    )
    return wilson(float(searched.sum()), len(searched))


def reliance_rows(
    episodes: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]],
    ablations: Mapping[str, Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]]],
    datasets: Sequence[str],
    samples: int = 1,
    resamples: int = RESAMPLES,
) -> list[dict[str, Any]]:
    """How much each agent's score comes from search: per agent and dataset, EM and the search rate with the
    real retriever and under each ablation, the drop ``EM(real) - EM(ablated)`` with a paired interval
    (Newcombe's; with K > 1 samples a paired bootstrap of mean@K), and ``reliance``: the drop under the
    ``empty`` ablation (``None`` without it).

    Raises:
        ConfigError: an ablation's episodes are not the real ones' questions, in order.
    """
    rows = []
    for a, by_dataset in ablations.items():
        for d in datasets:
            real = episodes[a][d]
            real_em = _em(real, samples)
            row: dict[str, Any] = {
                "agent": a,
                "dataset": d,
                "real": {
                    "em": _proportion(real_em).to_json(),
                    "search_rate": _search_rate(real, samples).to_json(),
                },
                "ablations": {},
                "reliance": None,
            }
            for kind, records in by_dataset.get(d, {}).items():
                if [r.get("question_id") for r in records] != [r.get("question_id") for r in real]:
                    raise ConfigError(
                        f"{a} on {d}: the {kind} ablation played other questions than the real run"
                    )
                em = _em(records, samples)
                if samples == 1:
                    drop = paired_difference(em >= 1.0, real_em >= 1.0)
                else:
                    drop = bootstrap_mean(
                        real_em - em, seed=zlib.crc32(f"{a}\0{d}\0{kind}".encode()), resamples=resamples
                    )
                row["ablations"][kind] = {
                    "em": _proportion(em).to_json(),
                    "search_rate": _search_rate(records, samples).to_json(),
                    "em_drop": drop.to_json(),
                }
            if "empty" in row["ablations"]:
                row["reliance"] = row["ablations"]["empty"]["em_drop"]
            rows.append(row)
    return rows


def reliance_lines(report: Mapping[str, Any]) -> list[str]:
    """The markdown of a report's ``reliance`` rows (none for a report without them)."""
    rows = report.get("reliance") or []
    if not rows:
        return []
    kinds = list(dict.fromkeys(k for r in rows for k in r["ablations"]))
    heads = ["dataset", "agent", "EM real", *(f"EM {k}" for k in kinds), "reliance = EM real − EM empty"]
    heads += ["searched (real)", *(f"searched ({k})" for k in kinds)]
    lines = [
        "",
        f"## Retriever reliance, {report.get('decoding', 'greedy')}",
        "",
        "Each agent played the same questions again with the retriever replaced: empty (no passages), random "
        "(passages drawn from the corpus), shuffled (another question's passages). Reliance is the paired "
        "drop in exact match under the empty retriever (Newcombe interval); searched: the share of episodes "
        "with at least one search.",
        "",
        "| " + " | ".join(heads) + " |",
        "|---" * len(heads) + "|",
    ]
    for r in rows:
        ablated = r["ablations"]
        cells = [r["dataset"], r["agent"], _cell(r["real"]["em"])]
        cells += [_cell(ablated[k]["em"]) if k in ablated else "–" for k in kinds]
        cells.append(_cell(r["reliance"]) if r["reliance"] is not None else "–")
        cells.append(f"{r['real']['search_rate']['mean']:.2f}")
        cells += [f"{ablated[k]['search_rate']['mean']:.2f}" if k in ablated else "–" for k in kinds]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def near_miss_lines(report: Mapping[str, Any]) -> list[str]:
    """The markdown of a report's ``near_misses`` (none when no agent has an answered EM-0 episode)."""
    rows = [r for r in report.get("near_misses") or [] if r["wrong"]]
    if not rows:
        return []
    lines = [
        "",
        "## Exact match's near misses",
        "",
        "Of the answered episodes exact match scores 0: those whose answer contains a golden answer (whole "
        "words, normalised) or reaches token F1 ≥ 0.8 against one. `searchgym view --near-miss` shows them "
        "with the gold beside the answer.",
        "",
        "| dataset | agent | EM-0 answers | contain a golden answer | F1 ≥ 0.8 (not containing) | near misses |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['agent']} | {r['wrong']} | {r['contains_gold']} | {r['high_f1']} | "
            f"{r['near']} ({r['share']:.0%}) |"
        )
    return lines


def audit_lines(report: Mapping[str, Any]) -> list[str]:
    """Each dataset's audited shares (:mod:`searchgym.audit`), as its card carries them."""
    from searchgym.result_card import card_audit

    lines = ["", "Audit of the questions played (`searchgym audit`):", ""]
    for d in report["datasets"]:
        audit = card_audit(d.get("card") or {})
        if audit is None:
            lines.append(f"- {d['name']}: not audited")
            continue
        lines.append(
            f"- {d['name']}: {audit['questions']} questions; unanswerable from the corpus "
            f"{audit['unanswerable_count']} ({audit['unanswerable']:.1%}: answer absent "
            f"{audit['answer_absent_count']}, gold passage missing {audit['gold_missing_count']}); "
            f"unreachable by the retriever at k={audit['topk']} {audit['unreachable_count']} "
            f"({audit['unreachable']:.1%})"
        )
    return lines


def answerable_lines(report: Mapping[str, Any]) -> list[str]:
    """The exact match of each agent on the full set and on the answerable questions only, side by side
    (none for a report without an ``answerable`` part)."""
    part = report.get("answerable")
    if not part:
        return []
    full = {(r["agent"], r["dataset"]): r for r in report["results"]}
    lines = [
        "",
        f"## Exact match on every question and on the answerable ones, {report.get('decoding', 'greedy')}",
        "",
        "Answerable: a golden answer occurs in the corpus and every named gold passage is in it (`searchgym "
        "audit`).",
        "",
        "| dataset | agent | EM (all) | questions | EM (answerable) | answerable questions |",
        "|---|---|---|---|---|---|",
    ]
    for r in part["results"]:
        whole = full[r["agent"], r["dataset"]]
        lines.append(
            f"| {r['dataset']} | {r['agent']} | {_cell(whole['em'])} | {whole['questions']} | "
            f"{_cell(r['em'])} | {r['questions']} |"
        )
    return lines
