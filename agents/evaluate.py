"""One evaluation harness: run any agent on any SearchQA env and summarise EM, F1, searches and more."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from .base import Agent

__all__ = ["EpisodeRecord", "EvalSummary", "check_record", "evaluate", "run_episode"]


@dataclass
class EpisodeRecord:
    """The outcome of one episode: the final ``info``, the reward, and the transcript."""

    info: dict[str, Any]
    reward: float
    steps: int
    transcript: str

    @property
    def valid_format(self) -> bool:
        """Every turn was a well-formed search or answer, and the episode ended with an answer."""
        return self.info["end_reason"] == "answered" and self.info["invalid_turns"] == 0

    def to_json(self) -> dict[str, Any]:
        return {**self.info, "reward": self.reward, "steps": self.steps, "transcript": self.transcript}

    @classmethod
    def from_json(cls, record: Any) -> EpisodeRecord:
        """The record :meth:`to_json` wrote (a line of ``eval --out``), its fields checked.

        Raises:
            ValueError: not an object, or a field the figures read is missing or of the wrong type (named).
        """
        check_record(record)
        info = dict(record)
        return cls(
            info=info, reward=info.pop("reward"), steps=info.pop("steps"), transcript=info.pop("transcript")
        )


_NUMBER_FIELDS = ("em", "subem", "f1", "reward")
_COUNT_FIELDS = ("searches", "invalid_turns", "policy_tokens", "steps")
_FLAG_FIELDS = ("gold_retrieved", "gold_all_retrieved")


def check_record(record: Any) -> None:
    """Checks an episode record (a line of ``eval --out``) holds what the figures read, with its type: the
    answer metrics and the reward as finite numbers, the counts as integers >= 0, ``end_reason`` and
    ``transcript`` as strings, the gold-retrieval flags as booleans or null, ``retrieval_faults`` as counts.

    Raises:
        ValueError: naming the first field that is missing or wrong.
    """
    if not isinstance(record, dict):
        raise ValueError(f"a {type(record).__name__}, not an episode record")

    def field(name: str, ok: Callable[[Any], bool], what: str, required: bool = True) -> None:
        if name not in record:
            if required:
                raise ValueError(f"no {name!r} field")
            return
        if not ok(record[name]):
            raise ValueError(f"{name!r} is {record[name]!r:.40}, not {what}")

    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)

    def count(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    for name in _NUMBER_FIELDS:
        field(name, number, "a finite number")
    for name in _COUNT_FIELDS:
        field(name, count, "a count")
    for name in ("end_reason", "transcript"):
        field(name, lambda v: isinstance(v, str), "a string")
    for name in _FLAG_FIELDS:
        field(
            name,
            lambda v: v is None or isinstance(v, bool),
            "true, false or null",
            required=name == "gold_retrieved",
        )
    field(
        "retrieval_faults",
        lambda v: isinstance(v, dict) and all(count(c) for c in v.values()),
        "an object of counts",
        required=False,
    )


@dataclass
class EvalSummary:
    """Averages over evaluated episodes (keys as printed by ``searchgym eval --json``).

    Retrieval figures count the passages returned by any search of the episode, over the episodes whose
    question has supporting passages (``None`` when none has):

    * ``retrieval_recall``: the share of episodes that retrieved *at least one* supporting passage;
    * ``retrieval_recall_all``: the share that retrieved *every* supporting passage (all-hop recall, what
      a multi-hop question needs).

    ``retrieval_faults`` is the mean number of retriever faults injected per episode (``None`` when the env
    injects none, see ``retriever_faults``).

    With ``samples`` K > 1 every question is played K times: ``em`` is mean@K (the mean over questions of each
    question's success rate), ``pass_at_k`` the share of questions solved at least once in K (the unbiased
    estimator at k = K), and ``successes`` each question's count of successful samples. ``em_low`` and
    ``em_high`` bound ``em`` by Wilson's score interval over the questions (:func:`searchgym.stats.wilson`).

    ``failures`` counts the episodes by the stage they failed at — no answer, gold not retrieved, retrieved but
    misread — overall and per question kind (:func:`searchgym.failures.decompose`).
    """

    em: float
    em_low: float
    em_high: float
    subem: float
    f1: float
    valid_format: float
    searches: float
    retrieval_recall: float | None
    retrieval_recall_all: float | None
    tokens: float
    episodes: int
    episodes_per_s: float
    retrieval_faults: float | None = None
    samples: int = 1
    pass_at_k: float | None = None
    successes: list[int] = field(default_factory=list, repr=False)
    failures: dict[str, Any] = field(default_factory=dict, repr=False)
    records: list[EpisodeRecord] = field(default_factory=list, repr=False)

    @classmethod
    def of(cls, records: list[EpisodeRecord], seconds: float, samples: int = 1) -> EvalSummary:
        """The summary of ``records``, played ``samples`` consecutive episodes per question.

        Raises:
            ValueError: the records are not a whole number of questions' samples.
        """
        from searchgym.failures import decompose
        from searchgym.stats import pass_at_k, wilson

        def mean(values: list[float]) -> float:
            return float(np.mean(values)) if values else 0.0

        if len(records) % samples:
            raise ValueError(f"{len(records)} episodes are not {samples} samples of each question")
        successes = [
            sum(r.info["em"] >= 1.0 for r in records[i : i + samples])
            for i in range(0, len(records), samples)
        ]
        em = mean([r.info["em"] for r in records])
        interval = wilson(em * len(successes), len(successes)) if successes else None

        recall = [float(r.info["gold_retrieved"]) for r in records if r.info["gold_retrieved"] is not None]
        recall_all = [
            float(r.info["gold_all_retrieved"])
            for r in records
            if r.info.get("gold_all_retrieved") is not None
        ]
        faults = [
            float(sum(r.info["retrieval_faults"].values())) for r in records if "retrieval_faults" in r.info
        ]
        return cls(
            em=em,
            em_low=interval.low if interval else 0.0,
            em_high=interval.high if interval else 0.0,
            subem=mean([r.info["subem"] for r in records]),
            f1=mean([r.info["f1"] for r in records]),
            valid_format=mean([float(r.valid_format) for r in records]),
            searches=mean([r.info["searches"] for r in records]),
            retrieval_recall=mean(recall) if recall else None,
            retrieval_recall_all=mean(recall_all) if recall_all else None,
            tokens=mean([r.info["policy_tokens"] for r in records]),
            episodes=len(records),
            episodes_per_s=len(records) / seconds if seconds > 0 else float("inf"),
            retrieval_faults=mean(faults) if faults else None,
            samples=samples,
            pass_at_k=mean([pass_at_k(samples, c, samples) for c in successes]) if successes else None,
            successes=successes,
            failures=decompose([{**r.info, "transcript": r.transcript} for r in records]),
            records=records,
        )

    @classmethod
    def metric_names(cls) -> list[str]:
        """The names of the summary figures, in order (the keys of :meth:`metrics`; ``successes`` is the list
        of per-question counts, ``failures`` the counts by stage)."""
        return [f.name for f in fields(cls) if f.name != "records"]

    def metrics(self) -> dict[str, Any]:
        """The summary figures as a flat dict (no records)."""
        return {name: getattr(self, name) for name in self.metric_names()}


def run_episode(
    env: gym.Env[Any, Any],
    agent: Agent,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    max_steps: int = 1_000_000,
) -> EpisodeRecord:
    """Plays one episode of ``agent`` in ``env`` token by token.

    Raises:
        RuntimeError: the episode did not end within ``max_steps`` (an env bug: episodes are bounded).
    """
    obs, info = env.reset(seed=seed, options=options)
    agent.reset(info, seed=seed)
    reward, steps = 0.0, 0
    for steps in range(1, max_steps + 1):  # noqa: B007 - steps is reported
        obs, r, terminated, truncated, info = env.step(agent.act(obs, info))
        reward += float(r)
        if terminated or truncated:
            break
    else:
        raise RuntimeError(f"episode did not end within {max_steps} steps")
    transcript = env.unwrapped.episode.render_text()  # type: ignore[attr-defined]
    extras = getattr(
        agent, "record_extras", None
    )  # what an agent keeps of its episode (a served model's requests)
    if callable(extras):
        info = {**info, **extras()}
    return EpisodeRecord(info=info, reward=reward, steps=steps, transcript=transcript)


def iter_episodes(
    env: gym.Env[Any, Any],
    agent: Agent,
    episodes: int,
    seed: int = 0,
    by_index: bool = True,
    first: int = 0,
    samples: int = 1,
) -> Iterator[EpisodeRecord]:
    """Yields the records of episodes ``first .. episodes - 1``; with ``by_index`` episode i pins question
    ``i // samples`` (mod the split size): each question's samples are consecutive. Episode i resets with
    ``seed + i``, so every sample of a question has its own seed."""
    n_questions = len(env.unwrapped.questions)  # type: ignore[attr-defined]
    for i in range(first, episodes):
        options = {"question_index": (i // samples) % n_questions} if by_index else None
        record = run_episode(env, agent, seed=seed + i, options=options)
        if samples > 1:
            record.info["sample"] = i % samples
        yield record


def _concurrent_episodes(
    players: Sequence[tuple[gym.Env[Any, Any], Agent]],
    episodes: int,
    seed: int,
    first: int,
    samples: int,
) -> Iterator[EpisodeRecord]:
    """As :func:`iter_episodes`, with each (env, agent) pair of ``players`` playing one episode at a time in
    a thread of its own: ``len(players)`` episodes are in flight at once, and the records come in episode
    order. Every episode is seeded and pinned by its index alone, so they equal one player's."""
    import queue
    from concurrent.futures import Future, ThreadPoolExecutor

    idle: queue.SimpleQueue[tuple[gym.Env[Any, Any], Agent]] = queue.SimpleQueue()
    for player in players:
        idle.put(player)

    def play(i: int) -> EpisodeRecord:
        env, agent = idle.get()
        try:
            return next(iter_episodes(env, agent, i + 1, seed, first=i, samples=samples))
        finally:
            idle.put((env, agent))

    pool = ThreadPoolExecutor(max_workers=len(players), thread_name_prefix="episode")
    window: list[Future[EpisodeRecord]] = []
    try:
        for i in range(first, episodes):
            window.append(pool.submit(play, i))
            if len(window) >= 2 * len(players):  # a bounded look-ahead: a failure stops the run soon
                yield window.pop(0).result()
        while window:
            yield window.pop(0).result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def evaluate(
    env: gym.Env[Any, Any],
    agent: Agent,
    episodes: int,
    *,
    seed: int = 0,
    out: str | Path | None = None,
    progress: bool = False,
    held: list[EpisodeRecord] | None = None,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
    on_line: Callable[[bytes], None] | None = None,
    samples: int = 1,
    players: Sequence[tuple[gym.Env[Any, Any], Agent]] = (),
) -> EvalSummary:
    """Evaluates ``agent`` on the first ``episodes`` questions of the env's split (in order).

    Args:
        env: A SearchQA env (wrapped or not).
        agent: Any :class:`Agent`.
        episodes: Number of questions; question i is question ``i`` modulo the split size.
        samples: Episodes per question (K), played one after another; ``episodes * samples`` in all.
        seed: Base seed; episode i (of ``episodes * samples``) resets with ``seed + i``.
        out: Optional JSONL path for one transcript record per episode.
        progress: Show a tqdm progress bar.
        held: The records of episodes ``0 .. len(held) - 1``, already played (a resumed run: ``out`` holds
            them and is appended to); the run plays the rest, and the summary covers them all.
            Every episode is seeded by its index alone, so the result equals an uninterrupted run's.
        on_episode: Called with each record this run plays, once it is written (a caller's own progress).
        on_line: Called with each line's bytes (newline included) once it is written to ``out`` and flushed
            (:meth:`~searchgym.data.digests.RecordDigests.append` records its digest).
        players: More (env, agent) pairs, each an env like ``env`` and its own agent, that play episodes at
            the same time as ``(env, agent)``, one each at a time (a served model's concurrent requests); the
            records, the file and the callbacks keep episode order, and equal a lone player's.
    """
    start = time.perf_counter()
    records: list[EpisodeRecord] = list(held or [])
    total = episodes * samples
    iterator: Any = (
        _concurrent_episodes([(env, agent), *players], total, seed, len(records), samples)
        if players
        else iter_episodes(env, agent, total, seed, first=len(records), samples=samples)
    )
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, total=total, initial=len(records), desc=f"eval {agent.name}", unit="ep")
    sink = None
    if out is not None:  # written as episodes finish, so a crash keeps what was done
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        sink = path.open("a" if held else "w", encoding="utf-8")
    try:
        for record in iterator:
            records.append(record)
            if sink is not None:
                line = json.dumps(record.to_json(), ensure_ascii=False) + "\n"
                sink.write(line)
                sink.flush()
                if on_line is not None:
                    on_line(line.encode("utf-8"))
            if on_episode is not None:
                on_episode(record)
    finally:
        if sink is not None:
            sink.close()
    seconds = time.perf_counter() - start
    summary = EvalSummary.of(records, seconds, samples=samples)
    if held:  # the pace of the episodes this run played, not of the ones it found done
        played = len(records) - len(held)
        summary.episodes_per_s = played / seconds if seconds > 0 else float("inf")
    return summary
