"""What defines an episode, declared once: :class:`EnvSpec`.

Every front end (the environments, the vector env, the trainers' configs, the CLI commands, OpenEnv, the TRL
tool env, the verl tool) takes its environment options from this one dataclass: each field's default, bound
and help are written here and checked here, in ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from searchgym.data import Dataset
from searchgym.errors import ConfigError
from searchgym.options import NO_LIMIT, check_bounds, check_choices, option
from searchgym.retrieval import Retriever
from searchgym.retrieval.faults import parse_faults
from searchgym.rewards import get_metric

__all__ = ["ENV_SECTIONS", "MAX_CONTEXT_TOKENS", "RUN_PATIENCE", "TRAINING", "EnvSpec", "make_spec"]

MAX_CONTEXT_TOKENS = 1 << 20
"""The largest transcript an env holds (its observation arrays are allocated at ``max_context_tokens``)."""

RUN_PATIENCE = 300.0
"""The ``retriever_patience`` of the CLI's commands and the trainers: a run waits five minutes for a URL
retriever that restarts, where an env built in code fails fast (its default, 0)."""

ENV_SECTIONS: dict[str, tuple[str, ...]] = {
    "data": ("dataset", "world_seed", "split"),
    "retrieval": ("retriever", "retriever_patience", "retriever_faults", "on_retrieval_error"),
    "episode": (
        "topk",
        "max_turns",
        "max_turn_tokens",
        "max_context_tokens",
        "max_obs_tokens",
        "max_passage_words",
        "reward",
        "prompt_style",
        "append_question_mark",
    ),
}
"""The spec's fields by what they choose (the order of ``--help``'s environment options)."""


@dataclass(frozen=True)
class EnvSpec:
    """Everything that defines a SearchQA episode (see :class:`searchgym.envs.SearchQAEnv` for the dynamics).

    Frozen and checked once: an ``EnvSpec`` that exists is a valid one. Build a variant with
    :meth:`replace`. ``dataset`` and ``retriever`` may also be objects (a loaded
    :class:`~searchgym.data.Dataset`, a :class:`~searchgym.retrieval.Retriever`) for code that shares them;
    :meth:`to_dict` (what manifests and checkpoints store) needs names.
    """

    dataset: str | Path | Dataset | None = option(  # noqa: RUF009 - the default is None
        None, "FlashRAG folder, or 'world' (default: the generated world)"
    )
    world_seed: int = option(0, "seed of the generated world (ignored with --dataset)", bounds=(0, NO_LIMIT))
    split: str = option("train", "question split")
    retriever: str | Retriever = option(  # noqa: RUF009 - the default is an immutable str
        "bm25", "bm25, rank_bm25, dense:INDEX_DIR, hybrid:INDEX_DIR, or the URL of a /retrieve server"
    )
    retriever_patience: float = option(
        0.0,
        "seconds to wait for a URL retriever that stops answering (a restart) before failing; the episode "
        "then goes on as if nothing happened (0: fail once the client's retries are spent)",
        bounds=(0.0, float("inf")),
    )
    retriever_faults: Any = option(  # noqa: RUF009 - the default is None
        None,
        "inject seeded retriever faults, e.g. 'empty=0.1,shuffle=0.2,seed=3' (kinds: empty, replace, shuffle, "
        "truncate, latency; default: none)",
    )
    on_retrieval_error: Literal["raise", "observe"] = option(
        "raise", "a failed search: raise, or observe it as tool text ('Search failed: ...') and go on"
    )
    topk: int = option(3, "passages per search", bounds=(1, 1024))
    max_turns: int = option(4, "turns per episode, the final answer turn included", bounds=(1, 1024))
    max_turn_tokens: int = option(
        512, "policy tokens per turn (Search-R1: 500)", bounds=(1, MAX_CONTEXT_TOKENS)
    )
    max_context_tokens: int = option(
        2048, "transcript size in tokens (the context cap)", bounds=(16, MAX_CONTEXT_TOKENS)
    )
    max_obs_tokens: int | None = option(
        None,
        "cut each tool observation to this many tokens and go on, as Search-R1's max_obs_length (500 in its "
        "scripts); default: no cut, an observation that does not fit ends the episode",
        bounds=(1, MAX_CONTEXT_TOKENS),
    )
    max_passage_words: int | None = option(
        None, "cut each shown passage to this many words (default: no cut)", bounds=(1, MAX_CONTEXT_TOKENS)
    )
    reward: Literal["em", "subem", "f1"] = option(
        "em", "episode reward: exact match, substring EM or token F1"
    )
    prompt_style: Literal["base", "chat"] = option(
        "base", "base: Search-R1's prompt; chat: the prompt as a user message through the chat template"
    )
    append_question_mark: bool = option(
        True, "add '?' to a question that lacks one, as Search-R1's data preparation does"
    )

    def __post_init__(self) -> None:
        check_bounds(self)
        check_choices(self)
        get_metric(self.reward)
        if not isinstance(self.append_question_mark, bool):
            raise ConfigError(
                f"append_question_mark must be True or False, got {self.append_question_mark!r}"
            )
        if not isinstance(self.split, str) or not self.split:
            raise ConfigError(f"split must be a non-empty string, got {self.split!r}")
        if isinstance(self.dataset, Path):
            object.__setattr__(self, "dataset", str(self.dataset))
        object.__setattr__(self, "retriever_faults", parse_faults(self.retriever_faults))

    def replace(self, **fields: Any) -> EnvSpec:
        """This spec with ``fields`` changed (checked again)."""
        return dataclasses.replace(self, **fields)

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain data (faults as a mapping of their fields), for manifests and checkpoints."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("dataset", "retriever"):
            if not isinstance(out[name], str | None):
                raise ConfigError(f"an EnvSpec with a {name} object cannot be stored; give its name or path")
        if out["retriever_faults"] is not None:
            out["retriever_faults"] = dataclasses.asdict(out["retriever_faults"])
        return out

    def to_record(self) -> dict[str, Any]:
        """The spec as a record stores it (a manifest's env, an SB3 run's ``config.json``, a verl row, an eval
        run's identity): every field, plain data. :meth:`from_record` reads it back."""
        return self.to_dict()

    @classmethod
    def from_record(cls, record: Mapping[str, Any] | None) -> EnvSpec:
        """The spec a stored record describes: the one way back from plain data to a spec.

        A field the record lacks (a record written before the field existed) takes the spec's own default;
        keys that are not fields (a record's ``tokenizer``, ``render_mode``) are left to the caller.

        Raises:
            ConfigError: the record is not a mapping, or a value is invalid (the message names the field).
        """
        if record is None:
            return cls()
        if not isinstance(record, Mapping):
            raise ConfigError(
                f"an environment record must be a mapping of its fields, got {type(record).__name__}"
            )
        names = cls.field_names()
        return cls(**{k: v for k, v in record.items() if k in names})

    def episode_settings(self) -> dict[str, Any]:
        """The fields of the episode section (the dynamics a snapshot must be restored under)."""
        return {name: getattr(self, name) for name in ENV_SECTIONS["episode"]}

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The spec's fields, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))


def make_spec(spec: EnvSpec | None, fields: dict[str, Any]) -> EnvSpec:
    """``spec`` (default: :class:`EnvSpec`'s defaults) with ``fields`` changed: what an environment's
    constructor does with its arguments.

    Raises:
        ConfigError: ``spec`` is not an :class:`EnvSpec`, a field is unknown (the message lists the valid
            ones), or a value is invalid.
    """
    if spec is not None and not isinstance(spec, EnvSpec):
        raise ConfigError(f"spec must be an EnvSpec, got {type(spec).__name__}")
    unknown = sorted(set(fields) - set(EnvSpec.field_names()))
    if unknown:
        raise ConfigError(f"unknown environment options {unknown}; valid: {list(EnvSpec.field_names())}")
    if spec is None:
        return EnvSpec(**fields)
    return spec.replace(**fields) if fields else spec


TRAINING = EnvSpec(max_turn_tokens=48, max_context_tokens=1024, retriever_patience=RUN_PATIENCE)
"""The environment the trainers (and the tools that play their policies) use unless told otherwise: short
turns and a 1024-token context (the tiny model's turns are under 20 tokens; give a real LM Search-R1's 500
and ~4096), and a patient retriever."""
