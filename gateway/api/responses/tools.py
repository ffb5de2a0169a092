"""The tool fields of a Responses body: function `tools` (flat: `{type, name, description,
parameters, strict}`), `tool_choice`, `parallel_tool_calls`, and the `function_call` /
`function_call_output` input items. Pure validation; every mistake is a 400 naming the field.

A function tool's `strict` defaults to true, as OpenAI's Responses API does (its objects are
closed). Built-in tools (web search, file search, computer use, MCP, ...) are refused naming
the tool's `type`. A `function_call_output` names its call by `call_id`; whether that call was
made (in this input or in the stored conversation) is checked by `link_outputs` once the
stored conversation is known.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gateway.api import fields
from gateway.errors import invalid
from gateway.frontend.chat import ChatMessage, Part, TextPart
from gateway.tools.history import HistoryMistake, check_calls
from gateway.tools.spec import ToolCall, ToolChoice, ToolSet, check_named, check_tool, check_tools

_CHOICES = "'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}"


def parse_tools(body: dict[str, Any]) -> tuple[ToolSet | None, list[dict[str, Any]]]:
    """The request's tools (None: none) and their echo for the response body (each tool with
    its defaults filled in, as OpenAI echoes them)."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    if raw is None or raw == []:
        if choice not in (None, "none", "auto"):
            raise invalid("`tool_choice` is only allowed when `tools` are given", "tool_choice")
        return None, []
    if not isinstance(raw, list):
        raise invalid("`tools` must be an array of function tools", "tools")
    tools, echo = [], []
    for i, entry in enumerate(raw):
        where = f"tools[{i}]"
        kind = entry.get("type") if isinstance(entry, dict) else None
        if kind != "function":
            raise invalid(
                f"`{where}.type` {kind!r}: only function tools are supported by this server "
                "(built-in tools are not)",
                f"{where}.type",
            )
        if isinstance(entry.get("function"), dict) and "name" not in entry:
            raise invalid(
                f"`{where}`: the Responses API takes function tools flat: move `name`, "
                "`description` and `parameters` out of `function` to the tool itself",
                f"{where}.function",
            )
        strict = entry.get("strict")
        strict = True if strict is None else strict
        tool = check_tool(
            entry.get("name"), entry.get("description"), entry.get("parameters"), strict, where,
            "parameters",
        )  # fmt: skip
        tools.append(tool)
        echo.append(
            {
                "type": "function",
                "name": tool.name,
                "description": entry.get("description"),
                "parameters": entry.get("parameters"),
                "strict": strict,
            }
        )
    checked = check_tools(tools, "tools")
    mode = _choice(choice)
    check_named(mode, checked, "tool_choice.name")
    return ToolSet(checked, mode, fields.opt_bool(body, "parallel_tool_calls", True)), echo


def _choice(raw: Any) -> ToolChoice:
    if raw is None:
        return ToolChoice("auto")
    if raw in ("none", "auto", "required"):
        return ToolChoice(raw)
    if isinstance(raw, dict) and raw.get("type") == "function":
        name = raw.get("name")
        if isinstance(raw.get("function"), dict) and name is None:
            raise invalid(
                '`tool_choice`: the Responses API names the function flat: {"type": '
                '"function", "name": ...}, not inside `function`',
                "tool_choice.function",
            )
        if not isinstance(name, str) or not name:
            raise invalid("`tool_choice.name` must be a string", "tool_choice.name")
        return ToolChoice("named", name)
    raise invalid(f"`tool_choice` must be {_CHOICES}", "tool_choice")


def function_call(item: dict[str, Any], where: str) -> ToolCall:
    """A `function_call` input item (a call the model made, sent back by the client)."""
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"`{where}.call_id` must be a non-empty string", f"{where}.call_id")
    if not isinstance(name, str) or not name:
        raise invalid(f"`{where}.name` must be a string", f"{where}.name")
    if not isinstance(arguments, str):
        raise invalid(f"`{where}.arguments` must be a JSON string", f"{where}.arguments")
    return ToolCall(call_id, name, fields.text(arguments, f"{where}.arguments"))


def output_call_id(item: dict[str, Any], where: str) -> str:
    """The `call_id` of a `function_call_output` item."""
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"`{where}.call_id` must be a non-empty string", f"{where}.call_id")
    return call_id


def with_calls(messages: list[ChatMessage], call: ToolCall) -> None:
    """Append `call` to the conversation: onto the assistant message just before it (its
    text, or calls already made in the same answer), else as a new assistant message."""
    if messages and messages[-1].role == "assistant":
        last = messages[-1]
        messages[-1] = replace(last, tool_calls=(*last.tool_calls, call))
    else:
        messages.append(ChatMessage("assistant", (TextPart(""),), (call,)))


def tool_message(call_id: str, parts: tuple[Part, ...]) -> ChatMessage:
    """A `function_call_output` as a tool message (its function's name set by
    `link_outputs`)."""
    return ChatMessage("tool", parts, tool_call_id=call_id)


def link_outputs(
    history: Sequence[ChatMessage], new: Sequence[ChatMessage], params: Sequence[str]
) -> tuple[ChatMessage, ...]:
    """`new` with each tool message named after the call it answers, once the whole
    conversation (`history`, then `new`) keeps OpenAI's rules (gateway.tools.history; a
    continued response's calls are answered by this input): else a 400 naming the output's
    `call_id` (`params`: those of `new`'s tool messages, in order) or `input`."""
    try:
        check_calls((*history, *new))
    except HistoryMistake as mistake:
        where = "input"
        if mistake.kind in ("answered", "unknown") and mistake.message >= len(history):
            tools = [i for i, m in enumerate(new) if m.role == "tool"]
            where = params[tools.index(mistake.message - len(history))]
        raise invalid(f"`{where}` {mistake} (of this input or of the conversation continued "
                      "by `previous_response_id`)", where) from None  # fmt: skip
    names = {call.id: call.name for m in (*history, *new) for call in m.tool_calls}
    return tuple(
        replace(m, name=names[m.tool_call_id or ""]) if m.role == "tool" else m for m in new
    )
