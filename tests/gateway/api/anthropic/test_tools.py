"""The tool fields of a Messages body (gateway.api.anthropic.tools).

Pinned: server tools (web search, bash, text editor, code execution, web fetch, memory, tool
search, MCP toolsets) are dropped from the prompt and named `tools[i]`, never a 400 (a
`tool_choice` that needs a tool then has none: 400); a `defer_loading` tool is offered like
any other; the keys Claude Code and the SDK send (`cache_control`, `defer_loading`, `strict`,
`eager_input_streaming`, `type: "custom"`) are read or need nothing, `strict` closes the
schema, others (`input_examples`, ...) are named; a duplicate name is named at its own index;
a system turn's `tool_addition` offers a tool and `tool_removal` withdraws one.
"""

from __future__ import annotations

import json

import pytest

from gateway.api.anthropic.parse import parse_messages_request
from gateway.errors import APIError

USER = {"role": "user", "content": "hi"}
BASE = {"model": "m", "max_tokens": 5, "messages": [USER]}
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}
SERVER_TOOLS = [
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
    {"type": "bash_20250124", "name": "bash"},
    {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    {"type": "code_execution_20250825", "name": "code_execution"},
    {"type": "web_fetch_20250910", "name": "web_fetch"},
    {"type": "memory_20250818", "name": "memory"},
    {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"},
    {"type": "mcp_toolset", "mcp_server_name": "x"},
]


def _parse(**fields: object):
    return parse_messages_request({**BASE, **fields})


def test_server_tools_are_dropped_and_named() -> None:
    custom = {"type": "custom", "name": "f", "input_schema": SCHEMA}
    r = _parse(tools=[*SERVER_TOOLS, custom])
    assert r.tools is not None and [t.name for t in r.tools.tools] == ["f"]
    assert r.ignored_fields == tuple(f"tools[{i}]" for i in range(len(SERVER_TOOLS)))
    only = _parse(tools=SERVER_TOOLS[:2], tool_choice={"type": "auto"})
    assert only.tools is None and only.ignored_fields == ("tools[0]", "tools[1]")
    with pytest.raises(APIError) as info:
        _parse(tools=SERVER_TOOLS[:1], tool_choice={"type": "any"})
    assert info.value.param == "tool_choice"


def test_per_tool_keys() -> None:
    """Invariant: the keys with no effect here are accepted unnamed, `strict` closes the
    schema's objects, other keys are named; a deferred tool is offered."""
    tool = {"name": "f", "input_schema": SCHEMA, "cache_control": {"type": "ephemeral"},
            "defer_loading": True, "eager_input_streaming": True, "strict": True,
            "input_examples": [{"a": "x"}], "allowed_callers": ["direct"]}  # fmt: skip
    r = _parse(tools=[tool])
    assert r.tools is not None and r.tools.tools[0].name == "f"
    assert json.loads(r.tools.tools[0].parameters_json)["additionalProperties"] is False
    assert r.ignored_fields == ("tools[0].input_examples", "tools[0].allowed_callers")
    loose = _parse(tools=[{"name": "f", "input_schema": SCHEMA}])
    assert loose.tools is not None and "additionalProperties" not in loose.tools.tools[0].parameters


def test_a_duplicate_is_named_at_its_own_index() -> None:
    tool = {"name": "f", "input_schema": SCHEMA}
    with pytest.raises(APIError) as info:
        _parse(tools=[tool, SERVER_TOOLS[0], tool])
    assert info.value.param == "tools[2].name"


def _change(kind: str, tool: dict) -> dict:
    return {"role": "system", "content": [{"type": kind, "tool": tool}]}


def test_tool_additions_and_removals() -> None:
    f, g = {"name": "f", "input_schema": SCHEMA}, {"name": "g", "input_schema": SCHEMA}
    added = _parse(tools=[f], messages=[USER, _change("tool_addition",
                   {"type": "tool_definition", "definition": g})])  # fmt: skip
    assert added.tools is not None and [t.name for t in added.tools.tools] == ["f", "g"]
    removal = _change("tool_removal", {"type": "tool_reference", "name": "f"})
    gone = _parse(tools=[f, g], messages=[USER, removal])
    assert gone.tools is not None and [t.name for t in gone.tools.tools] == ["g"]
    back = _change("tool_addition", {"type": "tool_reference", "name": "f"})
    again = _parse(tools=[f, g], messages=[removal, back, USER])
    assert again.tools is not None and [t.name for t in again.tools.tools] == ["f", "g"]
    mcp = _change("tool_addition", {"type": "mcp_tool_reference", "name": "x"})
    assert _parse(tools=[f], messages=[USER, mcp]).ignored_fields == ("messages[1].content[0]",)


@pytest.mark.parametrize(
    ("tool", "kind", "param"),
    [
        ({"type": "tool_reference", "name": "nope"}, "tool_addition",
         "messages[1].content[0].tool.name"),
        ({"type": "tool_definition", "definition": {"name": "f", "input_schema": SCHEMA}},
         "tool_addition", "messages[1].content[0].tool.definition.name"),
        ({"type": "tool_definition", "definition": {"name": "g"}}, "tool_addition",
         "messages[1].content[0].tool.definition"),
        ({"type": "tool_definition", "definition": {"name": "g"}}, "tool_removal",
         "messages[1].content[0].tool.type"),
    ],
)  # fmt: skip
def test_tool_change_mistakes_name_the_block(tool: dict, kind: str, param: str) -> None:
    f = {"name": "f", "input_schema": SCHEMA}
    with pytest.raises(APIError) as info:
        _parse(tools=[f], messages=[USER, _change(kind, tool)])
    assert info.value.param == param
