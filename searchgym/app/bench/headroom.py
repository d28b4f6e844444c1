"""Whether RL can move greedy play: how often sampling succeeds where greedy decoding fails.

GRPO at temperature ``T`` pushes each question's sampled success towards what greedy decoding already does;
it changes a greedy decision only where some samples succeed while greedy fails. ``searchgym bench
headroom`` measures that before a run: on each of the first ``N`` questions of a split the policy plays
once greedily and ``K`` times sampled at each temperature, and :func:`headroom_figures` reports, over all
questions, per question kind and per failure stage of the greedy episode:

- ``greedy_em``: mean EM of the greedy episodes;
- ``mean_at_k``: mean EM over all ``K`` samples of all questions;
- ``pass_at_k``: share of questions with at least one correct sample;
- ``solvable_given_greedy_wrong``: P(at least one of ``K`` samples correct | greedy wrong);
- ``success_given_greedy_wrong``: per-sample success rate on the greedy-wrong questions;
- ``greedy_gain_bound``: the greedy EM if every solvable greedy-wrong question flipped, ``greedy_em`` plus
  the share of questions that are greedy-wrong and solvable.

The failure stage of a greedy episode (:func:`failure_stage`) is ``correct``; ``no_answer`` (it ended without
an answer); ``retrieval_miss`` (it answered wrongly and some gold supporting passage was never retrieved);
``misread`` (it answered wrongly with every gold passage retrieved); or ``retrieval_unknown`` (it answered
wrongly on a question without supporting passages, as in real data that lists none).

This module is torch-free: :func:`headroom_figures` is a pure function of :class:`QuestionRecord` values,
and :func:`run_headroom` imports the env and the rollout code only when it runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from searchgym.errors import ConfigError

if TYPE_CHECKING:
    from searchgym.envs.spec import EnvSpec

__all__ = [
    "FIGURE_KEYS",
    "STAGES",
    "Draw",
    "HeadroomPolicy",
    "HeadroomSettings",
    "LLMHeadroomPolicy",
    "QuestionRecord",
    "SegmentDecoder",
    "failure_stage",
    "headroom_figures",
    "parse_temperatures",
    "run_headroom",
    "sample_seed",
    "temperature_key",
]

STAGES: tuple[str, ...] = ("correct", "retrieval_miss", "misread", "no_answer")
"""The greedy episode's stages always reported in ``by_stage``, in this order; ``retrieval_unknown`` is
added after them when some greedy-wrong question has no supporting passages."""

RETRIEVAL_UNKNOWN = "retrieval_unknown"

FIGURE_KEYS: tuple[str, ...] = (
    "questions",
    "greedy_em",
    "greedy_wrong",
    "mean_at_k",
    "pass_at_k",
    "solvable_given_greedy_wrong",
    "success_given_greedy_wrong",
    "greedy_gain_bound",
)
"""The figures of one group of questions at one temperature (see the module doc; ``greedy_wrong`` is the
number of greedy-wrong questions). A group without questions has ``None`` for every figure but
``questions``; the two conditional figures are ``None`` when the group has no greedy-wrong question."""


@dataclass(frozen=True)
class QuestionRecord:
    """One question's outcomes: its greedy episode and its samples.

    Attributes:
        question_id: The question's id.
        kind: The question's kind (``attribute``, ``bridge``, ``comparison`` in the generated world; free-form
            for real data; ``unknown`` where the dataset gives none).
        stage: The greedy episode's :func:`failure_stage`.
        greedy: EM of the greedy episode (0 or 1).
        samples: Temperature -> the ``K`` sampled episodes' EMs, in sample order.
    """

    question_id: str
    kind: str
    stage: str
    greedy: float
    samples: Mapping[float, Sequence[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class HeadroomSettings:
    """What ``bench headroom`` plays, checked when built.

    Attributes:
        questions: The first ``questions`` questions of the split are played (all of them when it has fewer).
        samples: Sampled episodes per question at each temperature (``K``).
        temperatures: Sampling temperatures, each > 0, distinct; the first is the one ``--json`` also reports
            at the top level.
        seed: Seed of the samples (:func:`sample_seed`); >= 0.
        batch_size: At most this many episodes are generated together.

    Raises:
        ConfigError: a value out of range.
    """

    questions: int = 200
    samples: int = 5
    temperatures: tuple[float, ...] = (1.0,)
    seed: int = 0
    batch_size: int = 64

    def __post_init__(self) -> None:
        for name in ("questions", "samples", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
        if self.seed < 0:
            raise ConfigError(f"--seed must be >= 0, got {self.seed}")
        _check_temperatures(self.temperatures, ",".join(map(str, self.temperatures)))


def parse_temperatures(text: str) -> tuple[float, ...]:
    """The temperatures of ``--temperatures`` (comma-separated numbers, e.g. ``1,0.7``).

    Raises:
        ConfigError: an empty list, a value that is not a number, not finite or not > 0, or a repeated value.
    """
    values = []
    for part in text.split(","):
        try:
            values.append(float(part))
        except ValueError:
            raise ConfigError(
                f"--temperatures {text!r}: {part.strip()!r} is not a number; give comma-separated "
                "temperatures > 0, e.g. 1,0.7"
            ) from None
    return _check_temperatures(tuple(values), text)


def _check_temperatures(values: tuple[float, ...], text: str) -> tuple[float, ...]:
    if not values:
        raise ConfigError("--temperatures: give at least one temperature > 0, e.g. 1,0.7")
    for t in values:
        if not (math.isfinite(t) and t > 0):
            raise ConfigError(
                f"--temperatures {text!r}: every temperature must be a finite number > 0, got {t}"
            )
    if len(set(values)) != len(values):
        raise ConfigError(f"--temperatures {text!r}: a temperature is repeated")
    return values


def temperature_key(temperature: float) -> str:
    """The key of a temperature in ``by_temperature``: ``repr`` of the float (``"1.0"``, ``"0.7"``)."""
    return repr(float(temperature))


def sample_seed(seed: int, temperature: float, sample: int) -> int:
    """The sampling seed of sample ``sample`` at ``temperature``: a hash of the three (numpy's
    ``SeedSequence``), so a sample does not depend on which other temperatures or how many samples are asked.

    Args:
        seed: ``--seed`` (>= 0).
        temperature: The sampling temperature (keyed by its value to a millionth).
        sample: The sample's index, ``0 .. K-1``.
    """
    entropy = [seed, round(temperature * 1_000_000), sample]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint32)[0])


def failure_stage(info: Mapping[str, Any]) -> str:
    """The stage of an episode from its info dict: ``correct`` (EM 1), ``no_answer`` (ended without an
    answer), ``retrieval_miss`` (some gold supporting passage never retrieved), ``misread`` (every gold
    passage retrieved, wrong answer), ``retrieval_unknown`` (wrong answer, the question lists no supporting
    passages)."""
    if float(info["em"]) == 1.0:
        return "correct"
    if info["answer"] is None:
        return "no_answer"
    retrieved = info["gold_all_retrieved"]
    if retrieved is None:
        return RETRIEVAL_UNKNOWN
    return "misread" if retrieved else "retrieval_miss"


def _group_figures(records: Sequence[QuestionRecord], temperature: float) -> dict[str, Any]:
    """:data:`FIGURE_KEYS` of ``records`` at ``temperature`` (counts are exact sums of 0/1 EMs)."""
    n = len(records)
    if n == 0:
        return {key: 0 if key in ("questions", "greedy_wrong") else None for key in FIGURE_KEYS}
    greedy_right = sum(r.greedy for r in records)
    wrong = [r for r in records if r.greedy != 1.0]
    samples = [list(r.samples[temperature]) for r in records]
    k = len(samples[0])
    solved = [any(s == 1.0 for s in row) for row in samples]
    wrong_rows = [list(r.samples[temperature]) for r in wrong]
    wrong_solved = sum(any(s == 1.0 for s in row) for row in wrong_rows)
    return {
        "questions": n,
        "greedy_em": greedy_right / n,
        "greedy_wrong": len(wrong),
        "mean_at_k": sum(sum(row) for row in samples) / (n * k),
        "pass_at_k": sum(solved) / n,
        "solvable_given_greedy_wrong": wrong_solved / len(wrong) if wrong else None,
        "success_given_greedy_wrong": (
            sum(sum(row) for row in wrong_rows) / (len(wrong) * k) if wrong else None
        ),
        "greedy_gain_bound": (greedy_right + wrong_solved) / n,
    }


def _temperature_figures(records: Sequence[QuestionRecord], temperature: float) -> dict[str, Any]:
    kinds = sorted({r.kind for r in records})
    stages = [*STAGES, *([RETRIEVAL_UNKNOWN] if any(r.stage == RETRIEVAL_UNKNOWN for r in records) else [])]
    return {
        **_group_figures(records, temperature),
        "by_kind": {
            kind: _group_figures([r for r in records if r.kind == kind], temperature) for kind in kinds
        },
        "by_stage": {
            stage: _group_figures([r for r in records if r.stage == stage], temperature) for stage in stages
        },
    }


def headroom_figures(records: Sequence[QuestionRecord]) -> dict[str, Any]:
    """The headroom figures of per-question records (a pure function; see the module doc).

    Returns:
        ``{"questions": N, "samples": K, "temperatures": [...], "temperature": first, <FIGURE_KEYS at the
        first temperature>, "by_kind": ..., "by_stage": ..., "by_temperature": {temperature_key(t): {<FIGURE_KEYS>,
        "by_kind": {kind: {<FIGURE_KEYS>}}, "by_stage": {stage: {<FIGURE_KEYS>}}}}}``. The top level repeats
        the first temperature's block; ``by_kind`` is sorted by kind, ``by_stage`` follows :data:`STAGES`.

    Raises:
        ConfigError: no records, or records whose temperatures or sample counts differ.
    """
    if not records:
        raise ConfigError("no questions to report on")
    temperatures = list(records[0].samples)
    if not temperatures:
        raise ConfigError("the records hold no sampled episodes")
    k = len(records[0].samples[temperatures[0]])
    for r in records:
        if list(r.samples) != temperatures or any(len(r.samples[t]) != k for t in temperatures):
            raise ConfigError(
                f"question {r.question_id}: its samples are not {k} at each of the temperatures {temperatures}"
            )
    if k < 1:
        raise ConfigError("the records hold no sampled episodes")
    by_temperature = {temperature_key(t): _temperature_figures(records, t) for t in temperatures}
    return {
        "questions": len(records),
        "samples": k,
        "temperatures": temperatures,
        "temperature": temperatures[0],
        **by_temperature[temperature_key(temperatures[0])],
        "by_temperature": by_temperature,
    }


# -- playing ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Draw:
    """Which play of the questions a decoder is for.

    Attributes:
        temperature: The sampling temperature; ``None`` for greedy decoding.
        sample: The sample's index ``0 .. K-1`` (0 for the greedy play).
        seed: The seed of its sampling (:func:`sample_seed`; 0 for the greedy play).
    """

    temperature: float | None
    sample: int
    seed: int


class SegmentDecoder(Protocol):
    """What :func:`~searchgym.agents.training.rollout.evaluate_policy` calls on a policy: one turn per
    observation (objects with ``tokens``, ``logprobs`` and ``stop``, as
    :class:`~searchgym.agents.llm.Segment`), and a hook that drops state kept between turns."""

    def rollout_segments(self, observations: Sequence[dict[str, np.ndarray]]) -> Sequence[Any]: ...

    def clear_cache(self) -> None: ...


class HeadroomPolicy(Protocol):
    """What :func:`run_headroom` needs of a policy: a decoder for each play of the questions."""

    def decoder(self, draw: Draw) -> SegmentDecoder:
        """The policy decoding as ``draw`` says (greedy, or sampling at its temperature from its seed)."""
        ...


class LLMHeadroomPolicy:
    """The :class:`HeadroomPolicy` of a language model: an ``LLMPolicy`` per play, greedy or sampling.

    Args:
        model: The causal LM.
        tokenizer: Its (the env's) tokenizer.
        max_turn_tokens: The env's per-turn token cap.
    """

    def __init__(self, model: Any, tokenizer: Any, max_turn_tokens: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_turn_tokens = max_turn_tokens

    def decoder(self, draw: Draw) -> SegmentDecoder:
        from searchgym.agents.llm import LLMPolicy

        return LLMPolicy(
            self.model,
            self.tokenizer,
            greedy=draw.temperature is None,
            temperature=1.0 if draw.temperature is None else draw.temperature,
            max_turn_tokens=self.max_turn_tokens,
            seed=draw.seed,
        )


def run_headroom(
    policy: HeadroomPolicy,
    spec: EnvSpec,
    settings: HeadroomSettings,
    *,
    tokenizer: Any = None,
    progress: bool = False,
) -> list[QuestionRecord]:
    """Plays the first ``settings.questions`` questions once greedily and ``settings.samples`` times at each
    temperature, and returns one :class:`QuestionRecord` per question (feed them to :func:`headroom_figures`).

    Each play is one :func:`~searchgym.agents.training.rollout.evaluate_policy` pass over the questions (the
    trainers' greedy evaluation), in batches of equal size of at most ``settings.batch_size`` episodes. A
    sampled play's generator is seeded once, by :func:`sample_seed`, and runs on through its batches: a sample
    is reproduced by the same seed, questions and batch size.

    Args:
        policy: Gives the decoder of each play.
        spec: The environment (split, sizes).
        settings: Questions, samples, temperatures, seed and batch size.
        tokenizer: The env's tokenizer, the policy's own (default: the built-in one).
        progress: Show a tqdm bar (episodes) on stderr.
    """
    from tqdm import tqdm

    from searchgym.agents.training.rollout import evaluate_policy
    from searchgym.envs.vector import SearchQAVectorEnv

    probe = SearchQAVectorEnv(1, spec, autoreset_mode="Disabled", tokenizer=tokenizer)
    try:
        questions = probe.questions[: settings.questions]
        if not questions:
            raise ConfigError(f"split {spec.split!r} has no questions")
        n = len(questions)
        batches = -(-n // settings.batch_size)
        # Opened while the probe holds the shared retriever, so the index is built once.
        env = SearchQAVectorEnv(-(-n // batches), spec, autoreset_mode="Disabled", tokenizer=tokenizer)
    finally:
        probe.close()
    draws = [Draw(None, 0, 0)] + [
        Draw(t, k, sample_seed(settings.seed, t, k))
        for t in settings.temperatures
        for k in range(settings.samples)
    ]
    played: dict[Draw, list[dict[str, Any]]] = {}
    bar = tqdm(total=n * len(draws), desc="headroom", unit="episode", disable=not progress)
    try:
        for draw in draws:
            episodes: list[dict[str, Any]] = []
            # evaluate_policy calls only rollout_segments and clear_cache (the SegmentDecoder protocol).
            evaluate_policy(policy.decoder(draw), env, n, episodes)  # type: ignore[arg-type]
            played[draw] = episodes
            bar.update(n)
    finally:
        bar.close()
        env.close()
    greedy, sampled = played[draws[0]], draws[1:]
    return [
        QuestionRecord(
            question_id=q.id,
            kind=q.kind or "unknown",
            stage=failure_stage(greedy[i]),
            greedy=float(greedy[i]["em"]),
            samples={
                t: tuple(float(played[d][i]["em"]) for d in sampled if d.temperature == t)
                for t in settings.temperatures
            },
        )
        for i, q in enumerate(questions)
    ]
