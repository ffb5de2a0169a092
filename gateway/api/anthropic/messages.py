"""The `messages` array of a Messages body -> chat messages, in order.

A user message's `tool_result` blocks become `tool` messages (then the rest of its content a
user message), an assistant's `tool_use` blocks its calls and its `thinking` blocks its
earlier thinking, a `role: "system"` message a system turn where it stands
(gateway.api.anthropic.system). As on Anthropic's API, every `tool_use` gets one
`tool_result` in the next user or assistant message (system turns between them do not
count), before its other content, and a result answers only the message just before it. A
final assistant message is split off as the prefill. Pure; every mistake is a 400 naming
the message or block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.api.anthropic.content import content, content_blocks
from gateway.api.anthropic.system import SystemTurn, ToolChange, system_turn
from gateway.api.anthropic.thinking import thinking_text
from gateway.api.anthropic.tools import tool_result, tool_use
from gateway.errors import invalid
from gateway.frontend.chat import ChatMessage, TextPart


@dataclass(frozen=True)
class Conversation:
    """The messages (system turns in place), the prefill, the tool changes the system turns
    make (in order), the effort a system turn after the last user message sets for this
    answer, and the fields named as ignored."""

    messages: tuple[ChatMessage, ...]
    prefill: str
    tool_changes: tuple[ToolChange, ...] = ()
    effort: Any = None
    ignored: tuple[str, ...] = ()


def conversation(raw: Any) -> Conversation:
    """The `messages` field."""
    if not isinstance(raw, list) or not raw:
        raise invalid("`messages` must be a non-empty array", "messages")
    out: list[ChatMessage] = []
    turns: list[SystemTurn] = []
    last_user = max((i for i, m in enumerate(raw) if _role(m) == "user"), default=-1)
    # The previous message's tool_use ids -> their tools' names: as on Anthropic's API, the
    # next message answers each with a tool_result, and results answer nothing else.
    pending: dict[str, str] = {}
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise invalid(f"`{where}` must be an object with `role` and `content`", where)
        role = msg.get("role")
        if role not in ("user", "assistant", "system"):
            raise invalid(
                f"`{where}.role` must be 'user', 'assistant' or 'system'", f"{where}.role"
            )
        if role == "system":
            turn = system_turn(msg, where, i, followed_by_user=i < last_user)
            turns.append(turn)
            out.extend(turn.messages)
            continue
        if msg.get("clear_at") is not None:
            raise invalid(f"`{where}.clear_at` is only permitted on system messages",
                          f"{where}.clear_at")  # fmt: skip
        messages = _message(msg.get("content"), f"{where}.content", role, pending)
        answered = {m.tool_call_id for m in messages if m.role == "tool"}
        if pending.keys() - answered:
            _unanswered(where, pending.keys() - answered)
        out.extend(messages)
        pending = {c.id: c.name for m in messages for c in m.tool_calls}
    if pending:  # the last message's tool_use blocks: answered by nothing
        _unanswered(f"messages[{len(raw) - 1}]", pending.keys())
    prefill = ""
    if out[-1].role == "assistant" and not out[-1].tool_calls:
        last = out.pop()
        prefill = "".join(p.text for p in last.parts if isinstance(p, TextPart))
    if all(m.role == "system" for m in out):
        raise invalid("`messages` must contain a user message", "messages")
    efforts = [t.effort for t in turns if t.effort is not None and t.index > last_user]
    return Conversation(
        tuple(out),
        prefill,
        tuple(c for t in turns for c in t.tool_changes),
        efforts[-1] if efforts else None,
        tuple(name for t in turns for name in t.ignored),
    )


def _role(msg: Any) -> Any:
    return msg.get("role") if isinstance(msg, dict) else None


def _unanswered(where: str, ids: Any) -> None:
    """400 naming the message `where` that should have answered (or, the last one, that
    asked) the tool_use blocks `ids` that have no tool_result."""
    listed = ", ".join(sorted(ids))
    raise invalid(
        f"`{where}`: tool_use ids were found without tool_result blocks immediately after: "
        f"{listed}; each tool_use block needs a tool_result in the next (user) message",
        where,
    )


def _message(raw: Any, where: str, role: str, made: dict[str, str]) -> list[ChatMessage]:
    """One user or assistant message as chat messages: an assistant's text with its
    `tool_use` calls; a user's `tool_result` blocks as `tool` messages (in order), then the
    rest of its content as a user message (if any)."""
    if not isinstance(raw, list):
        return [ChatMessage(role, content(raw, where, role))]
    results: list[ChatMessage] = []
    calls = []
    rest: list[Any] = []
    thoughts: list[str] = []
    for j, block in enumerate(raw):
        at = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use" and role == "assistant":
            calls.append(tool_use(block, at))
            if any(c.id == calls[-1].id for c in calls[:-1]):
                raise invalid(
                    f"`{at}.id` {calls[-1].id!r} is the id of another tool_use", f"{at}.id"
                )
        elif kind == "tool_result" and role == "user":
            if rest:  # as Anthropic's API: the results first, then any other content
                message = f"`{at}`: tool_result blocks must come before any other content"
                raise invalid(message, at)
            body = block.get("content", "")
            parts = content(body, f"{at}.content", "tool") if body != [] else ()
            results.append(tool_result(block, at, made, parts))
            if any(r.tool_call_id == results[-1].tool_call_id for r in results[:-1]):
                where_id = f"{at}.tool_use_id"
                raise invalid(f"`{where_id}`: this tool_use was answered already", where_id)
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            thoughts.append(thinking_text(block, at))
        elif kind in ("tool_use", "tool_result", "thinking", "redacted_thinking"):
            raise invalid(f"`{at}`: {kind} blocks belong in {role!r} messages", f"{at}.type")
        else:
            rest.append((j, block))
    out = results
    if rest or not results:
        parts = content_blocks(rest, where, role)
        out.append(ChatMessage(role, parts, tuple(calls), reasoning="".join(thoughts)))
    return out
