"""The data of ``searchgym view``'s page: episodes read from eval and export-trajectories JSONL files, and
what the page shows for each (:mod:`._view_html` writes the page around it).

Two record formats are read:

* ``searchgym eval --out`` records: the episode's info, its reward and its ``transcript``, the text of
  every segment marked by its source (``[prompt]…[/prompt][policy]…[/policy][tool]…[/tool]``);
* ``searchgym export-trajectories`` rows (TRL or verl fields): prompt and response token ids, the mask that
  marks the policy's tokens, the rollout's log-probabilities and the episode's fields. Their ids are
  decoded with a tokenizer.

Everything here is pure (records in, dicts out), so the page's content is tested without a browser.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from searchgym.errors import DataFormatError

if TYPE_CHECKING:
    from searchgym.data.types import Dataset, Passage, Question
    from searchgym.tokenization import Tokenizer

__all__ = [
    "Episode",
    "Segment",
    "episode_near_miss",
    "file_labels",
    "page_episodes",
    "read_episodes",
    "split_transcript_text",
]

SourceName = Literal["prompt", "policy", "tool"]
SOURCES: tuple[SourceName, ...] = ("prompt", "policy", "tool")

# A segment ends at its closing mark only where the next segment (or the end) follows, so a policy that
# writes "[/policy]" inside its own text does not cut its turn there.
_SEGMENT = re.compile(r"\[(prompt|policy|tool)\](.*?)\[/\1\](?=\[(?:prompt|policy|tool)\]|\Z)", re.DOTALL)

_SUPPORT_KEYS = ("supporting_ids", "supporting_passage_ids", "gold_passage_ids")
"""Record fields (top level or under ``metadata``) that name an episode's gold passages."""

OUTCOMES = ("correct", "wrong", "no_answer")
"""The outcome filter's values: exact match, an answer that does not match, no answer at all."""


@dataclass(frozen=True)
class Segment:
    """A run of transcript tokens with one source.

    Attributes:
        source: ``"prompt"``, ``"policy"`` or ``"tool"``.
        text: The segment's text.
        ids: Its token ids when the record holds them (export-trajectories rows), else ``None``.
        logprobs: The rollout's log-probability of each id (policy segments of export rows), else ``None``.
    """

    source: SourceName
    text: str
    ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Episode:
    """One record of an input file, read.

    Attributes:
        path: The file, as given.
        line: Its 1-based line in the file.
        dataset: The dataset filter value: the record's ``dataset`` field, else the file's label.
        agent: The agent filter value: the record's ``agent`` field, else the file's agent (``""``: unknown).
        fields: The episode's fields under the eval names (``question``, ``golden_answers``, ``answer``,
            ``em``, ``f1``, ``reward``, ``searches``, ``end_reason``, ``question_id``, and when the record has
            them ``queries``, ``retrieved_ids``, ``gold_retrieved`` and ``supporting_ids``).
        segments: The transcript, segment by segment.
    """

    path: str
    line: int
    dataset: str
    fields: dict[str, Any]
    segments: tuple[Segment, ...] = field(default=())
    agent: str = ""


# -- reading ------------------------------------------------------------------------------------------------


def split_transcript_text(text: str) -> list[Segment]:
    """The segments of an eval record's ``transcript``.

    >>> [(s.source, s.text) for s in split_transcript_text("[prompt]Q[/prompt][policy]<answer> a </answer>[/policy]")]
    [('prompt', 'Q'), ('policy', '<answer> a </answer>')]

    Raises:
        ValueError: the text is not a sequence of ``[source]…[/source]`` segments.
    """
    segments: list[Segment] = []
    at = 0
    for match in _SEGMENT.finditer(text):
        if match.start() != at:
            break
        segments.append(Segment(match.group(1), match.group(2)))  # type: ignore[arg-type]
        at = match.end()
    if at != len(text):
        raise ValueError(f"the transcript is not [prompt]/[policy]/[tool] segments (from character {at + 1})")
    return segments


def file_labels(paths: Sequence[str | Path]) -> list[str]:
    """Each file's dataset label: its name, or the path as given where two files share a name."""
    names = [Path(p).name for p in paths]
    return [name if names.count(name) == 1 else str(p) for name, p in zip(names, paths, strict=True)]


def read_episodes(
    paths: Sequence[str | Path],
    tokenizer_for: Callable[[Path], Tokenizer] | None = None,
    agents: Sequence[str] | None = None,
    labels: Sequence[str] | None = None,
) -> list[Episode]:
    """Every episode of the given eval or export-trajectories JSONL files, in order.

    Args:
        paths: The files. Each is a dataset filter value (its name) unless its records name their own.
        tokenizer_for: The tokenizer that decodes a file's token ids, asked once per file that holds
            export-trajectories rows (default: the built-in tokenizer).
        agents: Each file's agent, where its records do not name one (default: unknown).
        labels: Each file's dataset label, where its records do not name one (default: its name).

    Raises:
        DataFormatError: a line is not JSON, or not one of the two record formats; the message names the file
            and the line.
    """
    from searchgym.data.jsonl import iter_jsonl

    episodes: list[Episode] = []
    agents = list(agents) if agents is not None else [""] * len(paths)
    for path, label, agent in zip(paths, labels or file_labels(paths), agents, strict=True):
        tokenizer: Tokenizer | None = None
        for line, record in iter_jsonl(Path(path)):
            try:
                kind = _record_format(record)
            except ValueError as e:
                raise DataFormatError(str(path), line, str(e)) from None
            if kind != "eval" and tokenizer is None:
                tokenizer = _tokenizer(tokenizer_for, Path(path))
            try:
                if kind == "eval":
                    fields, segments = _eval_record(record)
                else:
                    assert tokenizer is not None
                    fields, segments = _export_row(record, kind, tokenizer)
            except (TypeError, ValueError) as e:
                raise DataFormatError(str(path), line, str(e)) from None
            named, own = record.get("dataset"), record.get("agent")
            dataset, played = (
                named if isinstance(named, str) else label,
                own if isinstance(own, str) else agent,
            )
            episodes.append(Episode(str(path), line, dataset, fields, segments, played))
    return episodes


def _tokenizer(tokenizer_for: Callable[[Path], Tokenizer] | None, path: Path) -> Tokenizer:
    if tokenizer_for is not None:
        return tokenizer_for(path)
    from searchgym.tokenization import load_tokenizer

    return load_tokenizer(None)


_EXPORT_FIELDS = {  # format: its response ids, policy mask, rollout log-probs, reward
    "trl": ("completion_ids", "env_mask", "logprobs", "reward"),
    "verl": ("response_ids", "response_mask", "response_logprobs", "reward_score"),
}


def _record_format(record: Mapping[str, Any]) -> str:
    """``"eval"``, ``"trl"`` or ``"verl"``.

    Raises:
        ValueError: the record is none of them.
    """
    if "transcript" in record:
        return "eval"
    for kind, (response, mask, _, _) in _EXPORT_FIELDS.items():
        if {"prompt_ids", response, mask} <= record.keys():
            return kind
    raise ValueError(
        "neither an eval record (with 'transcript') nor an export-trajectories row (TRL: 'prompt_ids', "
        "'completion_ids', 'env_mask'; verl: 'prompt_ids', 'response_ids', 'response_mask')"
    )


def _typed(record: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    """``record[key]`` checked against ``kind`` (``None`` or missing: ``default``)."""
    value = record.get(key)
    if value is None:
        return default
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise TypeError(f"field {key!r} must be a number, got a boolean")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise TypeError(f"field {key!r} must be {names}, got {type(value).__name__}")
    return value


def _number(record: Mapping[str, Any], key: str) -> float | None:
    """A numeric field as a float; ``None`` when missing, null or not finite (JSON's ``NaN``)."""
    value = _typed(record, key, (int, float))
    return _finite(value) if value is not None else None


def _strings(record: Mapping[str, Any], key: str) -> list[str] | None:
    value = _typed(record, key, list)
    if value is not None and not all(isinstance(v, str) for v in value):
        raise TypeError(f"field {key!r} must be a list of strings")
    return value


def _support(record: Mapping[str, Any]) -> list[str] | None:
    """The gold passage ids a record names (top level or under ``metadata``), or ``None``."""
    from searchgym.data.flashrag import supporting_ids

    metadata = record.get("metadata")
    for where, prefix in ((record, ""), (metadata if isinstance(metadata, Mapping) else {}, "metadata.")):
        for key in _SUPPORT_KEYS:
            if where.get(key) is not None:
                try:
                    return list(supporting_ids(where[key], key, "", 0))
                except DataFormatError as e:  # its message names the field as metadata.KEY
                    message = str(e).removeprefix(f"{e.path}:{e.line}: ")
                    raise TypeError(message.replace(f"metadata.{key}", prefix + key, 1)) from None
    return None


def _common_fields(record: Mapping[str, Any], reward_key: str) -> dict[str, Any]:
    fields = {
        "question_id": _typed(record, "question_id", (str, int)),
        "question": _typed(record, "question", str, ""),
        "golden_answers": _strings(record, "golden_answers") or [],
        "answer": _typed(record, "answer", str),
        "em": _number(record, "em") or 0.0,
        "f1": _number(record, "f1") or 0.0,
        "reward": _number(record, reward_key),
        "searches": _typed(record, "searches", (int, float)),
        "end_reason": _typed(record, "end_reason", str),
        "gold_retrieved": _typed(record, "gold_retrieved", bool),
        "supporting_ids": _support(record),
    }
    if fields["question_id"] is not None:
        fields["question_id"] = str(fields["question_id"])
    if fields["searches"] is not None:
        fields["searches"] = int(fields["searches"])
    return fields


def _eval_record(record: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[Segment, ...]]:
    transcript = _typed(record, "transcript", str, "")
    fields = _common_fields(record, "reward")
    fields["queries"] = _strings(record, "queries")
    retrieved = _typed(record, "retrieved_ids", list)
    if retrieved is not None and not all(
        isinstance(ids, list) and all(isinstance(i, str | int) for i in ids) for ids in retrieved
    ):
        raise TypeError("field 'retrieved_ids' must be a list of lists of passage ids")
    fields["retrieved_ids"] = [[str(i) for i in ids] for ids in retrieved] if retrieved is not None else None
    return fields, tuple(split_transcript_text(transcript))


def _ids(record: Mapping[str, Any], key: str, vocab_size: int, name: str) -> list[int]:
    value = record.get(key)
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise TypeError(f"field {key!r} must be a list of token ids")
    bad = next((i for i in value if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise ValueError(
            f"token id {bad} in {key!r} is outside tokenizer {name!r} ({vocab_size} ids); pass the tokenizer "
            "the file was written with (--tokenizer)"
        )
    return value


def _export_row(
    record: Mapping[str, Any], kind: str, tokenizer: Tokenizer
) -> tuple[dict[str, Any], tuple[Segment, ...]]:
    response_key, mask_key, logp_key, reward_key = _EXPORT_FIELDS[kind]
    info: Mapping[str, Any] = record
    if kind == "verl":  # the episode's fields are under extra_fields
        info = {**_typed(record, "extra_fields", dict, {}), reward_key: record.get(reward_key)}
    vocab, name = tokenizer.vocab_size, tokenizer.name
    prompt = _ids(record, "prompt_ids", vocab, name)
    response = _ids(record, response_key, vocab, name)
    mask = record[mask_key]
    if not isinstance(mask, list) or len(mask) != len(response) or not all(m in (0, 1) for m in mask):
        raise ValueError(f"field {mask_key!r} must be {len(response)} zeros and ones, one per response token")
    logprobs = record.get(logp_key)
    if logprobs is not None and (
        not isinstance(logprobs, list)
        or len(logprobs) != len(response)
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in logprobs)
    ):
        raise ValueError(f"field {logp_key!r} must be {len(response)} numbers, one per response token")
    segments = [Segment("prompt", tokenizer.decode(prompt), tuple(prompt))]
    start = 0
    for end in range(1, len(response) + 1):
        if end == len(response) or mask[end] != mask[start]:
            ids = tuple(response[start:end])
            policy = mask[start] == 1
            segments.append(
                Segment(
                    "policy" if policy else "tool",
                    tokenizer.decode(ids),
                    ids,
                    tuple(float(v) for v in logprobs[start:end]) if policy and logprobs is not None else None,
                )
            )
            start = end
    return _common_fields(info, reward_key), tuple(segments)


def _finite(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


# -- the page's data ----------------------------------------------------------------------------------------


def outcome(answer: str | None, em: float) -> str:
    """``"correct"`` (exact match), ``"wrong"`` (an answer that does not match) or ``"no_answer"``."""
    if answer is None:
        return "no_answer"
    return "correct" if em > 0 else "wrong"


def _passage_dict(
    rank: int, pid: str | None, title: str, text: str, support: set[str] | None
) -> dict[str, Any]:
    gold = None if support is None or pid is None else pid in support
    return {"rank": rank, "id": pid, "title": title, "text": text, "gold": gold}


class _Corpus:
    """A dataset's passages by id and by title (to name the passages an export row's text shows)."""

    def __init__(self, dataset: Dataset) -> None:
        self.by_id: Mapping[str, Passage] = dataset.passage_index
        self.by_title: dict[str, list[Passage]] = {}
        for p in dataset.passages:
            self.by_title.setdefault(p.title, []).append(p)
        self.questions: dict[str, Question] = {}
        for split in dataset.splits:
            for q in dataset.questions(split):
                self.questions.setdefault(q.id, q)

    def match(self, title: str, text: str) -> Passage | None:
        """The passage with this title whose text starts with ``text`` (white space aside: the transcript
        may show it cut to a number of words or tokens)."""
        shown = " ".join(text.split())
        for p in self.by_title.get(title, ()):
            if " ".join(p.text.split()).startswith(shown):
                return p
        return None


def page_episodes(
    episodes: Sequence[Episode],
    *,
    dataset: Dataset | None = None,
    tokens: Sequence[list[list[list[Any]]] | None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """The page's data: one dict per episode, in order.

    Each holds ``index``, ``dataset``, ``source`` (``FILE:LINE``), ``question_id``, ``question``,
    ``golden_answers``, ``answer``, ``outcome`` (:func:`outcome`), ``em``, ``f1``, ``reward``, ``searches``,
    ``near_miss`` (:func:`searchgym.failures.near_miss`: why a wrong answer may be right, else ``None``),
    ``end_reason``, ``gold_retrieved``, ``gold_ids`` (``None`` when unknown), ``prompt``, ``turns``, ``agent``
    and ``peers`` (the indices of the other episodes of the same question id and text, of other agents). A
    turn holds the policy's ``text``, its ``kind`` (``"search"``, ``"answer"``, ``"invalid"``), its ``query``
    or ``answer``, the ``passages`` its search returned (``rank``, ``id``, ``title``, ``text``, ``gold``:
    ``True``/``False``, or ``None`` when the gold passages are unknown), the ``tool`` text when it shows
    no passages, and ``tokens`` (``[piece, value, …]`` per policy token) when values were computed.

    Args:
        episodes: From :func:`read_episodes`.
        dataset: The episodes' dataset: passages are shown whole by their retrieved ids (export rows: matched
            by title and text) and gold passages are its questions' supporting ids. Without it, passages
            come from the transcript's ``<information>`` blocks and gold ones from the record's own
            supporting ids, if any.
        tokens: For each episode, :func:`searchgym.app.view.tokens.policy_token_values` of its policy segments (or ``None``).
        warn: Called with one line when episodes do not match ``dataset`` (their gold passages stay unknown).
    """
    corpus = _Corpus(dataset) if dataset is not None else None
    unmatched: list[str] = []
    pages = []
    for index, episode in enumerate(episodes):
        f = episode.fields
        support = f.get("supporting_ids")
        question = None
        if corpus is not None and f.get("question_id") is not None:
            question = corpus.questions.get(f["question_id"])
            if (
                question is not None
                and f.get("question")
                and question.question.strip() != f["question"].strip()
            ):
                question = None
        if corpus is not None:
            if question is None:
                unmatched.append(f"{episode.path}:{episode.line}")
            elif support is None and question.supporting_ids:
                support = list(question.supporting_ids)
        support_set = set(support) if support is not None else None
        values = tokens[index] if tokens is not None else None
        turns = _turns(episode, corpus if question is not None else None, support_set, values)
        prompt = next((s.text for s in episode.segments if s.source == "prompt"), "")
        pages.append(
            {
                "index": index,
                "dataset": episode.dataset,
                "source": f"{episode.path}:{episode.line}",
                "question_id": f.get("question_id"),
                "question": f.get("question") or (question.question if question is not None else ""),
                "golden_answers": f.get("golden_answers") or [],
                "answer": f.get("answer"),
                "outcome": outcome(f.get("answer"), f.get("em") or 0.0),
                "near_miss": episode_near_miss(f),
                "em": f.get("em"),
                "f1": f.get("f1"),
                "reward": f.get("reward"),
                "searches": f["searches"]
                if f.get("searches") is not None
                else sum(t["kind"] == "search" for t in turns),
                "end_reason": f.get("end_reason"),
                "gold_retrieved": f.get("gold_retrieved"),
                "gold_ids": support,
                "prompt": prompt,
                "turns": turns,
                "agent": episode.agent,
            }
        )
    by_question: dict[tuple[Any, str], list[int]] = {}
    for page in pages:  # a question is its id and text: two datasets may share ids
        by_question.setdefault((page["question_id"], page["question"].strip()), []).append(page["index"])
    for page in pages:
        same = by_question[page["question_id"], page["question"].strip()]
        page["peers"] = [i for i in same if pages[i]["agent"] != page["agent"]]
    if unmatched and warn is not None:
        warn(
            f"{len(unmatched)} of {len(episodes)} episodes have no question of the same id and text in dataset "
            f"{dataset.name if dataset is not None else ''!r} (first: {unmatched[0]}): their passages are "
            "shown as the transcript has them, gold unmarked"
        )
    return pages


def episode_near_miss(fields: dict[str, Any]) -> str | None:
    """The record's near miss (:func:`searchgym.failures.near_miss`), ``None`` where it has no EM."""
    from searchgym.failures import near_miss

    if fields.get("em") is None:
        return None
    return near_miss({**fields, "golden_answers": fields.get("golden_answers") or []})


def _turn_segments(segments: Sequence[Segment]) -> list[tuple[Segment | None, Segment | None]]:
    """Each policy segment with the tool segment after it (a tool segment with no policy one before it
    stands alone)."""
    pairs: list[tuple[Segment | None, Segment | None]] = []
    for s in segments:
        if s.source == "policy":
            pairs.append((s, None))
        elif s.source == "tool":
            if pairs and pairs[-1][1] is None:
                pairs[-1] = (pairs[-1][0], s)
            else:
                pairs.append((None, s))
    return pairs


def _turns(
    episode: Episode,
    corpus: _Corpus | None,
    support: set[str] | None,
    values: list[list[list[Any]]] | None,
) -> list[dict[str, Any]]:
    from searchgym.agents.heuristic import parse_information
    from searchgym.protocol import parse_action

    queries: list[str] | None = episode.fields.get("queries")
    retrieved: list[list[str]] | None = episode.fields.get("retrieved_ids")
    turns: list[dict[str, Any]] = []
    searches = policy_turns = 0
    for policy, tool in _turn_segments(episode.segments):
        text = policy.text if policy is not None else ""
        action = parse_action(text)
        turn: dict[str, Any] = {
            "text": text,
            "kind": action.kind,
            "query": None,
            "answer": None,
            "passages": [],
        }
        ids = None
        if action.kind == "search":  # the k-th search turn made the k-th executed search
            turn["query"] = queries[searches] if queries and searches < len(queries) else action.content
            ids = retrieved[searches] if retrieved and searches < len(retrieved) else None
            searches += 1
        elif action.kind == "answer":
            turn["answer"] = action.content
        if policy is not None:
            if values is not None and policy_turns < len(values):
                turn["tokens"] = values[policy_turns]
            policy_turns += 1
        if tool is not None:
            shown = parse_information(tool.text) if "<information>" in tool.text else []
            turn["passages"] = _passages(shown, ids, corpus, support)
            if not turn["passages"]:
                turn["tool"] = tool.text
        turns.append(turn)
    return turns


def _passages(
    shown: list[tuple[str, str]], ids: list[str] | None, corpus: _Corpus | None, support: set[str] | None
) -> list[dict[str, Any]]:
    """The passages a search returned, by rank: whole from the dataset (by id, or for a row without ids by
    title and text) when it has them, else as the transcript shows them."""
    out = []
    for r in range(max(len(ids or ()), len(shown))):
        pid = ids[r] if ids is not None and r < len(ids) else None
        p = None
        if corpus is not None and pid is not None:
            p = corpus.by_id.get(pid)
        elif corpus is not None and ids is None:
            p = corpus.match(*shown[r])
        if p is not None:
            out.append(_passage_dict(r + 1, p.id, p.title, p.text, support))
        elif r < len(shown):
            out.append(_passage_dict(r + 1, pid, *shown[r], support))
    return out
