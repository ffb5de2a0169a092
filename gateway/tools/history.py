"""OpenAI's rules for the tool calls of a conversation, whatever API it came through.

Call ids are unique; an assistant message's calls are each answered by one tool message
before any other message (or the end); a tool message answers an open call of the assistant
message before it. OpenAI's APIs refuse a history that breaks one, so an agent written
against this gateway must not get a 200 for it here. Each API turns a `HistoryMistake` into
a 400 naming its own field (Chat Completions: `messages[i]...`, Responses: `input...`).

Pure: walks `ChatMessage`s, raises or returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.frontend.chat import ChatMessage

Kind = Literal["duplicate", "unanswered", "answered", "unknown"]


@dataclass(frozen=True)
class HistoryMistake(Exception):
    """`kind` of mistake about `call_id`: "duplicate" (a second call with that id) and
    "unanswered" (no tool message for it) point at the call, `messages[message].tool_calls
    [call]`; "answered" (a second answer) and "unknown" (no such open call) at the tool
    message `messages[message]`."""

    kind: Kind
    call_id: str
    message: int
    call: int = -1

    def __str__(self) -> str:
        return {
            "duplicate": f"{self.call_id!r} is the id of an earlier call",
            "unanswered": f"{self.call_id!r} has no answer: an assistant message's calls are "
            "each answered by a tool message before any other message",
            "answered": f"{self.call_id!r} was answered already",
            "unknown": f"{self.call_id!r} matches no call of the assistant message before it",
        }[self.kind]


def check_calls(messages: Sequence[ChatMessage]) -> None:
    """Raise the first `HistoryMistake` of `messages`, in order (module doc)."""
    made: set[str] = set()
    open_calls: dict[str, tuple[int, int]] = {}  # unanswered call id -> (message, call)
    for i, message in enumerate(messages):
        if open_calls and message.role != "tool":
            raise _unanswered(open_calls)
        for j, call in enumerate(message.tool_calls):
            if call.id in made:
                raise HistoryMistake("duplicate", call.id, i, j)
            made.add(call.id)
            open_calls[call.id] = (i, j)
        if message.role == "tool":
            call_id = message.tool_call_id or ""
            if call_id not in open_calls:
                raise HistoryMistake("answered" if call_id in made else "unknown", call_id, i)
            del open_calls[call_id]
    if open_calls:
        raise _unanswered(open_calls)


def _unanswered(open_calls: dict[str, tuple[int, int]]) -> HistoryMistake:
    call_id, (message, call) = next(iter(open_calls.items()))
    return HistoryMistake("unanswered", call_id, message, call)
