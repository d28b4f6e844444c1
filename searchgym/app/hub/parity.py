"""Reward parity across doors: one fixed set of trajectories, played through every way into SearchQA.

A trajectory is what a model does in one episode: a question, a reset seed, and its turns — each a
``search``, an ``answer``, or a turn that calls no tool (a malformed tag). :func:`build_trajectories` makes
the set from the scripted agents (the oracle, the shortcut teacher, search-then-guess, answer-at-once), the
reward canaries (empty answer, no answer, a candidate list, the answer written in a query), malformed tags,
searches with an empty query (the TRL tool env refuses them; the other doors read them as turns that call no
tool), answers that differ from the golden one only in case and punctuation, and oracle runs under seeded retriever
faults. Each door plays every trajectory and reports its reward and how the episode ended:

* ``gym``: ``SearchQA-v0`` through :class:`~searchgym.envs.TurnLevelWrapper`, each turn rendered as
  Search-R1's tags and tokenised (a malformed turn ends with the end-of-sequence token);
* ``trl``: :class:`~searchgym.agents.integrations.trl_env.SearchQAToolEnv`, its tools called as TRL calls
  them (a refused or malformed call is shown to the model and spends nothing);
* ``openenv``: :class:`~searchgym.app.openenv.SearchQAEnvClient` against a live server (a malformed action is
  refused by the server);
* ``verifiers``: the ``verifiers`` environment's episode loop (:func:`~searchgym.app.hub.replies.play_conversation`),
  the turns sent as tool calls or as tagged text, alternately.

:func:`compare` lists every difference from the ``gym`` door — reward, end, or the passages a search returned —
naming the door, the trajectory and both values.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from searchgym.data import Question
from searchgym.envs.messages import SearchQAMessages, shared_parts
from searchgym.envs.spec import EnvSpec, make_spec
from searchgym.errors import EpisodeFinishedError, InvalidActionError
from searchgym.protocol import parse_action

__all__ = [
    "DOORS",
    "FAULTS",
    "Outcome",
    "Trajectory",
    "build_trajectories",
    "compare",
    "play_gym",
    "play_openenv",
    "play_trl",
    "play_verifiers",
]

Tool = Literal["search", "answer"] | None

DOORS = ("gym", "trl", "openenv", "verifiers")
"""The doors, in the order they are played; ``gym`` is the reference."""

FAULTS = "empty=0.3,replace=0.3,shuffle=0.3,truncate=0.2,seed=5"
"""The retriever faults of the trajectories of group ``"faults"`` (no latency: the set runs in seconds)."""


@dataclass(frozen=True)
class Trajectory:
    """One episode's moves.

    Attributes:
        name: Unique, e.g. ``"oracle/train-3"``.
        question_id: The question, in the spec's split.
        turns: ``(tool, text)`` per turn; ``tool`` ``None`` for a turn that calls no tool (``text`` is then
            what the model wrote: a malformed tag).
        seed: The reset seed (it seeds the retriever faults), or ``None``.
        group: ``"default"``, or ``"faults"`` for the spec with :data:`FAULTS`.
    """

    name: str
    question_id: str
    turns: tuple[tuple[Tool, str], ...]
    seed: int | None = None
    group: str = "default"


@dataclass(frozen=True)
class Outcome:
    """What a door made of a trajectory: the reward, why the episode ended (``None``: it did not), and the
    passage ids each executed search returned (where the retriever faults show)."""

    reward: float
    end: str | None
    hits: tuple[tuple[str, ...], ...] = ()


def _hits(ids: Sequence[Sequence[str]]) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(x) for x in ids)


def group_specs(spec: EnvSpec) -> dict[str, EnvSpec]:
    """The spec of each trajectory group: ``spec`` itself, and ``spec`` with :data:`FAULTS`."""
    return {"default": spec, "faults": spec.replace(retriever_faults=FAULTS)}


def canaries() -> dict[str, Any]:
    """The reward canaries shipped with the package (``searchgym/assets/openenv_canaries.json``, the
    manifest's ``capabilities.canaries``): each has a ``name`` and ``turns`` of ``[tool, text]`` with
    placeholders ``{question}``, ``{golden}`` and ``{candidates}``."""
    path = Path(__file__).resolve().parents[2] / "assets" / "openenv_canaries.json"
    return dict(json.loads(path.read_text()))


def _tagged(turns: Sequence[str]) -> tuple[tuple[Tool, str], ...]:
    out: list[tuple[Tool, str]] = []
    for text in turns:
        parsed = parse_action(text)
        tool: Tool = "search" if parsed.kind == "search" else "answer" if parsed.kind == "answer" else None
        out.append((tool, parsed.content if tool is not None else text))
    return tuple(out)


def build_trajectories(spec: EnvSpec | None = None, *, per_kind: int = 5, **fields: Any) -> list[Trajectory]:
    """The fixed set of trajectories on the questions of ``spec``'s split (default: the generated world's
    ``train``). ``per_kind`` questions per kind (twice that for the oracle); at least 50 trajectories for
    ``per_kind`` 5 on a split with bridge questions.

    Raises:
        ConfigError: a bad spec.
    """
    from searchgym.agents.scripted import oracle_turns, shortcut_turns

    spec = make_spec(spec, fields)
    data, retriever = shared_parts(spec)
    questions = [q for q in data.questions(spec.split) if q.golden_answers]
    supported = [q for q in questions if q.supporting_ids] or questions
    out: list[Trajectory] = []

    def add(kind: str, question: Question, turns: Sequence[tuple[Tool, str]], **kw: Any) -> None:
        out.append(Trajectory(f"{kind}/{question.id}", question.id, tuple(turns), **kw))

    def oracle(question: Question) -> tuple[tuple[Tool, str], ...]:
        return _tagged(oracle_turns(data, question.id, spec.split, spec.max_turns, retriever, spec.topk))

    for q in supported[: 2 * per_kind]:
        add("oracle", q, oracle(q))
    bridges = 0
    for q in supported:
        shortcut = shortcut_turns(data, q.id, spec.split, retriever, spec.topk)
        if shortcut is not None and bridges < per_kind:
            add("shortcut", q, _tagged(shortcut))
            bridges += 1
    for n, q in enumerate(questions[:per_kind]):
        golden = q.golden_answers[0]
        hits = retriever.search([q.question], spec.topk)[0]
        guess = data.passage_index[hits[0].passage_id].title if hits else "unknown"
        add("search-then-guess", q, [("search", q.question), ("answer", guess)])
        add("answer-at-once", q, [("answer", golden)])
        # The reward canaries (the manifest's): each must score the floor under exact match.
        titles = [data.passage_index[h.passage_id].title for h in hits]
        values = {
            "question": q.question,
            "golden": golden,
            "candidates": ", ".join([*titles[:2], golden, *titles[2:], "none of these"]),
        }
        for canary in canaries()["canaries"]:
            turns = [(tool, text.format(**values)) for tool, text in canary["turns"]]
            if canary.get("repeat_to_budget"):
                turns = (turns * spec.max_turns)[: spec.max_turns]
            add(f"canary/{canary['name']}", q, turns)
        add(
            "malformed-tag",
            q,
            [(None, f"<search> {q.question} </serch>"), ("search", q.question), ("answer", golden)],
        )
        add("empty-search", q, [("search", " " * (n % 2)), ("search", q.question), ("answer", golden)])
    for q in questions[per_kind : per_kind + 3]:
        add("normalised-answer", q, [("answer", f"The {q.golden_answers[0].upper()}.")])
    for i, q in enumerate(supported[:per_kind]):
        add("oracle-under-faults", q, oracle(q), seed=100 + i, group="faults")
    return out


# -- doors ---------------------------------------------------------------------------------------------------


def _render(tool: Tool, text: str) -> str:
    if tool is None:
        return text
    return f"<{tool}> {text} </{tool}>"


def play_gym(spec: EnvSpec, trajectories: Sequence[Trajectory]) -> dict[str, Outcome]:
    """Plays each trajectory on ``SearchQA-v0`` (``spec``, and :data:`FAULTS` for the ``faults`` group)."""
    from searchgym.envs import SearchQAEnv, TurnLevelWrapper

    out: dict[str, Outcome] = {}
    specs = group_specs(spec)
    envs: dict[str, Any] = {}
    try:
        for traj in trajectories:
            if traj.group not in envs:
                envs[traj.group] = TurnLevelWrapper(SearchQAEnv(specs[traj.group]))
            env = envs[traj.group]
            tokenizer = env.unwrapped.tokenizer
            _, info = env.reset(seed=traj.seed, options={"question_id": traj.question_id})
            reward, end = 0.0, None
            for tool, text in traj.turns:
                ids = tokenizer.encode(_render(tool, text))
                if tool is None and tokenizer.eos_token_id is not None:  # a malformed turn ends unparsed
                    ids.append(tokenizer.eos_token_id)
                _, r, terminated, truncated, info = env.step(ids)
                reward += float(r)
                if terminated or truncated:
                    end = info["end_reason"]
                    break
            out[traj.name] = Outcome(reward, end, _hits(info["retrieved_ids"]))
    finally:
        for env in envs.values():
            env.close()
    return out


def play_trl(spec: EnvSpec, trajectories: Sequence[Trajectory]) -> dict[str, Outcome]:
    """Plays each trajectory through the TRL tool env, as TRL's loop calls it: a turn that calls no tool is a
    call TRL cannot run (it answers the model an error; the env sees nothing), a refused call raises (a
    search with an empty query spends nothing). The episode ends when answered, or at the budget when a
    search is refused for it."""
    from searchgym.agents.integrations.trl_env import SearchQAToolEnv

    out: dict[str, Outcome] = {}
    specs = group_specs(spec)
    for traj in trajectories:
        env = SearchQAToolEnv(specs[traj.group])
        env.reset(question_id=traj.question_id, seed=traj.seed)
        end = None
        for tool, text in traj.turns:
            if tool is None:
                continue
            try:
                getattr(env, tool)(text)
            except InvalidActionError:  # an empty query: refused, nothing spent
                continue
            except EpisodeFinishedError as e:
                if "no searches left" in str(e):
                    end = "turn_budget"
                    break
            if env.given_answer is not None:
                end = "answered"
                break
        out[traj.name] = Outcome(env.get_reward(), end, _hits(env.hit_ids))
    return out


def play_openenv(urls: Mapping[str, str], trajectories: Sequence[Trajectory]) -> dict[str, Outcome]:
    """Plays each trajectory through OpenEnv's client, one session per group's server (``urls[group]``);
    a turn that calls no tool is sent as an action of an unknown tool, which the server refuses."""
    from searchgym.app.openenv import SearchQAAction, SearchQAEnvClient

    out: dict[str, Outcome] = {}
    with contextlib.ExitStack() as stack:
        clients: dict[str, Any] = {}
        for traj in trajectories:
            if traj.group not in clients:
                clients[traj.group] = stack.enter_context(SearchQAEnvClient(base_url=urls[traj.group]).sync())
            env = clients[traj.group]
            env.reset(seed=traj.seed, question_id=traj.question_id)
            reward, end = 0.0, None
            for tool, text in traj.turns:
                if tool is None:
                    with contextlib.suppress(RuntimeError):  # the server's refusal, the session kept
                        env.step(SearchQAAction.model_construct(tool="reply", text=text))
                    continue
                result = env.step(SearchQAAction(tool=tool, text=text))
                if result.done:
                    reward, end = float(result.reward or 0.0), result.observation.metadata["end_reason"]
                    break
            out[traj.name] = Outcome(reward, end, _hits(env.state().hit_ids))
    return out


def play_verifiers(spec: EnvSpec, trajectories: Sequence[Trajectory]) -> dict[str, Outcome]:
    """Plays each trajectory through the ``verifiers`` environment's episode loop, the model's replies
    scripted: tool calls for even-numbered trajectories, Search-R1's tags in text for odd ones."""
    from searchgym.app.hub.replies import Reply, ToolCall, play_conversation

    out: dict[str, Outcome] = {}
    specs = group_specs(spec)
    for index, traj in enumerate(trajectories):
        view = SearchQAMessages(specs[traj.group])
        replies: Iterator[tuple[Tool, str]] = iter(traj.turns)

        async def respond(
            _: str, replies: Iterator[tuple[Tool, str]] = replies, tagged: int = index % 2
        ) -> Any:
            tool, text = next(replies, (None, None))
            if text is None:
                return None
            if tool is None or tagged:
                return Reply(text=_render(tool, text))
            argument = "query" if tool == "search" else "text"
            return Reply(tool_calls=(ToolCall(tool, {argument: text}),))

        last = asyncio.run(play_conversation(view, respond, traj.question_id, traj.seed))
        reward = last.reward if last is not None else 0.0
        out[traj.name] = Outcome(reward, view.end_reason, _hits(view.hit_ids))
    return out


def compare(outcomes: Mapping[str, Mapping[str, Outcome]], reference: str = "gym") -> list[str]:
    """Every difference from the ``reference`` door: one line per door, trajectory and value that differ
    (``"trl: trajectory oracle/train-3: reward 0.0, gym 1.0"``); a trajectory a door did not play counts."""
    lines: list[str] = []
    expected = outcomes[reference]
    for door, results in outcomes.items():
        if door == reference:
            continue
        for name, want in expected.items():
            got = results.get(name)
            if got is None:
                lines.append(f"{door}: trajectory {name}: not played")
                continue
            if got.reward != want.reward:
                lines.append(f"{door}: trajectory {name}: reward {got.reward}, {reference} {want.reward}")
            if got.end != want.end:
                lines.append(f"{door}: trajectory {name}: end {got.end}, {reference} {want.end}")
            if got.hits != want.hits:
                lines.append(f"{door}: trajectory {name}: passages {got.hits}, {reference} {want.hits}")
    return lines


def play_all(
    spec: EnvSpec,
    trajectories: Sequence[Trajectory],
    urls: Mapping[str, str] | None = None,
    doors: Sequence[str] = DOORS,
) -> dict[str, dict[str, Outcome]]:
    """Every door's outcomes (``openenv`` only with ``urls``, one server per group)."""
    players: dict[str, Callable[[], dict[str, Outcome]]] = {
        "gym": lambda: play_gym(spec, trajectories),
        "trl": lambda: play_trl(spec, trajectories),
        "verifiers": lambda: play_verifiers(spec, trajectories),
    }
    if urls is not None:
        players["openenv"] = lambda: play_openenv(urls, trajectories)
    return {door: players[door]() for door in doors if door in players}
