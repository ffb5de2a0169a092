"""Thinking blocks on the Messages wire (gateway.api.anthropic.thinking, .tool_render).

Pinned: with `display: "omitted"` a thinking block's text is empty and its signature keeps
the thinking, streamed as a thinking block with no thinking_delta and one signature_delta;
sent back, such a block is the assistant's earlier thinking again (multi-turn continuity, as
Anthropic documents); another server's signature on an empty block counts as no thinking; a
forged signature with our prefix is a 400 naming it; shown thinking keeps an empty signature.
"""

from __future__ import annotations

import json

import pytest

from gateway.api.anthropic.parse import parse_messages_request
from gateway.api.anthropic.thinking import PREFIX, sign, thinking_block
from gateway.api.anthropic.tool_render import BlockStream
from gateway.errors import APIError

USER = {"role": "user", "content": "hi"}


def _events(sse: str) -> list[dict]:
    return [json.loads(line[6:]) for line in sse.splitlines() if line.startswith("data: ")]


def _sent_back(block: dict) -> str:
    said = {"role": "assistant", "content": [block, {"type": "text", "text": "ok"}]}
    body = {"model": "m", "max_tokens": 5, "messages": [USER, said, USER]}
    return parse_messages_request(body).messages[1].reasoning


def test_an_omitted_thinking_comes_back_as_the_thinking() -> None:
    block = thinking_block("step one ✓", omit=True)
    assert block["thinking"] == "" and block["signature"].startswith(PREFIX)
    assert _sent_back(block) == "step one ✓"
    assert thinking_block("shown") == {"type": "thinking", "thinking": "shown", "signature": ""}
    assert _sent_back(thinking_block("shown")) == "shown"
    assert _sent_back({"type": "thinking", "thinking": "", "signature": "EqoBCkgIARAB"}) == ""
    with pytest.raises(APIError) as info:
        _sent_back({"type": "thinking", "thinking": "", "signature": PREFIX + "%%%"})
    assert info.value.param == "messages[1].content[0].signature"


def test_an_omitted_thinking_streams_only_its_signature() -> None:
    blocks = BlockStream(None, omit=True)
    events = _events(blocks.think("a") + blocks.think("b") + blocks.feed("answer", end=True))
    kinds = [(e["type"], e.get("delta", {}).get("type")) for e in events]
    assert kinds == [
        ("content_block_start", None),
        ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
        ("content_block_start", None),
        ("content_block_delta", "text_delta"),
        ("content_block_stop", None),
    ]
    assert events[0]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert events[1]["delta"]["signature"] == sign("ab")
    shown = _events(BlockStream(None).think("a") + BlockStream(None).feed("", end=True))
    assert shown[1]["delta"] == {"type": "thinking_delta", "thinking": "a"}
