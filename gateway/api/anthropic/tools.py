"""The tool fields of a Messages body: `tools`, `tool_choice`, `tool_use` blocks in assistant
messages and `tool_result` blocks (text and images) in user messages, and the tool changes of
system turns. Pure validation; every mistake is a 400 naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.api.anthropic.system import ToolChange
from gateway.errors import invalid
from gateway.frontend.chat import ChatMessage, Part
from gateway.tools.spec import (
    Tool,
    ToolCall,
    ToolChoice,
    ToolSet,
    check_named,
    check_tool,
    check_tools,
)

_CHOICES = "'auto', 'any', 'tool' (with `name`) or 'none'"


# Keys of a client tool this server reads or for which it needs nothing: `cache_control`
# (caching is automatic), `defer_loading` (every tool is offered from the start: there is no
# tool search to load it later), `eager_input_streaming` (arguments stream as they come).
_TOOL_KEYS = frozenset(
    {"name", "description", "input_schema", "type", "strict", "cache_control",
     "defer_loading", "eager_input_streaming"}
)  # fmt: skip


def parse_tools(
    body: dict[str, Any], changes: tuple[ToolChange, ...] = ()
) -> tuple[ToolSet | None, tuple[str, ...]]:
    """The request's tools (None: it offers none) after the system turns' tool `changes`,
    and the names of what was ignored: server tools (a `type` other than "custom": tools
    Anthropic runs, or whose schema only Anthropic knows) are dropped and named `tools[i]`,
    as are keys of a client tool with no meaning here (`input_examples`, ...)."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    if raw is not None and not isinstance(raw, list):
        raise invalid("`tools` must be an array of tools", "tools")
    offered: dict[str, Tool] = {}
    ignored: list[str] = []
    for i, entry in enumerate(raw or []):
        where = f"tools[{i}]"
        if not isinstance(entry, dict):
            raise invalid(f"`{where}` must be an object with `name` and `input_schema`", where)
        if entry.get("type", "custom") not in ("custom", None):
            ignored.append(where)
            continue
        _add(offered, client_tool(entry, where), f"{where}.name")
        ignored.extend(f"{where}.{key}" for key in entry if key not in _TOOL_KEYS)
    offered = _changed(offered, changes)
    if not offered:
        kind = choice.get("type") if isinstance(choice, dict) else None
        # `none` asks for no tools; `auto` neither, when the tools sent are all server tools
        if choice is not None and kind != "none" and not (kind == "auto" and raw):
            raise invalid("`tool_choice` requires `tools` (client tools this server offers)",
                          "tool_choice")  # fmt: skip
        return None, tuple(ignored)
    checked = check_tools(list(offered.values()), "tools")
    mode, parallel = _choice(choice)
    check_named(mode, checked, "tool_choice.name")
    return ToolSet(checked, mode, parallel), tuple(ignored)


def client_tool(entry: dict[str, Any], where: str) -> Tool:
    """A client tool (`name`, `input_schema`, `description`, `strict`) at `where`."""
    if not isinstance(entry.get("input_schema"), dict):
        raise invalid(f"`{where}.input_schema` must be a JSON Schema object", where)
    return check_tool(
        entry.get("name"),
        entry.get("description"),
        entry["input_schema"],
        entry.get("strict"),
        where,
        "input_schema",
    )


def _add(offered: dict[str, Tool], tool: Tool, where: str) -> None:
    if tool.name in offered:
        raise invalid(f"`{where}`: {tool.name!r} is defined twice", where)
    offered[tool.name] = tool


def _changed(declared: dict[str, Tool], changes: tuple[ToolChange, ...]) -> dict[str, Tool]:
    """The tools offered after the system turns' additions and removals (declared ones in
    their order, then inline ones). A tool withdrawn and not offered again is not offered;
    one added (by reference or inline) is offered from the start of the prompt (templates
    render tools there)."""
    known = dict(declared)  # every tool a reference may name
    offered = set(declared)
    for change in changes:
        if change.definition is not None:
            tool = client_tool(change.definition, change.where)
            _add(known, tool, f"{change.where}.name")
            offered.add(tool.name)
        elif change.name not in known:
            where = f"{change.where}.tool.name"
            raise invalid(f"`{where}`: {change.name!r} is not one of the request's tools", where)
        elif change.added:
            offered.add(change.name)
        else:
            offered.discard(change.name)
    return {name: tool for name, tool in known.items() if name in offered}


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
