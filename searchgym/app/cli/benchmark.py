"""``searchgym benchmark``: agents × datasets in one command — Search-R1's table with intervals, paired
comparisons, a plot — with every (agent, dataset) pair cached so that an interrupted run resumes."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import zlib
from pathlib import Path
from typing import Any

from searchgym.app.cli._agent_options import add_sampling_arguments, add_served_arguments
from searchgym.app.cli._common import (
    AGENT_FORMS,
    add_env_arguments,
    positive_int,
)

COMMAND = ("benchmark",)
HELP = "evaluate agents on several datasets: EM/F1 with intervals, group averages, paired differences, a plot"

PAIRS_FOLDER = "pairs"
"""Inside ``--out``: one ``AGENT/DATASET.jsonl`` of episodes per finished pair, and its ``.run.json``."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--agent",
        action="append",
        required=True,
        metavar="SPEC",
        help=f"an agent (repeat for several; the first is the baseline of the paired comparisons): {AGENT_FORMS}",
    )
    parser.add_argument(
        "--datasets",
        nargs="+",
        required=True,
        metavar="DIR",
        help="FlashRAG folders (corpus.jsonl, SPLIT.jsonl), 'world' (the generated world, --world-seed), or "
        "names looked up in --data-root ('nq' finds the one folder with the word nq in its name)",
    )
    parser.add_argument(
        "--ablate",
        default=None,
        metavar="KINDS",
        help="play every agent again with the retriever replaced: empty (no passages), random (passages "
        "drawn from the corpus), shuffled (another question's passages); comma-separated. Reports each "
        "agent's EM and search rate under each, and reliance = EM(real) - EM(empty) with a paired interval",
    )
    parser.add_argument(
        "--audit",
        action="store_true",
        help="audit the questions played (searchgym audit): each dataset's card carries the shares of "
        "unanswerable and unreachable questions",
    )
    parser.add_argument(
        "--answerable-only",
        action="store_true",
        help="with the audit, also score every agent on the answerable questions only, beside the full set",
    )
    parser.add_argument("--data-root", default=None, help="folder where --datasets names are looked up")
    parser.add_argument(
        "--episodes",
        type=positive_int,
        default=None,
        help="play the first N questions of each dataset (default: all of them)",
    )
    parser.add_argument(
        "--out", default=None, metavar="DIR", help="write benchmark.md, .json, .png and the cache here"
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--group",
        action="append",
        default=[],
        metavar="DATASET=GROUP",
        help="place a dataset in 'general', 'multi-hop' or 'other' (default: from its name, as Search-R1 "
        "groups NQ, TriviaQA, PopQA / HotpotQA, 2Wiki, MuSiQue, Bamboogle)",
    )
    from searchgym.app.cli.eval import TRAINED_SIZES, env_defaults

    env = parser.add_argument_group("environment (as searchgym eval)")
    add_env_arguments(env, env_defaults(), unset=TRAINED_SIZES, skip=("dataset", "retriever"))
    env.add_argument(
        "--retriever",
        action="append",
        default=[],
        metavar="SPEC | DATASET=SPEC",
        help="the retriever of every dataset (bm25, rank_bm25, dense:INDEX_DIR, hybrid:INDEX_DIR, a /retrieve "
        "URL), or of one dataset with DATASET=SPEC; repeatable (default: bm25 over each dataset's corpus)",
    )
    env.add_argument("--seed", type=int, default=0, help="base seed (episode i resets with seed + i)")
    add_sampling_arguments(parser)
    add_served_arguments(parser)


def _retrievers(specs: list[str], names: list[str], paths: list[Path]) -> dict[str, str]:
    """Each dataset's retriever spec from ``--retriever`` (one for all, and ``DATASET=SPEC`` overrides)."""
    from searchgym.errors import ConfigError

    default, chosen = "bm25", {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        if sep and not key.startswith(("http://", "https://")) and ":" not in key:
            match = [n for n, p in zip(names, paths, strict=True) if key in (n, str(p))]
            if not match:
                raise ConfigError(
                    f"--retriever {spec}: {key!r} is not one of the datasets ({', '.join(names)})"
                )
            chosen[match[0]] = value
        else:
            default = spec
    return {n: chosen.get(n, default) for n in names}


def _check_cassettes(retrievers: dict[str, str], agents: int) -> None:
    """A cassette holds one corpus's searches, keyed by query: one per dataset; and a ``record`` cassette
    starts empty each time an env opens it, so it records one agent's pairs only.

    Raises:
        ConfigError: a cassette spec covers several datasets, or records for several agents.
    """
    from searchgym.errors import ConfigError

    covered: dict[str, list[str]] = {}
    for name, spec in retrievers.items():
        if spec.startswith("cassette:"):
            covered.setdefault(spec, []).append(name)
    for spec, names in covered.items():
        if len(names) > 1:
            raise ConfigError(
                f"--retriever {spec}: a cassette holds one dataset's searches, and it would serve "
                f"{', '.join(names)}; give each its own with DATASET=cassette:PATH..."
            )
        if ";record=" in spec and agents > 1:
            raise ConfigError(
                f"--retriever {spec}: 'record' starts the cassette afresh for every agent; use record-missing "
                "(cassette:PATH;record-missing=SPEC), or record with one agent and replay it"
            )


def _groups(specs: list[str], names: list[str]) -> dict[str, str]:
    from searchgym.app.benchmark import dataset_group
    from searchgym.errors import ConfigError

    groups = {n: dataset_group(n) for n in names}
    for spec in specs:
        name, _, group = spec.partition("=")
        if name not in groups or group not in ("general", "multi-hop", "other"):
            raise ConfigError(
                f"--group {spec}: expected DATASET=general|multi-hop|other with DATASET one of {', '.join(names)}"
            )
        groups[name] = group
    return groups


def _slug(text: str) -> str:
    """A file name for an agent spec: readable, and distinct for distinct specs."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:60]
    return f"{readable}-{zlib.crc32(text.encode('utf-8')):08x}"


def _pair_args(args: argparse.Namespace, agent: str, dataset: Path, retriever: str) -> argparse.Namespace:
    """The ``searchgym eval`` options of one (agent, dataset) pair, for the helpers eval shares."""
    pair = argparse.Namespace(**vars(args))
    pair.agent, pair.dataset, pair.retriever = agent, str(dataset), retriever
    return pair


ENV_SIZES = ("topk", "max_turns", "max_turn_tokens", "max_context_tokens")
"""The episode sizes the report gives per agent (``None``: the env's default)."""


def _play_pair(
    pair: argparse.Namespace, path: Path, episodes: int | None, questions: int | None, bar: Any
) -> tuple[list[dict[str, Any]], dict[str, Any], str, dict[str, Any]]:
    """The episode records of one (agent, dataset) pair, the episode sizes it played with, whether they
    were ``cached`` or ``played``, and the result card they were played under: read from ``path`` when a
    finished run with the same identity left it there (with the card recorded then), else played (continuing
    what an interrupted run left in ``path.partial``). ``questions`` is the split's size where it is known;
    each question is played ``pair.samples`` times."""
    from searchgym.agents import evaluate
    from searchgym.agents.evaluate import EpisodeRecord
    from searchgym.app.cli._agent_options import build_agent, close_players, served_players
    from searchgym.app.cli._common import env_kwargs, make_env
    from searchgym.app.cli.eval import (
        TRAINED_SIZES,
        env_defaults,
        held_episodes,
        run_identity,
        trained_env_spec,
        with_trained_sizes,
    )
    from searchgym.data.digests import RecordDigests
    from searchgym.data.jsonl import iter_jsonl, replace_on_success
    from searchgym.errors import ConfigError, DataFormatError
    from searchgym.result_card import result_card

    trained = trained_env_spec(pair.agent)
    defaults = with_trained_sizes(env_defaults(), trained)
    settings = env_kwargs(pair, defaults)
    card = result_card(
        settings, env=pair.env, temperature=pair.temperature, samples=pair.samples, seed=pair.seed
    )
    # None: not given (the env's default); a checkpoint: agent's training sizes where none were given
    from_trained = TRAINED_SIZES if trained is not None else ()
    sizes = {
        k: settings[k] if getattr(pair, k, None) is not None or k in from_trained else None for k in ENV_SIZES
    }
    identity = {**run_identity(pair, settings), "episodes": episodes, "data": _data_stamp(pair)}
    record_path = path.with_name(path.name + ".run.json")
    if path.is_file() and record_path.is_file():
        expected = (
            None if questions is None else (questions if episodes is None else min(episodes, questions))
        )
        expected = None if expected is None else expected * pair.samples
        records, why = _cached_records(path, record_path, identity, expected)
        if records is not None:
            bar.update(len(records))
            saved = _read_record(record_path)
            return records, sizes, "cached", saved.get(CARD, card) if isinstance(saved, dict) else card
        print(f"note: {path} {why}; playing it again", file=sys.stderr)
    record_path.unlink(missing_ok=True)  # from here until the pair is done, no record vouches for the file
    env = make_env(pair, defaults)
    agent = None
    players: list[tuple[Any, Any]] = []
    try:
        agent = build_agent(pair, env)
        if ";record" in pair.retriever:  # a recording cassette records one episode at a time
            pair.concurrency = 1
        players = served_players(pair, lambda: make_env(pair, defaults))
        in_split = len(env.unwrapped.questions)
        count = in_split if episodes is None else min(episodes, in_split)
        partial_record = path.with_name(path.name + ".partial.run.json")
        with replace_on_success(path, keep=True) as partial:
            held: list[EpisodeRecord] = []
            if partial_record.is_file() and partial.stat().st_size > 0:
                try:
                    held, size = held_episodes(partial, partial_record, identity, count * pair.samples)
                    os.truncate(partial, size)  # a last line without its newline goes
                except (ConfigError, DataFormatError, ValueError):
                    held = []  # another command's leftovers, or damaged ones: the pair starts again
            _write_record(partial_record, identity)
            if not held:  # what is not continued goes now, before the digests are counted from the file
                os.truncate(partial, 0)
            digests = RecordDigests(partial, identity)  # the chain the finished pair's record carries
            digests.restart()
            bar.update(len(held))
            evaluate(
                env, agent, count, seed=pair.seed, out=partial, held=held, on_episode=lambda _: bar.update(1),
                on_line=digests.append, samples=pair.samples, players=players,
            )  # fmt: skip
        partial_record.unlink(missing_ok=True)
        _write_record(record_path, {**identity, RECORDS_DIGEST: digests.head, CARD: card})
        digests.remove()
    finally:
        env.close()
        close_players(players)
        if callable(getattr(agent, "close", None)):
            agent.close()  # type: ignore[union-attr]
    return [record for _, record in iter_jsonl(path)], sizes, "played", card


def _data_stamp(pair: argparse.Namespace) -> dict[str, Any]:
    """What the pair's data was: the split file's SHA-256 (its questions and answers) and the corpus file's
    size and modification time (hashing a large corpus on every run would cost minutes)."""
    from searchgym.data import WORLD_VERSION, parse_split
    from searchgym.integrity import file_sha256

    if pair.dataset == WORLD:
        return {"world_version": WORLD_VERSION, "world_seed": pair.world_seed}
    folder = Path(pair.dataset)
    split, corpus = folder / f"{parse_split(pair.split).name}.jsonl", folder / "corpus.jsonl"
    stamp: dict[str, Any] = {"split_sha256": file_sha256(split) if split.is_file() else None}
    if corpus.is_file():
        info = corpus.stat()
        stamp["corpus"] = [info.st_size, info.st_mtime_ns]
    return stamp


RECORDS_DIGEST = "records_sha256"
"""The field of a finished pair's record holding the digest of its episodes, in order
(:func:`~searchgym.data.digests.chain_digest` of the pair file's lines under the pair's identity)."""

CARD = "card"
"""The field of a finished pair's record holding the result card it was played under
(:mod:`searchgym.result_card`): what the report pairs agents on, the one recorded with the pair when it was played."""


def _cached_records(
    path: Path, record_path: Path, identity: dict[str, Any], expected: int | None
) -> tuple[list[dict[str, Any]] | None, str]:
    """A finished pair's episodes when its record vouches for them — the same identity, the digest of exactly
    these lines in this order, the expected count, well-typed records — else ``None`` and why not."""
    from searchgym.agents.evaluate import check_record
    from searchgym.data.digests import chain_digest
    from searchgym.data.jsonl import parse_json, read_lines
    from searchgym.errors import DataFormatError

    saved = _read_record(record_path)
    if (
        not isinstance(saved, dict)
        or {k: v for k, v in saved.items() if k not in (RECORDS_DIGEST, CARD)} != identity
    ):
        return None, "was played with other settings or data"
    try:
        lines = [line for _, line in read_lines(path)]
        if chain_digest(identity, lines) != saved.get(RECORDS_DIGEST):
            return None, "does not match the digest written with it (edited, reordered or damaged)"
        records = [parse_json(line, path, n) for n, line in enumerate(lines, start=1)]
        for record in records:
            check_record(record)
    except (DataFormatError, ValueError) as e:
        return None, f"holds a bad episode record ({str(e)[:200]})"
    if expected is not None and len(records) != expected:
        return None, f"holds {len(records)} episodes, not {expected}"
    return records, ""


def _read_record(path: Path) -> Any:
    """A pair's record, or ``None`` when it is missing or unreadable (a run killed while writing it)."""
    from searchgym.data.jsonl import read_json
    from searchgym.errors import DataFormatError

    try:
        return read_json(path)
    except DataFormatError:
        return None


def _write_record(path: Path, identity: dict[str, Any]) -> None:
    from searchgym.data.jsonl import replace_on_success

    with replace_on_success(path) as partial:
        partial.write_text(json.dumps(identity, indent=2) + "\n", encoding="utf-8")


WORLD = "world"
"""The ``--datasets`` name of the generated world."""


def _split_questions(folder: Path, split: str, world_seed: int = 0) -> int | None:
    """The questions of a FlashRAG split file, or of its slice, or of the generated world's split (``None``
    for a dataset stored otherwise)."""
    from searchgym.data import load_dataset, parse_split
    from searchgym.data.jsonl import iter_jsonl

    if str(folder) == WORLD:
        return len(load_dataset(WORLD, world_seed=world_seed).questions(split))

    selection = parse_split(split)
    path = folder / f"{selection.name}.jsonl"
    return len(selection.indices(sum(1 for _ in iter_jsonl(path)))) if path.is_file() else None


def run(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from searchgym.app.benchmark import build_report, markdown_report, plot_report, resolve_dataset
    from searchgym.app.cli._agent_options import agent_labels
    from searchgym.errors import ConfigError, MissingDependencyError

    if len(set(args.agent)) != len(args.agent):
        raise ConfigError(f"--agent: each agent once (got {args.agent})")
    # A shell glob over a data folder (`--datasets data/*`) also names its files (a README): those are noted
    # and left out, since a dataset is a folder.
    skipped = [spec for spec in args.datasets if Path(spec).is_file()]
    for spec in skipped:
        print(f"note: --datasets {spec} is a file, not a FlashRAG folder; left out", file=sys.stderr)
    paths = [
        Path(WORLD) if spec == WORLD else resolve_dataset(spec, args.data_root)
        for spec in args.datasets
        if spec not in skipped
    ]
    kinds: list[str] = []
    if args.ablate is not None:
        from searchgym.retrieval.ablation import parse_ablations

        kinds = parse_ablations(args.ablate)
    if args.answerable_only and not args.audit:
        args.audit = True  # the answerable questions are the audit's
    if not paths:
        raise ConfigError("--datasets names no folder")
    names = [p.name for p in paths]
    if len(set(names)) != len(names):
        raise ConfigError(f"--datasets: two folders share a name ({', '.join(str(p) for p in paths)})")
    retrievers = _retrievers(args.retriever, names, paths)
    _check_cassettes(retrievers, len(args.agent))
    groups = _groups(args.group, names)
    out = Path(args.out) if args.out is not None else None
    if out is None:
        import tempfile

        scratch = tempfile.TemporaryDirectory(prefix="searchgym-benchmark-")
        pairs_root = Path(scratch.name)
    else:
        pairs_root = out / PAIRS_FOLDER
    episodes: dict[str, dict[str, list[dict[str, Any]]]] = {a: {} for a in args.agent}
    played: dict[str, dict[str, Any]] = {}  # each agent's episode sizes
    cards: dict[str, dict[str, dict[str, Any]]] = {a: {} for a in args.agent}
    for path in paths:
        if str(path) != WORLD and not (path / "corpus.jsonl").is_file():
            raise ConfigError(
                f"--datasets {path}: no corpus.jsonl there; a dataset is a FlashRAG folder with its corpus"
            )
    in_split = {
        name: _split_questions(path, args.split, args.world_seed)
        for name, path in zip(names, paths, strict=True)
    }
    known = [n or 0 for n in in_split.values()]  # the progress bar: a dataset stored otherwise counts 0
    total = sum(n if args.episodes is None else min(n, args.episodes) for n in known)
    ablated: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {a: {} for a in args.agent}
    bar = tqdm(
        total=total * len(args.agent) * args.samples * (1 + len(kinds)),
        desc="benchmark",
        unit="ep",
        disable=args.no_progress,
    )
    with bar:
        for agent in args.agent:
            for name, path in zip(names, paths, strict=True):
                bar.set_postfix_str(f"{agent} on {name}", refresh=True)
                pair = _pair_args(args, agent, path, retrievers[name])
                target = pairs_root / _slug(agent) / f"{name}.jsonl"
                episodes[agent][name], played[agent], how, cards[agent][name] = _play_pair(
                    pair, target, args.episodes, in_split[name], bar
                )
                # One line per pair: whether its episodes were read back from the cache or played now.
                bar.write(
                    f"pair {agent} on {name}: {how} ({len(episodes[agent][name])} episodes)", file=sys.stderr
                )
                for kind in kinds:
                    from searchgym.retrieval.ablation import ablation_spec

                    bar.set_postfix_str(f"{agent} on {name}, {kind} retriever", refresh=True)
                    pair = _pair_args(args, agent, path, ablation_spec(kind, retrievers[name]))
                    target = pairs_root / _slug(agent) / f"{name}.ablate-{kind}.jsonl"
                    records, _, how, _ = _play_pair(pair, target, args.episodes, in_split[name], bar)
                    ablated[agent].setdefault(name, {})[kind] = records
                    bar.write(
                        f"pair {agent} on {name}, {kind} retriever: {how} ({len(records)} episodes)",
                        file=sys.stderr,
                    )
    datasets = [
        {
            "name": n,
            "path": str(p),
            "group": groups[n],
            "retriever": retrievers[n],
            "questions": len(episodes[args.agent[0]][n]) // args.samples,
        }
        for n, p in zip(names, paths, strict=True)
    ]
    settings = {
        "agents": list(args.agent),
        "env": args.env,
        "split": args.split,
        "tokenizer": args.tokenizer,
        "topk": args.topk,
        "max_turns": args.max_turns,
        "max_turn_tokens": args.max_turn_tokens,
        "max_context_tokens": args.max_context_tokens,
        "episodes": args.episodes,
        "seed": args.seed,
        "temperature": args.temperature,
        "samples": args.samples,
        "world_seed": args.world_seed,
        "ablate": kinds,
        "audit": bool(args.audit),
        "answerable_only": bool(args.answerable_only),
        # What each agent played with: a checkpoint: agent's training sizes where the command gave none.
        "agent_env": played,
    }
    labels = agent_labels(list(args.agent))  # the tables name agents, not specs (settings keep those)
    audits = _audits(args, names, paths, retrievers, datasets) if args.audit else {}
    from searchgym.audit import audit_shares
    from searchgym.result_card import with_audit

    for agent in args.agent:  # every card says whether its questions were audited, and what was found
        for name in names:
            shares = audit_shares(audits[name]) if args.audit else None
            cards[agent][name] = with_audit(cards[agent][name], shares)
    report = build_report(
        {labels[a]: v for a, v in episodes.items()},
        datasets,
        settings=settings,
        samples=args.samples,
        temperature=args.temperature,
        cards={labels[a]: v for a, v in cards.items()},
        ablations={labels[a]: v for a, v in ablated.items()} if kinds else None,
    )
    if args.answerable_only:
        report["answerable"] = _answerable_report(episodes, labels, datasets, audits, args)
    table = markdown_report(report)
    if out is not None:
        from searchgym.data.jsonl import replace_on_success

        with replace_on_success(out / "benchmark.json") as partial:
            partial.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        with replace_on_success(out / "benchmark.md") as partial:
            partial.write_text(table, encoding="utf-8")
        wrote = [out / "benchmark.md", out / "benchmark.json"]
        try:
            with replace_on_success(out / "benchmark.png") as partial:
                plot_report(report, partial)
            wrote.append(out / "benchmark.png")
        except MissingDependencyError as e:
            print(f"note: no plot ({e})", file=sys.stderr)
        print("wrote " + ", ".join(str(p) for p in wrote), file=sys.stderr)
    else:
        scratch.cleanup()
    if args.json:
        print(json.dumps(report))
    else:
        sys.stdout.write(table)
    return 0


def _audits(
    args: argparse.Namespace,
    names: list[str],
    paths: list[Path],
    retrievers: dict[str, str],
    datasets: list[dict[str, Any]],
) -> dict[str, list[dict[str, Any]]]:
    """Each dataset's audit records (:func:`searchgym.audit.audit_questions`) of the questions played, with
    its retriever at the run's top-k."""
    from searchgym.app.cli.eval import env_defaults
    from searchgym.audit import audit_questions
    from searchgym.data import load_dataset
    from searchgym.retrieval import make_retriever

    topk = args.topk if args.topk is not None else env_defaults().topk
    audits = {}
    for name, path, spec in zip(names, paths, datasets, strict=True):
        dataset = load_dataset(str(path), world_seed=args.world_seed)
        questions = dataset.questions(args.split)[: spec["questions"]]
        retriever = make_retriever(retrievers[name], dataset.passages)
        try:
            audits[name] = audit_questions(dataset, questions, retriever, topk)
        finally:
            retriever.close()
    return audits


def _answerable_report(
    episodes: dict[str, dict[str, list[dict[str, Any]]]],
    labels: dict[str, str],
    datasets: list[dict[str, Any]],
    audits: dict[str, list[dict[str, Any]]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The report's figures on the answerable questions only (datasets with none are left out)."""
    from searchgym.app.benchmark import build_report

    kept = []
    for spec in datasets:
        answerable = {r["question_id"] for r in audits[spec["name"]] if r["answerable"]}
        if answerable:
            kept.append((spec, answerable))
    part = build_report(
        {
            labels[a]: {
                spec["name"]: [r for r in by[spec["name"]] if r.get("question_id") in answerable]
                for spec, answerable in kept
            }
            for a, by in episodes.items()
        },
        [{**spec, "questions": len(answerable)} for spec, answerable in kept],
        samples=args.samples,
        temperature=args.temperature,
    )
    return {k: part[k] for k in ("datasets", "results", "averages", "paired")}
