"""Folding tools into plain turns for a template that renders none (no model).

Pinned: the tools are offered in one system block (prepended to the client's system text);
an assistant's calls become the exact text the model writes for them (what the grammar
enforces, so a follow-up renders what the model produced); tool results join the user turn
(images kept in place) so roles alternate; nothing tool-shaped, nothing folded.
"""

from __future__ import annotations

import json

from gateway.tools.fallback import fold, needs_folding, renders_tools, tools_block
from gateway.tools.formats import HERMES

TOOL = {"type": "function", "function": {"name": "click", "description": "Click.",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}  # fmt: skip
CALL = {"id": "call_1", "type": "function", "function": {"name": "click", "arguments": {"x": 3}}}


def test_tools_are_offered_in_a_system_block_before_the_clients_system_text() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "go"}]
    out = fold(messages, [TOOL], HERMES)
    assert [m["role"] for m in out] == ["system", "user"]
    assert out[0]["content"] == tools_block(HERMES, [TOOL]) + "\n\nBe brief."
    assert json.dumps(TOOL) in out[0]["content"] and "<tool_call>" in out[0]["content"]
    alone = fold([{"role": "user", "content": "go"}], [TOOL], HERMES)
    assert alone[0] == {"role": "system", "content": tools_block(HERMES, [TOOL])}


def test_calls_and_results_become_alternating_text_turns() -> None:
    """Invariant: the folded history alternates user/assistant; the call is written exactly
    as the model writes it (`ToolFormat.call_text`); an image in a result stays a part."""
    messages = [
        {"role": "user", "content": "click it"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "name": "click",
            "content": [{"type": "text", "text": "done"}, {"type": "image"}],
        },  # fmt: skip
        {"role": "tool", "tool_call_id": "call_2", "name": "click", "content": "again"},
        {"role": "user", "content": "next?"},
    ]
    out = fold(messages, None, HERMES)
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    assert out[1] == {"role": "assistant", "content": HERMES.call_text("click", '{"x": 3}')}
    assert out[2]["content"] == [
        {"type": "text", "text": "<tool_response>\ndone"},
        {"type": "image"},
        {
            "type": "text",
            "text": "\n</tool_response>\n<tool_response>\nagain\n</tool_response>\nnext?",
        },  # fmt: skip
    ]
    assert all("tool_calls" not in m and "tool_call_id" not in m for m in out)


def test_only_tool_shaped_conversations_are_folded() -> None:
    plain = [{"role": "user", "content": "hi"}]
    assert not needs_folding(plain, None) and needs_folding(plain, [TOOL])
    assert needs_folding([{"role": "tool", "content": "x"}], None)
    assert not renders_tools("{{ messages }}") and renders_tools("{% if tools %}{% endif %}")
