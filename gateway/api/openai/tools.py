"""The tool fields of a Chat Completions body: `tools`, `tool_choice`,
`parallel_tool_calls`, an assistant message's `tool_calls` and a `tool` message's
`tool_call_id`. Pure validation; every mistake is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from gateway.api import fields
from gateway.errors import invalid
from gateway.frontend.chat import ChatMessage
from gateway.tools.history import HistoryMistake, check_calls
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
    """OpenAI's rules for a tool history (gateway.tools.history), each broken one a 400
    naming the call's id (`messages[i].tool_calls[j].id`: a duplicate, an unanswered call)
    or the tool message (`messages[i].tool_call_id`: an answer to no open call)."""
    try:
        check_calls(messages)
    except HistoryMistake as mistake:
        if mistake.kind in ("duplicate", "unanswered"):
            where = f"messages[{mistake.message}].tool_calls[{mistake.call}].id"
        else:
            where = f"messages[{mistake.message}].tool_call_id"
        raise invalid(f"`{where}` {mistake}", where) from None
