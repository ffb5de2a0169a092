"""The tool items of a Responses `input`: `function_call` (its `namespace`, if any, joined
to the flat name the model saw: gateway.api.responses.tool_list), `custom_tool_call` (its
`input` as the one argument of the function the model saw), and their outputs
(`function_call_output`, `custom_tool_call_output`). Pure validation; every mistake is a 400
naming the field. An output names its call by `call_id`; whether that call was made (in this
input or in the stored conversation) is checked by `link_outputs` once the stored
conversation is known.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gateway.api import fields
from gateway.api.responses.tool_list import flat_name
from gateway.errors import invalid
from gateway.frontend.chat import ChatMessage, Part, TextPart
from gateway.tools.history import HistoryMistake, check_calls
from gateway.tools.spec import ToolCall


def function_call(item: dict[str, Any], where: str) -> ToolCall:
    """A `function_call` or `custom_tool_call` input item (a call the model made, sent back
    by the client), as the call the model wrote: under its flat name, a custom tool's
    `input` as the `{"input": ...}` arguments."""
    call_id, name = item.get("call_id"), item.get("name")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"`{where}.call_id` must be a non-empty string", f"{where}.call_id")
    if not isinstance(name, str) or not name:
        raise invalid(f"`{where}.name` must be a string", f"{where}.name")
    namespace = item.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or not namespace):
        raise invalid(f"`{where}.namespace` must be a non-empty string", f"{where}.namespace")
    if item.get("type") == "custom_tool_call":
        if not isinstance(item.get("input"), str):
            raise invalid(f"`{where}.input` must be a string", f"{where}.input")
        arguments = json.dumps({"input": fields.text(item["input"], f"{where}.input")})
    else:
        arguments = item.get("arguments")
        if not isinstance(arguments, str):
            raise invalid(f"`{where}.arguments` must be a JSON string", f"{where}.arguments")
        arguments = fields.text(arguments, f"{where}.arguments")
    return ToolCall(call_id, flat_name(namespace, name) if namespace else name, arguments)


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
