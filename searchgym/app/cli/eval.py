"""``searchgym eval``: evaluate an agent on an environment and print EM, F1, searches and more."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from searchgym.agents.evaluate import EvalSummary
from searchgym.app.cli._agent_options import (
    add_sampling_arguments,
    add_served_arguments,
    agent_label,
    build_agent,
    close_players,
    served_players,
)
from searchgym.app.cli._common import (
    AGENT_FORMS,
    add_env_arguments,
    env_kwargs,
    format_table,
    make_env,
    positive_int,
    repeats_note,
    run_env_defaults,
)

COMMAND = ("eval",)
HELP = (
    "evaluate an agent (random, oracle, heuristic, checkpoint:PATH, sb3:PATH, openai:MODEL, package.module:Class) "
    "on an env"
)

COLUMNS = [
    "agent",
    "decoding",
    *(m for m in EvalSummary.metric_names() if m not in ("successes", "failures")),
    "questions",
]
"""The table's columns: every figure but the per-question and per-stage counts (in ``--json``; the stages
get a table of their own)."""


TRAINED_SIZES = ("max_turn_tokens", "max_context_tokens")
"""The options a ``checkpoint:PATH`` agent's own training values fill when not given."""


def env_defaults() -> Any:
    """The environment ``eval`` plays unless told otherwise: the test split, a patient retriever."""
    return run_env_defaults(split="test")


def trained_env_spec(agent: str) -> Any:
    """The :class:`~searchgym.envs.EnvSpec` a ``checkpoint:PATH`` agent was trained with: its checkpoint's
    stored spec, or the one an exported folder's note records
    (:func:`~searchgym.agents.training.export.checkpoint_env_spec`; the weights stay unread, ``load_agent``
    loads and checks them once); ``None`` for another agent, or where none is recorded.
    """
    if not agent.startswith("checkpoint:"):
        return None
    path = agent[len("checkpoint:") :]
    if not os.path.exists(path):
        return None  # a missing file errors in load_agent
    from searchgym.agents.training.export import checkpoint_env_spec

    return checkpoint_env_spec(path)


def with_trained_sizes(defaults: Any, trained: Any) -> Any:
    """``defaults`` (an ``EnvSpec``) with the :data:`TRAINED_SIZES` of ``trained``, the spec a model was
    trained with (``None``: ``defaults`` as they are).

    A model trained on 48-token turns plays an env with 512-token turns very slowly (an untrained or drifted
    policy fills every turn) and out of distribution, so the trainer's own sizes are the natural default; the
    options given still win (:func:`~searchgym.app.cli._common.env_spec_from_args`).
    """
    if trained is None:
        return defaults
    return defaults.replace(**{n: getattr(trained, n) for n in TRAINED_SIZES})


DEFAULT_ENV = "SearchQA-v0"
"""The env ``eval`` plays without ``--env``, unless an ``sb3:PATH`` model's run records its own."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_env_arguments(parser, env_defaults(), unset=TRAINED_SIZES)
    # Not given: DEFAULT_ENV, or the env an sb3: model's run records (recorded_env_defaults).
    parser.set_defaults(env=None)
    for action in parser._actions:
        if action.dest == "env":
            action.help = (
                f"environment id (default: {DEFAULT_ENV}, or the one an sb3:PATH model's run records)"
            )
    parser.add_argument("--agent", required=True, help=AGENT_FORMS)
    parser.add_argument(
        "--episodes",
        type=positive_int,
        default=100,
        help="episodes; episode i plays question i of the split (more episodes than questions play each "
        "question again, with another seed, and the note and the 'questions' column say so)",
    )
    parser.add_argument("--seed", type=int, default=0, help="base seed")
    add_sampling_arguments(parser)
    add_served_arguments(parser)
    parser.add_argument(
        "--out",
        default=None,
        help="write transcripts to this JSONL file (through OUT.partial, renamed when the run completes: "
        "a failed run leaves OUT as it was, and the same command run again continues it)",
    )
    again = parser.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="insist on continuing an interrupted run: refused when OUT.partial holds no finished episodes of "
        "this same eval (without it, a matching OUT.partial is continued anyway, as benchmark does, and any "
        "other is replaced with a note)",
    )
    again.add_argument(
        "--restart",
        action="store_true",
        help="discard the finished episodes an interrupted run left in OUT.partial and play every episode",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--record-retrieval",
        default=None,
        metavar="PATH",
        help="record every search and its results to this cassette (replay it with --retriever cassette:PATH)",
    )


def recorded_env_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """Sets ``args.env`` when not given: for an ``sb3:PATH`` agent, the env id its run's ``config.json``
    records (a registered searchgym id only: :func:`~searchgym.agents.sb3.recorded_env`), else
    :data:`DEFAULT_ENV`; returns the turn and context sizes that run trained with, for those not given.

    A given ``--env`` wins; one that differs from the recorded id is played with a note (the model's spaces
    are then checked against it), and the run config is not needed.

    Raises:
        ConfigError: without ``--env``, the run config is unreadable or names an env id or arguments that are
            refused.
    """
    given = args.env
    if given is None:
        args.env = DEFAULT_ENV
    if not args.agent.startswith("sb3:"):
        return {}
    from searchgym.agents.sb3 import recorded_env
    from searchgym.errors import ConfigError

    try:
        recorded = recorded_env(args.agent[len("sb3:") :])
    except ConfigError:
        if given is None:
            raise
        return {}  # --env says which env: the run config is not read for it
    if recorded is None:
        return {}
    env_id, kwargs, config = recorded
    if given is not None and given != env_id:
        print(
            f"note: --env {given} differs from {env_id}, the env {config} records for this model; playing {given}",
            file=sys.stderr,
        )
        return {}
    args.env = env_id
    return {n: kwargs[n] for n in TRAINED_SIZES if getattr(args, n, None) is None and n in kwargs}


RUN_RECORD_SUFFIX = ".partial.run.json"
"""Beside ``OUT.partial`` while a run writes it: what the run is (agent, env options, seed), for ``--resume``."""


def run_identity(args: argparse.Namespace, settings: dict[str, Any]) -> dict[str, Any]:
    """What must match for ``--resume`` (or a benchmark's cached pair) to be reused: the agent and what
    identifies its code or weights (:func:`~searchgym.app.cli._agent_options.agent_sha256`), the env id and
    options (the retriever's patience aside: it changes how long a run waits, not what it plays), the
    sampling settings and the seed."""
    from searchgym.app.cli._agent_options import agent_sha256, sampling_settings, served_identity

    env = {k: v for k, v in settings.items() if k != "retriever_patience"}
    identity = {
        "agent": args.agent,
        "agent_sha256": agent_sha256(args.agent),
        "env": args.env,
        "env_options": env,
        "seed": args.seed,
    }
    served = served_identity(args)
    if served is not None:
        identity["served"] = served
    sampling = sampling_settings(args)
    if sampling["samples"] != 1 or sampling["temperature"] != 0.0:  # a greedy single-sample run records none
        identity["sampling"] = sampling
    return identity


def held_episodes(
    partial: Path, record_path: Path, identity: dict[str, Any], episodes: int
) -> tuple[list[Any], int]:
    """The finished episodes an interrupted run left in ``partial`` and the bytes they take (a last line
    without its newline, the episode being written when the run stopped, is left out). Only the first lines
    that match the digests written with them are kept (:class:`~searchgym.data.digests.RecordDigests`):
    from the first edited, reordered or undigested line on, episodes are played again, with a note.

    Raises:
        ConfigError: nothing to resume, another command wrote it (the differing fields named), or it holds
            more episodes than asked for.
        DataFormatError: the run record is damaged, or a kept line is not an episode record (its field
            named).
    """
    from searchgym.agents.evaluate import EpisodeRecord
    from searchgym.data.digests import RecordDigests
    from searchgym.data.jsonl import parse_json, read_json, read_lines
    from searchgym.errors import ConfigError, DataFormatError

    if not record_path.is_file():
        raise ConfigError(
            f"--resume: no interrupted eval to continue ({record_path} is missing; it is written when an eval "
            "--out run starts); run without --resume"
        )
    saved = read_json(record_path)
    if not isinstance(saved, dict):
        raise DataFormatError(str(record_path), None, f"a {type(saved).__name__}, not a run record")
    differ = sorted(k for k in set(saved) | set(identity) if saved.get(k) != identity.get(k))
    if differ:
        listed = "; ".join(f"{k}: was {saved.get(k)!r:.200}, now {identity.get(k)!r}" for k in differ)
        raise ConfigError(
            f"--resume: {partial} was written by another eval ({listed}); run it as it was, or without --resume"
        )
    # Only the lines that match the digests written with them are kept: an edited, reordered or foreign
    # episode is played again rather than entered into the figures.
    count, size = RecordDigests(partial, identity).verified()
    complete = sum(1 for _, line in read_lines(partial) if line.endswith(b"\n"))
    if count < complete:
        print(
            f"note: {partial}: {complete - count} finished episode(s) from episode {count + 1} on do not match "
            "the digests written with them (edited or reordered, or the run stopped between writing one and its "
            "digest): playing them again",
            file=sys.stderr,
        )
    held = []
    for n, line in read_lines(partial):
        if n > count:
            break
        try:
            held.append(EpisodeRecord.from_json(parse_json(line, partial, n)))
        except ValueError as e:  # DataFormatError included
            reason = str(e).removeprefix(f"{partial}:{n}: ")
            raise DataFormatError(str(partial), n, f"not an episode record ({reason})") from None
    if len(held) > episodes:
        raise ConfigError(f"--resume: {partial} holds {len(held)} episodes, more than --episodes {episodes}")
    return held, size


def continued_episodes(
    args: argparse.Namespace, partial: Path, record_path: Path, identity: dict[str, Any]
) -> tuple[list[Any], bool]:
    """What an ``--out`` run keeps of ``OUT.partial`` (read under its lock): the finished episodes of an
    interrupted run of this same eval, which it continues — by default, as ``benchmark`` does — and whether it
    continues one. Leftovers of another eval, or damaged ones, are replaced with a note (refused with
    ``--resume``); ``--restart`` replaces them with a note of what it discards.

    Raises:
        ConfigError, DataFormatError: ``--resume`` and nothing of this eval to continue (as
            :func:`held_episodes`).
    """
    from searchgym.errors import ConfigError, DataFormatError

    if args.restart or not (args.resume or partial.stat().st_size > 0):
        if args.restart and partial.stat().st_size > 0:
            print(f"note: --restart: {partial}'s finished episodes are discarded", file=sys.stderr)
        os.truncate(partial, 0)
        return [], False
    try:
        held, size = held_episodes(partial, record_path, identity, args.episodes * args.samples)
    except (ConfigError, DataFormatError) as e:
        if args.resume:
            raise
        reason = str(e).removeprefix("--resume: ").split(";")[0]
        print(
            f"note: {partial} is not this eval's to continue ({reason}); playing every episode",
            file=sys.stderr,
        )
        os.truncate(partial, 0)
        return [], False
    os.truncate(partial, size)
    how = "" if args.resume else " (the same command was interrupted; --restart plays every episode again)"
    print(
        f"resuming {args.out}: {len(held)} of {args.episodes * args.samples} episodes done{how}",
        file=sys.stderr,
    )
    return held, True


def run(args: argparse.Namespace) -> int:
    from searchgym.agents import evaluate
    from searchgym.app.cli._manifest import warn_on_data_mismatch, write_run_manifest
    from searchgym.data.digests import RecordDigests
    from searchgym.data.jsonl import replace_on_success
    from searchgym.errors import ConfigError

    if (args.resume or args.restart) and args.out is None:
        flag = "--resume" if args.resume else "--restart"
        raise ConfigError(f"{flag} applies to an interrupted --out run: give its --out")
    if args.resume and args.record_retrieval is not None:
        raise ConfigError(
            "--resume cannot be combined with --record-retrieval (the cassette would miss the searches already made)"
        )

    defaults = with_trained_sizes(env_defaults(), trained_env_spec(args.agent))
    overrides: dict[str, Any] = recorded_env_defaults(args)
    settings = {**env_kwargs(args, defaults), **overrides}
    warn_on_data_mismatch(args.agent, settings)
    if args.record_retrieval is not None:  # the cassette is written when the env releases it (env.close())
        overrides["retriever"] = f"cassette:{args.record_retrieval};record={args.retriever}"
    env = make_env(args, defaults, **overrides)
    agent = build_agent(args, env)
    if (
        args.record_retrieval is not None
        and getattr(args, "concurrency", 1) > 1
        and args.agent.startswith("openai:")
    ):
        print("note: --record-retrieval: episodes are played one at a time (one cassette)", file=sys.stderr)
        args.concurrency = 1
    players = served_players(args, lambda: make_env(args, defaults, **overrides))
    questions = min(args.episodes, len(env.unwrapped.questions))  # distinct questions played
    note = repeats_note(
        args.episodes, len(env.unwrapped.questions), args.split, "the figures average over episodes"
    )
    if note is not None:
        print(note, file=sys.stderr)
    if args.out is None:
        summary = evaluate(
            env, agent, args.episodes, seed=args.seed, progress=not args.no_progress, samples=args.samples,
            players=players,
        )  # fmt: skip
    else:
        # Episodes stream into OUT.partial (a crash keeps the finished ones there); OUT is replaced only
        # by a complete run, so a run that fails never destroys an earlier file.
        identity = run_identity(args, settings)
        record_path = Path(args.out + RUN_RECORD_SUFFIX)
        with replace_on_success(args.out, keep=True) as partial:  # continued_episodes decides what stays
            held, resumed = continued_episodes(args, partial, record_path, identity)
            if not resumed:
                record_path.write_text(json.dumps(identity, indent=2) + "\n", encoding="utf-8")
            digests = RecordDigests(partial, identity)  # one digest per episode written, for a later resume
            digests.restart()
            summary = evaluate(
                env,
                agent,
                args.episodes,
                seed=args.seed,
                out=partial,
                progress=not args.no_progress,
                held=held,
                on_line=digests.append,
                samples=args.samples,
                players=players,
            )
        record_path.unlink(missing_ok=True)
        digests.remove()
    env.close()
    close_players(players)
    label = agent_label(args.agent, agent)
    if callable(getattr(agent, "close", None)):
        agent.close()
    if args.out is not None:
        config = {k: v for k, v in vars(args).items() if not k.startswith("_")}
        from searchgym.result_card import result_card

        card = result_card(
            settings, env=args.env, temperature=args.temperature, samples=args.samples, seed=args.seed
        )
        write_run_manifest(
            args.out, "eval", settings, folder=False, seeds={"seed": args.seed}, config=config,
            extra={"card": card},
        )  # fmt: skip
    from searchgym.app.benchmark import decoding_label

    decoding = decoding_label(args.temperature, args.samples)
    metrics = {
        **summary.metrics(),
        "questions": questions,
        "temperature": args.temperature,
        "decoding": decoding,
    }
    if args.json:
        print(json.dumps(metrics))
    else:  # the faults column only when faults were injected
        columns = [c for c in COLUMNS if c != "retrieval_faults" or metrics.get(c) is not None]
        print(format_table([{"agent": label, **metrics}], columns))
        from searchgym.failures import FAILURE_COLUMNS, failure_rows

        print("\nwhy answers fail (episodes by the stage they failed at; see docs/benchmark.md):")
        print(format_table(failure_rows(summary.failures), FAILURE_COLUMNS))
    return 0
