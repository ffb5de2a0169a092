"""The tool fields of a Messages body: `tools`, `tool_choice`, `tool_use` blocks in assistant
messages and `tool_result` blocks (text and images) in user messages. Pure validation; every
mistake is a 400 naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.errors import invalid
from gateway.frontend.chat import ChatMessage, Part
from gateway.tools.spec import ToolCall, ToolChoice, ToolSet, check_named, check_tool, check_tools

_CHOICES = "'auto', 'any', 'tool' (with `name`) or 'none'"


def parse_tools(body: dict[str, Any]) -> ToolSet | None:
    """The request's tools (None: it offers none). Server tools (a `type` other than
    "custom") are refused, naming the tool."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    if raw is None or raw == []:
        if choice is not None and not (isinstance(choice, dict) and choice.get("type") == "none"):
            raise invalid("`tool_choice` requires `tools`", "tool_choice")
        return None
    if not isinstance(raw, list):
        raise invalid("`tools` must be an array of tools", "tools")
    tools = []
    for i, entry in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(entry, dict):
            raise invalid(f"`{where}` must be an object with `name` and `input_schema`", where)
        if entry.get("type", "custom") != "custom":
            raise invalid(
                f"`{where}.type`: server tools ({entry.get('type')!r}) are not supported by "
                "this server; send client tools (`name`, `input_schema`)",
                f"{where}.type",
            )
        if not isinstance(entry.get("input_schema"), dict):
            raise invalid(f"`{where}.input_schema` must be a JSON Schema object", where)
        tools.append(
            check_tool(
                entry.get("name"),
                entry.get("description"),
                entry["input_schema"],
                entry.get("strict"),
                where,
                "input_schema",
            )
        )
    checked = check_tools(tools, "tools")
    mode, parallel = _choice(choice)
    check_named(mode, checked, "tool_choice.name")
    return ToolSet(checked, mode, parallel)


def _choice(raw: Any) -> tuple[ToolChoice, bool]:
    if raw is None:
        return ToolChoice("auto"), True
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise invalid(f"`tool_choice.type` must be {_CHOICES}", "tool_choice.type")
    disable = raw.get("disable_parallel_tool_use", False)
    if not isinstance(disable, bool):
        raise invalid(
            "`tool_choice.disable_parallel_tool_use` must be true or false",
            "tool_choice.disable_parallel_tool_use",
        )
    if kind == "tool":
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise invalid("`tool_choice.name` must be a string", "tool_choice.name")
        return ToolChoice("named", name), not disable
    return ToolChoice({"any": "required"}.get(kind, kind)), not disable


def tool_use(block: dict[str, Any], at: str) -> ToolCall:
    """An assistant's `tool_use` block."""
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"`{at}.id` must be a non-empty string", f"{at}.id")
    if not isinstance(name, str) or not name:
        raise invalid(f"`{at}.name` must be a string", f"{at}.name")
    if not isinstance(arguments, dict):
        raise invalid(f"`{at}.input` must be an object", f"{at}.input")
    return ToolCall(call_id, name, json.dumps(arguments, ensure_ascii=False))


def tool_result(
    block: dict[str, Any], at: str, made: dict[str, str], parts: tuple[Part, ...]
) -> ChatMessage:
    """A user's `tool_result` block as a `tool` message; `made` maps the ids of the calls the
    assistant message just before made to their names (the only calls a result may answer),
    `parts` is the block's content parsed (text and images)."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"`{at}.tool_use_id` is required: the id of the tool_use block it answers",
                      f"{at}.tool_use_id")  # fmt: skip
    if call_id not in made:
        raise invalid(
            f"`{at}.tool_use_id` {call_id!r} matches no tool_use block of the assistant "
            "message just before it",
            f"{at}.tool_use_id",
        )
    return ChatMessage("tool", parts, tool_call_id=call_id, name=made[call_id])
