"""A model's reply as a turn of the message-level view, and the episode loop of a conversation.

A front end that owns the conversation (the ``verifiers`` environment, a served model) gets each reply as an
assistant message: tool calls when the model's chat template has them, else text that may hold Search-R1's
``<search>``/``<answer>`` tags (what searchgym's own policies write). :func:`parse_reply` reads both into one
:meth:`~searchgym.envs.messages.SearchQAMessages.play` turn; :func:`play_conversation` runs an episode.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from searchgym.envs.messages import TOOLS, MessageTurn, SearchQAMessages
from searchgym.protocol import parse_action

__all__ = ["Reply", "ToolCall", "parse_reply", "play_conversation"]

# The argument each tool reads; a call may also pass its one argument under another name.
_ARGUMENT = {"search": "query", "answer": "text"}


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a reply: the tool's name and its arguments (a mapping, or JSON text)."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    """An assistant message: its text and its tool calls."""

    text: str = ""
    tool_calls: Sequence[ToolCall] = ()


def parse_reply(reply: Reply) -> tuple[Literal["search", "answer"] | None, str]:
    """The turn a reply makes: ``(tool, text)``, ``tool`` ``None`` for a turn that calls no tool.

    The first tool call decides (one tool turn per reply, as ``SearchQA-v0`` has one action per turn): a call
    of ``search`` or ``answer`` with its one string argument; a call of another name, or with arguments that
    are not one string, calls no tool. A reply without tool calls is read as Search-R1's tags: the first
    complete ``<search>`` or ``<answer>``; none, or an empty search, calls no tool.
    """
    if reply.tool_calls:
        call = reply.tool_calls[0]
        arguments: Any = call.arguments
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return None, reply.text
        if call.name not in TOOLS or not isinstance(arguments, Mapping):
            return None, reply.text
        value = arguments.get(_ARGUMENT[call.name])
        if value is None and len(arguments) == 1:
            value = next(iter(arguments.values()))
        if not isinstance(value, str):
            return None, reply.text
        return call.name, value  # type: ignore[return-value]  # checked against TOOLS above
    parsed = parse_action(reply.text)
    if parsed.kind == "search":
        return "search", parsed.content
    if parsed.kind == "answer":
        return "answer", parsed.content
    return None, reply.text


async def play_conversation(
    view: SearchQAMessages,
    respond: Callable[[str], Awaitable[Reply | None]],
    question_id: str | None = None,
    seed: int | None = None,
) -> MessageTurn | None:
    """Plays one episode: the prompt to the model, each reply a turn, each turn's text back, to the end.

    Args:
        view: The episode.
        respond: Sends a user or tool message to the model and returns its reply (``None``: the model ended
            the conversation, e.g. a harness stopped it).
        question_id: The question (default: one drawn by ``view``).
        seed: Reseeds the view's draws (:meth:`~searchgym.envs.messages.SearchQAMessages.reset`).

    Returns:
        The last turn (its ``reward`` and ``end_reason``), or ``None`` when the model replied nothing.
    """
    message = view.reset(question_id, seed=seed)
    turn: MessageTurn | None = None
    while not view.done:
        reply = await respond(message)
        if reply is None:
            break
        tool, text = parse_reply(reply)
        turn = view.play(tool, text)
        message = turn.text
    return turn
