"""``searchgym view``: one self-contained HTML page to browse the episodes of eval or export-trajectories files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchgym.app.cli._common import positive_int

if TYPE_CHECKING:
    from searchgym.app.view.page import Episode
    from searchgym.tokenization import Tokenizer

COMMAND = ("view",)
HELP = (
    "write one HTML page (no server, no network) to browse the episodes of eval --out or "
    "export-trajectories files: filters, turns, queries, passages, gold marks, per-token log-probs"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="eval --out or export-trajectories JSONL files (a benchmark's pairs/AGENT/DATASET.jsonl too); each "
        "is a value of the page's dataset filter (its name) unless its records carry a 'dataset' field, and "
        "its agent is read from its manifest or benchmark pair record",
    )
    parser.add_argument(
        "--out",
        default=None,
        metavar="PAGE",
        help="the page to write (default: FILE.html beside the first file FILE.jsonl)",
    )
    parser.add_argument(
        "--near-miss",
        action="store_true",
        help="show only exact match's near misses: wrong answers that contain a golden answer or reach F1 "
        ">= 0.8 against one, each with the gold beside it",
    )
    parser.add_argument(
        "--dataset",
        default=None,
        help="the episodes' dataset: a FlashRAG folder (corpus.jsonl and its splits) or 'world': passages "
        "shown whole by their ids and gold passages marked (default: passages as the transcript shows them, "
        "gold ones from the records' own supporting ids)",
    )
    parser.add_argument(
        "--world-seed", type=int, default=0, help="seed of the generated world (--dataset world)"
    )
    parser.add_argument(
        "--checkpoint",
        default=None,
        metavar="CKPT",
        help="colour every policy token by its log-probability under this checkpoint.pt or Hugging Face folder",
    )
    parser.add_argument(
        "--against",
        default=None,
        metavar="CKPT2",
        help="with --checkpoint: colour by log p(CKPT) - log p(CKPT2) instead (where likelihood moved)",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer of the files' token ids and of the scoring (default: the checkpoint's; without one, "
        "the tokenizer the file's manifest names, else the built-in one)",
    )
    parser.add_argument("--device", default="cpu", help="torch device of the scoring model")
    parser.add_argument("--batch-size", type=positive_int, default=8, help="transcripts scored together")
    parser.add_argument("--title", default=None, help="the page's title (default: the files' names)")


def default_out(first: str) -> Path:
    """The page beside the records it shows: ``FILE.html`` next to ``first`` (``runs/e.jsonl`` ->
    ``runs/e.html``; never ``first`` itself: ``runs/e.html`` -> ``runs/e.html.html``)."""
    path = Path(first)
    out = path.with_suffix(".html")
    return out if out.resolve() != path.resolve() else path.with_name(path.name + ".html")


def file_agent(path: Path) -> tuple[str, str | None]:
    """The agent that played the episodes of ``path`` and their dataset's name, where a record beside it
    says: a benchmark pair's ``FILE.run.json`` (the agent; the dataset is the file's stem) or an
    ``eval --out`` manifest (the agent and the dataset it names: ``world`` or the folder's name). ``""`` for
    an agent and ``None`` for a dataset that no record names."""
    from searchgym.manifest import manifest_path, read_manifest

    pair = read_manifest(path.with_name(path.name + ".run.json")) or {}
    if isinstance(pair.get("agent"), str):
        return pair["agent"], path.stem
    manifest = read_manifest(manifest_path(path, folder=False)) or {}
    config, data = manifest.get("config"), manifest.get("data")
    agent = config.get("agent") if isinstance(config, dict) else None
    dataset = data.get("dataset") if isinstance(data, dict) else None
    return (
        agent if isinstance(agent, str) else "",
        Path(dataset).name if isinstance(dataset, str) and dataset else None,
    )


def manifest_tokenizer(path: Path) -> str | None:
    """The tokenizer the manifest beside ``path`` names (``None``: no manifest, or the built-in one)."""
    from searchgym.manifest import manifest_path, read_manifest

    manifest = read_manifest(manifest_path(path, folder=False)) or {}
    section = manifest.get("tokenizer")
    name = section.get("name") if isinstance(section, dict) else None
    return name if isinstance(name, str) and name != "builtin" else None


def run(args: argparse.Namespace) -> int:
    from searchgym.app.view.html import render_page
    from searchgym.app.view.page import page_episodes, read_episodes
    from searchgym.data.jsonl import replace_on_success
    from searchgym.errors import ConfigError

    if args.against is not None and args.checkpoint is None:
        raise ConfigError("--against compares with --checkpoint: give --checkpoint too")
    out = Path(args.out) if args.out is not None else default_out(args.files[0])
    if any(out.resolve() == Path(f).resolve() for f in args.files):
        raise ConfigError(f"--out {out} is one of the input files; choose another page name")

    policies: list[Any] = []
    if args.checkpoint is not None:
        policies = load_policies(args)
    tokenizers: dict[Path, Tokenizer] = {}

    def tokenizer_for(path: Path) -> Tokenizer:
        from searchgym.tokenization import load_tokenizer

        if path not in tokenizers:
            tokenizers[path] = (
                policies[0].tokenizer
                if policies
                else load_tokenizer(args.tokenizer or manifest_tokenizer(path))
            )
        return tokenizers[path]

    from searchgym.app.cli._agent_options import agent_labels
    from searchgym.app.view.page import file_labels

    found = [file_agent(Path(f)) for f in args.files]
    names_of = agent_labels(list(dict.fromkeys(a for a, _ in found if a)))  # benchmark's names for them
    found = [(names_of.get(a, a), d) for a, d in found]
    labels = [dataset or label for (_, dataset), label in zip(found, file_labels(args.files), strict=True)]
    episodes = read_episodes(args.files, tokenizer_for, agents=[a for a, _ in found], labels=labels)
    if args.near_miss:
        from searchgym.app.view.page import episode_near_miss

        episodes = [e for e in episodes if episode_near_miss(e.fields)]
        print(f"{len(episodes)} near misses", file=sys.stderr)
    tokens, colour = None, None
    if policies:
        tokens, colour = checkpoint_tokens(episodes, policies, args)
    elif any(s.logprobs is not None for e in episodes for s in e.segments):
        tokens = rollout_tokens(episodes, tokenizers)
        colour = {"mode": "logp", "label": "the rollout's, from the file"}
    dataset = None
    if args.dataset is not None:
        from searchgym.data import load_dataset

        dataset = load_dataset(args.dataset, world_seed=args.world_seed)

    def warn(line: str) -> None:
        print(f"warning: {line}", file=sys.stderr)

    page = page_episodes(episodes, dataset=dataset, tokens=tokens, warn=warn)
    names = [Path(f).name for f in args.files]
    meta = {"title": args.title, "files": names, "colour": colour}
    with replace_on_success(out) as partial:
        partial.write_text(render_page(page, meta), encoding="utf-8")
    print(out)
    return 0


def load_policies(args: argparse.Namespace) -> list[Any]:
    """The ``--checkpoint`` policy, and the ``--against`` one (which must share its tokenizer)."""
    from searchgym.agents.training.export import load_policy
    from searchgym.errors import ConfigError

    policies = [load_policy(args.checkpoint, tokenizer=args.tokenizer, device=args.device)]
    if args.against is not None:
        policies.append(load_policy(args.against, tokenizer=args.tokenizer, device=args.device))
        if policies[1].tokenizer.token_bytes != policies[0].tokenizer.token_bytes:
            raise ConfigError(
                f"--against {args.against} has another tokenizer ({policies[1].tokenizer.name!r}) than "
                f"--checkpoint {args.checkpoint} ({policies[0].tokenizer.name!r}): their log-probs are of "
                "different tokens; pass --tokenizer to score both with one"
            )
    return policies


def checkpoint_tokens(
    episodes: list[Episode], policies: list[Any], args: argparse.Namespace
) -> tuple[list[Any], dict[str, Any]]:
    """Every episode's policy tokens with their log-probs under each policy, and the page's colour legend."""
    from searchgym.agents.llm.colouring import sequence_logprobs
    from searchgym.app.view.tokens import policy_token_values, segment_ids

    tokenizer = policies[0].tokenizer
    segments = [segment_ids(e, tokenizer) for e in episodes]
    sequences = [[i for _, ids in s for i in ids] for s in segments]
    masks = [[source == "policy" for source, ids in s for _ in ids] for s in segments]
    rows = [sequence_logprobs(p, sequences, masks, batch_size=args.batch_size) for p in policies]
    tokens = [policy_token_values(tokenizer, s, *(row[i] for row in rows)) for i, s in enumerate(segments)]
    colour = {"mode": "delta" if len(policies) > 1 else "logp", "label": str(args.checkpoint)}
    if len(policies) > 1:
        colour["against_label"] = str(args.against)
    return tokens, colour


def rollout_tokens(episodes: list[Episode], tokenizers: dict[Path, Tokenizer]) -> list[Any]:
    """The rollout log-probs export-trajectories rows carry, per policy token (``None`` for other records)."""
    from searchgym.app.view.tokens import policy_token_values

    tokens: list[Any] = []
    for e in episodes:
        if not any(s.logprobs is not None for s in e.segments):
            tokens.append(None)
            continue
        segments = [(s.source, list(s.ids or ())) for s in e.segments]
        row = [v for s in e.segments for v in (s.logprobs or [0.0] * len(s.ids or ()))]
        tokens.append(policy_token_values(tokenizers[Path(e.path)], segments, row))
    return tokens
