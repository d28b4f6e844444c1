"""The benchmark report: per-dataset and averaged figures with intervals, paired comparisons, a markdown
table and a plot, from the episodes each agent played on each dataset.

Search-R1 (Jin et al. 2025, Table 2) groups its datasets as *general QA* (NQ, TriviaQA, PopQA) and
*multi-hop QA* (HotpotQA, 2WikiMultiHopQA, MuSiQue, Bamboogle) and averages exact match over datasets, each
dataset counting once whatever its size; the averages here are computed the same way, per group and over
all datasets. Everything in this module works on plain episode records (the JSON lines ``searchgym eval
--out`` writes); playing the episodes is the ``searchgym benchmark`` command's job.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from searchgym.errors import ConfigError
from searchgym.stats import (
    RESAMPLES,
    Interval,
    bootstrap_mean,
    bootstrap_mean_of_means,
    mcnemar_p,
    mover_sum,
    paired_difference,
    pass_at_k,
    wilson,
)

__all__ = [
    "GROUPS",
    "METRICS",
    "build_report",
    "dataset_group",
    "decoding_label",
    "markdown_report",
    "plot_report",
    "resolve_dataset",
]

GROUPS = {
    "general": ("nq", "triviaqa", "popqa"),
    "multi-hop": ("hotpotqa", "2wikimultihopqa", "2wiki", "musique", "bamboogle"),
}
"""Search-R1's two groups and the dataset names (words of a folder's name) that place a folder in each."""

AVERAGES = ("general", "multi-hop", "all")

METRICS = ("em", "f1", "searches", "answered")
"""The per-question figures of a report: exact match, token F1, searches made, and whether it answered."""

PROPORTIONS = ("em", "answered")
"""The figures that are proportions, with Wilson's interval (the others: a percentile bootstrap)."""


def decoding_label(temperature: float, samples: int) -> str:
    """How the episodes were decoded, for a table's title: ``greedy`` or ``T=1, K=4``.

    >>> decoding_label(0.0, 1), decoding_label(1.0, 4), decoding_label(0.0, 3)
    ('greedy', 'T=1, K=4', 'greedy, K=3')
    """
    if temperature == 0:
        return "greedy" if samples == 1 else f"greedy, K={samples}"
    return f"T={temperature:g}, K={samples}"


def dataset_group(name: str) -> str:
    """``general``, ``multi-hop`` or ``other``, from the words of a dataset folder's name.

    >>> dataset_group("nq_open_oracle_2655"), dataset_group("hotpotqa_dev"), dataset_group("my_set")
    ('general', 'multi-hop', 'other')
    """
    words = set(re.split(r"[^a-z0-9]+", name.lower()))
    for group, names in GROUPS.items():
        if words & set(names):
            return group
    return "other"


def resolve_dataset(spec: str, data_root: str | Path | None) -> Path:
    """The FlashRAG folder ``spec`` names: a folder path, or a name inside ``data_root`` — the folder of
    that name, else the one folder whose name has ``spec`` as a word (``nq`` finds ``nq_open_oracle_2655``).

    Raises:
        ConfigError: nothing matches, or several folders do (they are listed).
    """
    path = Path(spec)
    if path.is_dir():
        return path
    if data_root is None:
        raise ConfigError(
            f"--datasets {spec}: no such folder (give a path, or --data-root to look names up in)"
        )
    root = Path(data_root)
    if (root / spec).is_dir():
        return root / spec
    if not root.is_dir():
        raise ConfigError(f"--data-root {root}: no such folder")
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    words = spec.lower()
    matches = [p for p in folders if words in re.split(r"[^a-z0-9]+", p.name.lower())]
    if len(matches) == 1:
        return matches[0]
    found = ", ".join(p.name for p in (matches or folders)) or "none"
    why = "names several folders" if matches else "names no folder"
    raise ConfigError(f"--datasets {spec} {why} in {root} ({found}); give the folder's name or path")


def _outcomes(records: Sequence[Mapping[str, Any]], samples: int) -> dict[str, np.ndarray]:
    """Each figure per question: the mean over its ``samples`` consecutive episodes."""
    figures = {
        "em": [float(r["em"]) for r in records],
        "f1": [float(r["f1"]) for r in records],
        "searches": [float(r["searches"]) for r in records],
        "answered": [float(r["end_reason"] == "answered") for r in records],
    }
    return {m: np.asarray(v).reshape(-1, samples).mean(axis=1) for m, v in figures.items()}


def _interval(metric: str, values: np.ndarray, seed: int, resamples: int) -> Interval:
    if metric in PROPORTIONS:
        return wilson(float(values.sum()), len(values))
    return bootstrap_mean(values, seed=seed, resamples=resamples)


def _average(metric: str, groups: list[np.ndarray], seed: int, resamples: int) -> Interval:
    """The unweighted mean over datasets: Wilson limits combined by square and add for a proportion."""
    if metric in PROPORTIONS:
        return mover_sum([(1 / len(groups), wilson(float(g.sum()), len(g))) for g in groups])
    return bootstrap_mean_of_means(groups, seed=seed, resamples=resamples)


def _seed(*key: str) -> int:
    """A bootstrap seed fixed by what is resampled, so adding an agent or a dataset changes no other figure."""
    return zlib.crc32("\0".join(key).encode("utf-8"))


def build_report(
    episodes: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]],
    datasets: Sequence[Mapping[str, Any]],
    *,
    resamples: int = RESAMPLES,
    settings: Mapping[str, Any] | None = None,
    samples: int = 1,
    temperature: float = 0.0,
    cards: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
    ablations: Mapping[str, Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]]] | None = None,
) -> dict[str, Any]:
    """The benchmark's figures from the episode records of every (agent, dataset) pair.

    Args:
        episodes: ``episodes[agent][dataset]``: the records (``eval --out`` lines) that agent played on that
            dataset; every agent must have played the same questions of a dataset, in the same order.
        datasets: One mapping per dataset, in report order, with at least ``name`` and ``group``.
        resamples: Bootstrap resamples per interval (F1 and searches).
        settings: What produced the episodes (agents' specs, env options, seed), kept in the report.
        samples: Episodes per question (K), consecutive in the records; each figure is a question's mean
            over them (for ``em``, mean@K).
        temperature: The sampling temperature the agents played at (0: greedy), for the tables' label.
        cards: ``cards[agent][dataset]``: the result card each pair played under
            (:func:`searchgym.result_card.result_card`); agents are paired on a dataset only when their cards
            are equal, and the report gives each dataset its card.
        ablations: ``ablations[agent][dataset][kind]``: the records the agent played on the same questions
            with the retriever replaced by an ablation (:mod:`searchgym.retrieval.ablation`), for the
            report's ``reliance`` rows.

    Returns:
        A JSON-ready dict: ``results`` (one row per agent and dataset: ``em``, ``f1``, ``searches``,
        ``answered``, each ``{mean, low, high}`` — Wilson's interval for the proportions, a bootstrap for the
        others —, ``pass_at_k`` and each question's ``successes``), ``averages`` (per agent: ``general``,
        ``multi-hop``, ``all`` — unweighted over datasets, the groups that have datasets), and ``paired``
        (each agent after the first against the first, per dataset and on the ``all`` average: ``em_diff``
        with Newcombe's paired interval, McNemar's ``p``, the discordant counts, and ``disagree`` — true when
        the interval and the test reach different verdicts at the 5 % level; with K > 1 samples the
        difference of mean@K gets a paired bootstrap and no McNemar test), ``failures`` (per agent and
        dataset, the episodes counted by the stage they failed at, overall and per question kind:
        :func:`searchgym.failures.decompose`) and ``flips`` (each agent after the first against the first,
        per dataset: the episodes gained and lost by stage, :func:`searchgym.failures.flip_table`),
        ``near_misses`` (per agent and dataset: :func:`searchgym.failures.near_misses`) and, with
        ``ablations``, ``reliance`` (:func:`searchgym.score_meaning.reliance_rows`).

    Raises:
        ConfigError: two agents' episodes of a dataset are not the same questions, or were played under
            different result cards (the field named).
    """
    from searchgym.failures import decompose, flip_table, near_misses
    from searchgym.result_card import check_cards
    from searchgym.score_meaning import reliance_rows

    agents = list(episodes)
    names = [str(d["name"]) for d in datasets]
    for d in names:
        ids = [[r.get("question_id") for r in episodes[a][d]] for a in agents]
        for agent, other in zip(agents[1:], ids[1:], strict=True):
            if other != ids[0]:
                raise ConfigError(
                    f"{agent} and {agents[0]} played different questions of {d} ({len(other)} and "
                    f"{len(ids[0])} episodes): a paired comparison needs the same ones"
                )
        for a in agents:
            if len(episodes[a][d]) % samples:
                raise ConfigError(
                    f"{a} on {d}: {len(episodes[a][d])} episodes are not {samples} per question"
                )
    if cards is not None:
        for d in names:
            check_cards({a: cards[a][d] for a in agents}, f"dataset {d}")
    outcomes = {a: {d: _outcomes(episodes[a][d], samples) for d in names} for a in agents}
    results = []
    for a in agents:
        for spec in datasets:
            d = str(spec["name"])
            successes = [
                sum(float(r["em"]) >= 1.0 for r in episodes[a][d][i : i + samples])
                for i in range(0, len(episodes[a][d]), samples)
            ]
            row: dict[str, Any] = {
                "agent": a,
                "dataset": d,
                "group": spec["group"],
                "episodes": len(episodes[a][d]),
                "questions": len(successes),
            }
            for m in METRICS:
                row[m] = _interval(m, outcomes[a][d][m], _seed(a, d, m), resamples).to_json()
            row["pass_at_k"] = float(np.mean([pass_at_k(samples, c, samples) for c in successes]))
            row["successes"] = successes
            results.append(row)
    members = {g: [str(s["name"]) for s in datasets if g == "all" or s["group"] == g] for g in AVERAGES}
    averages = []
    for a in agents:
        for g in AVERAGES:
            if not members[g]:
                continue
            row = {"agent": a, "group": g, "datasets": members[g]}
            for m in ("em", "f1"):
                groups = [outcomes[a][d][m] for d in members[g]]
                row[m] = _average(m, groups, _seed(a, g, m), resamples).to_json()
            averages.append(row)
    paired = []
    baseline = agents[0]
    for a in agents[1:]:
        differences = []
        for d in names:
            mine, theirs = outcomes[a][d]["em"], outcomes[baseline][d]["em"]
            p: float | None = None
            only_baseline: int | None = None
            only_agent: int | None = None
            disagree: bool | None = None
            if samples == 1:
                p, only_baseline, only_agent = mcnemar_p(theirs >= 1.0, mine >= 1.0)
                diff = paired_difference(theirs >= 1.0, mine >= 1.0)
                disagree = (p < 0.05) != (diff.low > 0 or diff.high < 0)
            else:
                diff = bootstrap_mean(mine - theirs, seed=_seed(a, baseline, d), resamples=resamples)
            differences.append(diff)
            paired.append(
                {
                    "agent": a,
                    "baseline": baseline,
                    "dataset": d,
                    "em_diff": diff.to_json(),
                    "mcnemar_p": p,
                    "only_agent": only_agent,
                    "only_baseline": only_baseline,
                    "disagree": disagree,
                }
            )
        paired.append(
            {
                "agent": a,
                "baseline": baseline,
                "dataset": "all",
                "em_diff": mover_sum([(1 / len(names), diff) for diff in differences]).to_json(),
                "mcnemar_p": None,
                "only_agent": None,
                "only_baseline": None,
                "disagree": None,
            }
        )
    failures = [{"agent": a, "dataset": d, **decompose(episodes[a][d])} for a in agents for d in names]
    flips = [
        {"agent": a, "baseline": baseline, "dataset": d, **flip_table(episodes[baseline][d], episodes[a][d])}
        for a in agents[1:]
        for d in names
    ]
    return {
        "agents": agents,
        "datasets": [
            {**d, "card": dict(cards[baseline][str(d["name"])])} if cards is not None else dict(d)
            for d in datasets
        ],
        "level": 0.95,
        "interval": "wilson" if samples == 1 else "wilson (mean@K over questions)",
        "bootstrap_resamples": resamples,
        "samples": samples,
        "temperature": temperature,
        "decoding": decoding_label(temperature, samples),
        "settings": dict(settings or {}),
        "results": results,
        "averages": averages,
        "paired": paired,
        "failures": failures,
        "flips": flips,
        "near_misses": [
            {"agent": a, "dataset": d, **near_misses(episodes[a][d])} for a in agents for d in names
        ],
        "reliance": reliance_rows(episodes, ablations, names, samples, resamples) if ablations else [],
    }


def _cell(interval: Mapping[str, float], digits: int = 3) -> str:
    return f"{interval['mean']:.{digits}f} [{interval['low']:.{digits}f}, {interval['high']:.{digits}f}]"


def _p(value: float | None) -> str:
    if value is None:
        return "–"
    if value == 0.0:  # below the smallest double: McNemar's p for thousands of one-sided discordant questions
        return "< 1e-300"
    return f"{value:.2g}" if value >= 1e-4 else f"{value:.1e}"


def markdown_report(report: Mapping[str, Any]) -> str:
    """The report as markdown: exact match per dataset and averaged (Search-R1's table), every figure per
    dataset, and the paired comparisons against the first agent. Every table's title says how the episodes
    were decoded (``greedy``, or the temperature and samples per question)."""
    agents, datasets = report["agents"], report["datasets"]
    result = {(r["agent"], r["dataset"]): r for r in report["results"]}
    average = {(r["agent"], r["group"]): r for r in report["averages"]}
    groups = [g for g in AVERAGES if any(r["group"] == g for r in report["averages"])]
    level = f"{report['level']:.0%}"
    samples = int(report.get("samples", 1))
    decoding = report.get("decoding", "greedy")
    em = "exact match" if samples == 1 else f"exact match, mean@{samples}"
    lines = [
        f"## Exact match, {decoding} ({em} [{level} Wilson interval over questions])",
        "",
        "| agent | "
        + " | ".join(f"{d['name']} ({d['group']})" for d in datasets)
        + " | "
        + " | ".join(f"{g} avg" for g in groups)
        + " |",
        "|---" * (1 + len(datasets) + len(groups)) + "|",
    ]
    for a in agents:
        cells = [_cell(result[a, d["name"]]["em"]) for d in datasets] + [
            _cell(average[a, g]["em"]) for g in groups
        ]
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    extra = f" | pass@{samples}" if samples > 1 else ""
    lines += [
        "",
        "Averages are unweighted over datasets (each counts once), as Search-R1 reports them; their intervals "
        "combine the datasets' Wilson intervals by square and add.",
        "",
        f"## Every figure per dataset, {decoding}",
        "",
        f"| dataset | agent | episodes | EM | F1 | searches | answered{extra} |",
        "|---" * (7 + (samples > 1)) + "|",
    ]
    for d in datasets:
        for a in agents:
            r = result[a, d["name"]]
            figures = " | ".join(_cell(r[m], 2 if m == "searches" else 3) for m in METRICS)
            more = f" | {r['pass_at_k']:.3f}" if samples > 1 else ""
            lines.append(f"| {d['name']} | {a} | {r['episodes']} | {figures}{more} |")
    lines.append("")
    lines.append("EM and answered: Wilson intervals; F1 and searches: percentile bootstrap over questions.")
    if report["paired"]:
        baseline = agents[0]
        how = "Newcombe interval" if samples == 1 else "bootstrap interval"
        lines += [
            "",
            f"## Paired against {baseline} (the same questions), {decoding}",
            "",
            f"| dataset | agent | EM − {baseline} [{level} {how}] | McNemar p | right only here / only {baseline} |",
            "|---|---|---|---|---|",
        ]
        flagged = False
        for r in report["paired"]:
            counts = "–" if r["only_agent"] is None else f"{r['only_agent']} / {r['only_baseline']}"
            name = "all (avg)" if r["dataset"] == "all" else r["dataset"]
            flag = " ⚠" if r.get("disagree") else ""
            flagged = flagged or bool(r.get("disagree"))
            lines.append(
                f"| {name} | {r['agent']} | {_cell(r['em_diff'])}{flag} | {_p(r['mcnemar_p'])} | {counts} |"
            )
        if flagged:
            lines += [
                "",
                "⚠: the interval and McNemar's test disagree at the 5 % level (one excludes 0, the other does "
                "not): the difference is at the edge of what these questions can show.",
            ]
    from searchgym.score_meaning import answerable_lines, audit_lines, near_miss_lines, reliance_lines

    lines += _failure_lines(report, decoding)
    lines += near_miss_lines(report)
    lines += reliance_lines(report)
    lines += answerable_lines(report)
    cards = {str(d["name"]): d["card"] for d in datasets if d.get("card")}
    if cards:
        from searchgym.result_card import card_table

        lines += [
            "",
            "## Result card: what these figures compare on",
            "",
            "Every agent of a dataset played under this card (hashes: the first 12 hex digits of their SHA-256).",
            "",
            *card_table(cards),
        ]
        lines += audit_lines(report)
    return "\n".join(lines) + "\n"


def _failure_lines(report: Mapping[str, Any], decoding: str) -> list[str]:
    """The markdown of the report's ``failures`` and ``flips`` (none for a report without them)."""
    from searchgym.failures import UNLABELLED, failure_table, flips_table

    failures = report.get("failures") or []
    if not failures:
        return []
    lines = [
        "",
        f"## Why answers fail, {decoding}",
        "",
        "Each episode is correct or missed at the first stage that went wrong: no answer; gold not retrieved "
        "(some gold passage never retrieved, where the dataset names them; else no golden answer in any "
        "retrieved text); retrieved but misread.",
        "",
        *failure_table([((r["dataset"], r["agent"]), r) for r in failures], ("dataset", "agent")),
    ]
    kinds = [
        ((r["dataset"], r["agent"], kind), counts)
        for r in failures
        for kind, counts in r["kinds"].items()
        if len(r["kinds"]) > 1 or kind != UNLABELLED
    ]
    if kinds:
        lines += ["", "By question kind:", "", *failure_table(kinds, ("dataset", "agent", "kind"))]
    flips = report.get("flips") or []
    if flips:
        baseline = report["agents"][0]
        lines += [
            "",
            f"## Flips against {baseline}: episodes gained and lost, by the stage of the miss",
            "",
            *flips_table([((r["dataset"], r["agent"]), r) for r in flips], ("dataset", "agent"), baseline),
        ]
    return lines


def plot_report(report: Mapping[str, Any], path: str | Path) -> None:
    """Bars of exact match per dataset and averaged, one per agent, with their intervals, saved to ``path``.

    Raises:
        MissingDependencyError: matplotlib is not installed.
    """
    try:
        import matplotlib
    except ImportError:
        from searchgym.errors import MissingDependencyError

        raise MissingDependencyError("matplotlib", "train", "the benchmark plot") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agents = report["agents"]
    result = {(r["agent"], r["dataset"]): r["em"] for r in report["results"]}
    average = {(r["agent"], r["group"]): r["em"] for r in report["averages"]}
    columns = [(d["name"], result) for d in report["datasets"]]
    columns += [(g, average) for g in AVERAGES if any(r["group"] == g for r in report["averages"])]
    width = 0.8 / len(agents)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(columns) * max(1, len(agents)) ** 0.5 + 2), 4.2))
    x = np.arange(len(columns))
    for i, a in enumerate(agents):
        cells = [table[a, key] for key, table in columns]
        means = [c["mean"] for c in cells]
        errors = [[c["mean"] - c["low"] for c in cells], [c["high"] - c["mean"] for c in cells]]
        ax.bar(x + (i - (len(agents) - 1) / 2) * width, means, width, yerr=errors, capsize=3, label=a)
    if len(columns) > len(report["datasets"]):  # the averages stand apart from the datasets
        ax.axvline(len(report["datasets"]) - 0.5, color="0.6", linestyle="--", linewidth=0.8)
    ax.set_xticks(x, [k if table is result else f"{k}\navg" for k, table in columns], fontsize=8)
    ax.set_ylabel("exact match")
    ax.set_ylim(0, max(1.0, math.ceil(ax.get_ylim()[1] * 10) / 10))
    ax.set_title(
        f"Exact match per dataset, {report.get('decoding', 'greedy')} ({report['level']:.0%} Wilson intervals)"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)
