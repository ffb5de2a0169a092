"""`context_management` edits (gateway.api.anthropic.context), applied by the parser.

Pinned: clear_thinking_20251015 drops the thinking of every assistant turn but the last N
(`keep: "all"` drops none); clear_tool_uses_20250919, once its trigger (tool uses or
estimated input tokens) is passed, replaces the results of all but the last `keep` tool uses
with a placeholder (never those of `exclude_tools`; with `clear_tool_inputs` their calls'
inputs become {}), and clears nothing when that would free fewer than `clear_at_least`
tokens; each edit that cleared something is reported as Anthropic reports it, the response's
`context_management` is there whenever the body asked for edits; an unknown edit is ignored
and named; malformed edits are 400s naming the field.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.api.anthropic.context import PLACEHOLDER
from gateway.api.anthropic.parse import parse_messages
from gateway.errors import APIError
from gateway.frontend.chat import TextPart

TOOL = {"name": "f", "input_schema": {"type": "object"}}
KEEP = {"name": "keep", "input_schema": {"type": "object"}}


def _turns(*tools: str, thinking: bool = False) -> list[dict[str, Any]]:
    """A conversation in which the assistant calls each tool of `tools` in turn."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for i, name in enumerate(tools):
        call = {"type": "tool_use", "id": f"t{i}", "name": name, "input": {"n": "x" * 40}}
        thought = [{"type": "thinking", "thinking": f"plan {i}", "signature": ""}]
        messages.append({"role": "assistant", "content": [*(thought if thinking else []), call]})
        result = {"type": "tool_result", "tool_use_id": f"t{i}", "content": "y" * 400}
        messages.append({"role": "user", "content": [result]})
    return messages


def _parse(messages: list, *edits: dict) -> Any:
    body = {"model": "m", "max_tokens": 5, "messages": messages, "tools": [TOOL, KEEP],
            "context_management": {"edits": list(edits)}}  # fmt: skip
    return parse_messages(body)


def _results(r: Any) -> list[str]:
    return [m.parts[0].text for m in r.chat.messages if m.role == "tool"]


def test_clear_thinking_keeps_the_last_turns() -> None:
    messages = _turns("f", "f", "f", thinking=True)
    two = {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}}
    r = _parse(messages, two)
    thoughts = [m.reasoning for m in r.chat.messages if m.role == "assistant"]
    assert thoughts == ["", "plan 1", "plan 2"]
    assert r.context_management == {"applied_edits": [
        {"type": "clear_thinking_20251015", "cleared_thinking_turns": 1,
         "cleared_input_tokens": 2}]}  # fmt: skip
    assert r.unedited is not None and r.unedited.messages[1].reasoning == "plan 0"
    default = _parse(messages, {"type": "clear_thinking_20251015"})
    assert [m.reasoning for m in default.chat.messages if m.role == "assistant"][-2:] == [
        "", "plan 2"]  # fmt: skip
    kept = _parse(messages, {"type": "clear_thinking_20251015", "keep": "all"})
    assert kept.context_management == {"applied_edits": []} and kept.unedited is None
    assert kept.chat == _parse(messages).chat


def test_clear_tool_uses_after_its_trigger() -> None:
    messages = _turns("f", "keep", "f", "f", "f")
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 4},
            "keep": {"type": "tool_uses", "value": 2}, "exclude_tools": ["keep"]}  # fmt: skip
    r = _parse(messages, edit)
    assert _results(r) == [PLACEHOLDER, "y" * 400, PLACEHOLDER, "y" * 400, "y" * 400]
    (report,) = r.context_management["applied_edits"]
    assert report["type"] == "clear_tool_uses_20250919" and report["cleared_tool_uses"] == 2
    assert report["cleared_input_tokens"] > 150
    calls = [c.arguments for m in r.chat.messages for c in m.tool_calls]
    assert all(a != "{}" for a in calls)  # inputs stay without clear_tool_inputs
    not_yet = _parse(messages, {**edit, "trigger": {"type": "tool_uses", "value": 5}})
    assert not_yet.context_management == {"applied_edits": []}
    too_little = {**edit, "clear_at_least": {"type": "input_tokens", "value": 10_000}}
    assert _results(_parse(messages, too_little)) == ["y" * 400] * 5


def test_clear_tool_inputs_and_the_token_trigger() -> None:
    messages = _turns("f", "keep", "f")
    edit = {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": 1},
            "trigger": {"type": "input_tokens", "value": 200},
            "clear_tool_inputs": ["keep"]}  # fmt: skip
    r = _parse(messages, edit)
    assert _results(r) == [PLACEHOLDER, PLACEHOLDER, "y" * 400]
    calls = {c.name + c.id: c.arguments for m in r.chat.messages for c in m.tool_calls}
    assert calls["keept1"] == "{}" and calls["ft0"] != "{}"
    everything = _parse(messages, {**edit, "clear_tool_inputs": True})
    assert [c.arguments for m in everything.chat.messages for c in m.tool_calls][:2] == [
        "{}", "{}"]  # fmt: skip
    small = _parse(messages, {**edit, "trigger": {"type": "input_tokens", "value": 100_000}})
    assert all(isinstance(p, TextPart) and p.text == "y" * 400
               for m in small.chat.messages if m.role == "tool" for p in m.parts)  # fmt: skip


def test_unknown_edits_are_named_and_no_context_management_reports_nothing() -> None:
    r = _parse(_turns("f"), {"type": "compact_20260112"},
               {"type": "clear_thinking_20251015", "keep": "all", "extra": 1})  # fmt: skip
    assert r.chat.ignored_fields == (
        "context_management.edits[0]", "context_management.edits[1].extra")  # fmt: skip
    body = {"model": "m", "max_tokens": 5, "messages": _turns("f"), "tools": [TOOL]}
    assert parse_messages(body).context_management is None


@pytest.mark.parametrize(
    ("edit", "param"),
    [
        ({"keep": 3}, "context_management.edits[0].type"),
        ({"type": "clear_thinking_20251015", "keep": 2}, "context_management.edits[0].keep"),
        ({"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": -1}},
         "context_management.edits[0].keep.value"),
        ({"type": "clear_tool_uses_20250919", "trigger": {"type": "turns", "value": 1}},
         "context_management.edits[0].trigger"),
        ({"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses"}},
         "context_management.edits[0].keep.value"),
        ({"type": "clear_tool_uses_20250919", "exclude_tools": "f"},
         "context_management.edits[0].exclude_tools"),
        ({"type": "clear_tool_uses_20250919", "clear_tool_inputs": [1]},
         "context_management.edits[0].clear_tool_inputs"),
    ],
)  # fmt: skip
def test_malformed_edits_name_the_field(edit: dict, param: str) -> None:
    with pytest.raises(APIError) as info:
        _parse(_turns("f"), edit)
    assert info.value.status == 400 and info.value.param == param
    with pytest.raises(APIError) as info:
        parse_messages({"model": "m", "max_tokens": 5, "messages": _turns(),
                        "context_management": {"edits": {}}})  # fmt: skip
    assert info.value.param == "context_management.edits"
