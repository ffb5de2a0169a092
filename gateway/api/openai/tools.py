"""The tool fields of a Chat Completions body: `tools`, `tool_choice`,
`parallel_tool_calls`, an assistant message's `tool_calls` and a `tool` message's
`tool_call_id`. Pure validation; every mistake is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from gateway.api import fields
from gateway.errors import invalid
from gateway.frontend.chat import ChatMessage
from gateway.tools.spec import ToolCall, ToolChoice, ToolSet, check_named, check_tool, check_tools

_CHOICES = '\'none\', \'auto\', \'required\' or {"type": "function", "function": {"name": ...}}'


def parse_tools(body: dict[str, Any]) -> ToolSet | None:
    """The request's tools (None: it offers none). `functions` (the deprecated form) is
    refused, naming `tools` as what to send instead."""
    if body.get("functions") is not None:
        raise invalid("`functions` is deprecated; send `tools` instead", "functions")
    raw, choice = body.get("tools"), body.get("tool_choice")
    if raw is None or raw == []:
        if choice not in (None, "none"):
            raise invalid("`tool_choice` is only allowed when `tools` are given", "tool_choice")
        return None
    if not isinstance(raw, list):
        raise invalid("`tools` must be an array of function tools", "tools")
    tools = []
    for i, entry in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(entry, dict) or entry.get("type") != "function":
            raise invalid(f'`{where}.type` must be "function"', f"{where}.type")
        function = entry.get("function")
        at = f"{where}.function"
        if not isinstance(function, dict):
            raise invalid(f"`{at}` must be an object with `name` and `parameters`", at)
        tools.append(
            check_tool(
                function.get("name"),
                function.get("description"),
                function.get("parameters"),
                function.get("strict"),
                at,
                "parameters",
            )
        )
    checked = check_tools(tools, "tools", "function.name")
    mode = _choice(choice)
    check_named(mode, checked, "tool_choice.function.name")
    return ToolSet(checked, mode, fields.opt_bool(body, "parallel_tool_calls", True))


def _choice(raw: Any) -> ToolChoice:
    if raw is None:
        return ToolChoice("auto")
    if raw in ("none", "auto", "required"):
        return ToolChoice(raw)
    if isinstance(raw, dict) and raw.get("type") == "function":
        function = raw.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise invalid("`tool_choice.function.name` must be a string", "tool_choice.function")
        return ToolChoice("named", name)
    raise invalid(f"`tool_choice` must be {_CHOICES}", "tool_choice")


def tool_calls(raw: Any, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's `tool_calls` (absent: none)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise invalid(f"`{where}` must be an array of tool calls", where)
    calls = []
    for i, call in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(call, dict):
            raise invalid(f"`{at}` must be an object with `id` and `function`", at)
        call_id, function = call.get("id"), call.get("function")
        if not isinstance(call_id, str) or not call_id:
            raise invalid(f"`{at}.id` must be a non-empty string", f"{at}.id")
        if call.get("type", "function") != "function":
            raise invalid(f'`{at}.type` must be "function" (the only kind of call here)',
                          f"{at}.type")  # fmt: skip
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise invalid(f"`{at}.function.name` must be a string", f"{at}.function.name")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            raise invalid(
                f"`{at}.function.arguments` must be a JSON string (the arguments object "
                "serialized, as the API returned it)",
                f"{at}.function.arguments",
            )
        calls.append(ToolCall(call_id, function["name"], fields.text(arguments, at)))
    return tuple(calls)


def check_call_ids(messages: tuple[ChatMessage, ...]) -> None:
    """OpenAI's rules for a tool history (each a 400 naming the field): call ids are unique;
    an assistant message with `tool_calls` is followed by one tool message per call, each
    answering one of those calls, before any other message (an agent that drops a result,
    answers a call twice or sends a result out of place fails here as on OpenAI's API)."""
    made: set[str] = set()
    open_calls: dict[str, str] = {}  # the last assistant turn's unanswered calls -> id field
    for i, message in enumerate(messages):
        if open_calls and message.role != "tool":
            _unanswered(open_calls)
        for j, call in enumerate(message.tool_calls):
            where = f"messages[{i}].tool_calls[{j}].id"
            if call.id in made:
                raise invalid(f"`{where}` {call.id!r} is the id of an earlier call", where)
            made.add(call.id)
            open_calls[call.id] = where
        if message.role == "tool":
            call_id, where = message.tool_call_id, f"messages[{i}].tool_call_id"
            if call_id not in open_calls:
                why = "was answered already" if call_id in made else "matches no tool call"
                raise invalid(
                    f"`{where}` {call_id!r} {why}: a tool message answers a call of the "
                    "assistant message just before it",
                    where,
                )
            del open_calls[call_id]
    if open_calls:
        _unanswered(open_calls)


def _unanswered(open_calls: dict[str, str]) -> None:
    """400 naming the first call of `open_calls` (id -> its field) that got no answer."""
    call_id, where = next(iter(open_calls.items()))
    raise invalid(
        f"`{where}` {call_id!r} has no answer: an assistant message with `tool_calls` must be "
        "followed by a tool message answering each call before any other message",
        where,
    )
