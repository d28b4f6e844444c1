"""SearchQA as a ``verifiers`` environment (extra ``searchgym[verifiers]``, verifiers 0.4).

verifiers 0.4 composes an environment from a **taskset** (the rows: one task per question of the split) and
an **env** (how one task becomes one episode), each found by its loader from an installed module's
``__all__``. Here:

* :class:`SearchQATaskset`: its config takes every :class:`~searchgym.envs.EnvSpec` field
  (``--env.taskset.topk 5``, ``dataset=FOLDER`` …) and a reset ``seed``; its tasks carry a question id and
  no prompt (the env opens the conversation);
* :class:`SearchQAEnv`: plays each task on the message-level view
  (:class:`~searchgym.envs.messages.SearchQAMessages`, the episodes of the TRL tool env and the OpenEnv
  server): the instruction and question go to the model as the user; each reply is one turn — a ``search``
  or ``answer`` tool call, or Search-R1's ``<search>``/``<answer>`` tags in its text
  (:func:`~searchgym.app.hub.replies.parse_reply`); the tool's result comes back as the next user message; the
  episode ends on the answer or at the turn budget, and the trace's reward ``searchqa`` is the view's;
* :class:`SearchQAHarness`: verifiers' plain chat harness (``null``), the default for this taskset.

verifiers' loader imports a taskset id as a top-level module, so the id ``searchgym-searchqa`` is the small
distribution in ``environments/searchgym_searchqa`` that re-exports these classes (``pip install -e
environments/searchgym_searchqa``). :func:`load_environment` builds the environment in Python.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal

from searchgym.errors import MissingDependencyError

try:
    import verifiers.v1 as vf  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    raise MissingDependencyError("verifiers", "verifiers", "searchgym's verifiers environment") from None
from pydantic import create_model
from verifiers.v1.harnesses.null import NullHarness  # type: ignore[import-not-found,unused-ignore]

from searchgym.app.hub.replies import Reply, ToolCall, play_conversation
from searchgym.envs.messages import SearchQAMessages
from searchgym.envs.spec import EnvSpec, make_spec

__all__ = [
    "TASKSET_ID",
    "SearchQAData",
    "SearchQAEnv",
    "SearchQAEnvConfig",
    "SearchQAHarness",
    "SearchQATask",
    "SearchQATaskset",
    "SearchQATasksetConfig",
    "load_environment",
    "spec_of",
]

TASKSET_ID = "searchgym-searchqa"
"""The id verifiers' loader finds the environment by (``vf-eval searchgym-searchqa``)."""


def _plain(annotation: Any) -> bool:
    """Whether a type is made of ``int``, ``float``, ``bool``, ``str``, ``None`` and literals only."""
    if annotation in (int, float, bool, str, type(None)):
        return True
    if typing.get_origin(annotation) is Literal:
        return True
    args = typing.get_args(annotation)
    return bool(args) and isinstance(annotation, types.UnionType) and all(_plain(a) for a in args)


def _spec_fields() -> dict[str, Any]:
    """The config's fields: each EnvSpec field with its default, typed as the spec types it where the type is
    plain data (so that command-line values arrive as numbers and booleans), else ``Any`` (an object the
    spec also takes: a dataset, a retriever, faults)."""
    hints = typing.get_type_hints(EnvSpec)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(EnvSpec):
        annotation = hints[f.name]
        fields[f.name] = (annotation if _plain(annotation) else Any, f.default)
    return fields


SearchQATasksetConfig: Any = create_model(
    "SearchQATasksetConfig",
    __base__=vf.TasksetConfig,
    __doc__="Every EnvSpec field (checked by EnvSpec), and the reset seed of every episode.",
    seed=(int | None, None),
    **_spec_fields(),
)


def spec_of(config: Any) -> EnvSpec:
    """The :class:`~searchgym.envs.EnvSpec` of a taskset config (its fields checked as ``SearchQA-v0``'s).

    Raises:
        ConfigError: an invalid value.
    """
    return EnvSpec(**{name: getattr(config, name) for name in EnvSpec.field_names()})


class SearchQAData(vf.TaskData):  # type: ignore[misc,unused-ignore]
    """A task: the question's id and the reset seed."""

    question_id: str
    seed: int | None = None


class SearchQATask(vf.Task[SearchQAData]):  # type: ignore[misc,unused-ignore]
    """One question; scored by :class:`SearchQAEnv` while it plays the episode."""


class SearchQATaskset(vf.Taskset[SearchQATask, SearchQATasksetConfig]):  # type: ignore[misc,unused-ignore]
    """One task per question of the spec's split, in the split's order."""

    def load(self) -> Iterator[SearchQATask]:
        view = SearchQAMessages(spec_of(self.config))  # a bad setting fails here, before any rollout
        for question in view.questions:
            data = SearchQAData(
                id=question.id, name=question.id, prompt=None, question_id=question.id, seed=self.config.seed
            )
            yield SearchQATask(data, self.config.task)


class SearchQAEnvConfig(vf.EnvConfig):  # type: ignore[misc,unused-ignore]
    """The one seat, ``agent``: the policy playing the questions."""

    agent: vf.AgentConfig = vf.AgentConfig()


def _reply(segment: Any) -> Reply:
    """The last assistant message of a verifiers segment as a :class:`~searchgym.app.hub.replies.Reply`."""
    for message in reversed(segment.messages):
        if isinstance(message, vf.AssistantMessage):
            calls = tuple(ToolCall(c.name, c.arguments) for c in message.tool_calls or ())
            return Reply(text=message.content or "", tool_calls=calls)
    return Reply(text=segment.last_reply)


class SearchQAEnv(vf.Env[SearchQAEnvConfig]):  # type: ignore[misc,unused-ignore]
    """A task becomes a SearchQA episode: the env plays the user, each reply is a turn of the view."""

    async def run(self, task: Any, agents: Any) -> None:
        view = SearchQAMessages(spec_of(self.config.taskset))
        async with agents.agent.interaction(task) as interaction:

            async def respond(message: str) -> Reply | None:
                segment = await interaction.turn(message)
                return None if segment.terminated else _reply(segment)

            await play_conversation(view, respond, task.data.question_id, task.data.seed)
            if not view.done:
                interaction.trace.stop("no_reply")
        trace = interaction.trace
        info = view.info
        trace.record_reward("searchqa", view.reward() if view.done else 0.0)
        trace.record_metrics(
            {"em": info["em"], "f1": info["f1"], "searches": info["searches"], "turns": view.turns}
        )


class SearchQAHarness(NullHarness):  # type: ignore[misc,unused-ignore]
    """verifiers' plain chat harness: the model's replies, no tools of its own (the env runs them)."""


def load_environment(**fields: Any) -> Any:
    """The ``verifiers`` environment over ``fields`` (every :class:`~searchgym.envs.EnvSpec` field, and
    ``seed``), loaded by verifiers' own loader from the id :data:`TASKSET_ID`.

    Raises:
        ConfigError: an unknown field or an invalid value.
        ModuleNotFoundError: the id's module is not installed (``pip install -e
            environments/searchgym_searchqa``).
    """
    seed = fields.pop("seed", None)
    make_spec(None, fields)  # checked here, with the spec's own messages
    config = vf.resolve_env_config({"taskset": {"id": TASKSET_ID, "seed": seed, **fields}})
    return vf.load_environment(config)
