"""The thinking fields of the three APIs, parsed (pure).

Pinned: Chat Completions' `chat_template_kwargs` (identifier names, JSON values) and
`reasoning_effort` ("none" off, any other effort on) and an assistant's `reasoning_content`;
Messages' `thinking` (enabled with a budget below max_tokens, disabled, adaptive: optional,
so a model that does not think answers without where `enabled` is a 400; `display`
omitted) and an assistant's `thinking` blocks (redacted ones dropped); Responses'
`reasoning` (effort, summary) and `reasoning` input items, which the next assistant turn
owns. Absent fields leave the request as it was (no switch, no budget, no template
variables). Mistakes are 400s naming the field.
"""

from __future__ import annotations

import pytest

from gateway.api.anthropic.parse import parse_messages_request
from gateway.api.openai.parse import parse_chat_request
from gateway.api.responses.parse import parse_responses_request
from gateway.errors import APIError

USER = {"role": "user", "content": "hi"}


def _chat(**fields: object):
    return parse_chat_request({"model": "m", "messages": [USER], **fields})


def _messages(**fields: object):
    return parse_messages_request({"model": "m", "max_tokens": 50, "messages": [USER], **fields})


def _param(parse, **fields: object) -> str | None:  # noqa: ANN001
    with pytest.raises(APIError) as info:
        parse(**fields)
    assert info.value.status == 400
    return info.value.param


def test_absent_fields_change_nothing() -> None:
    for r in (_chat(), _messages()):
        assert (r.thinking, r.thinking_budget, r.template_kwargs) == (None, None, ())
        assert all(not m.reasoning for m in r.messages)
    responses = parse_responses_request({"model": "m", "input": "hi"})
    assert (responses.thinking, responses.reasoning_summary) == (None, None)


def test_chat_completions_fields() -> None:
    r = _chat(chat_template_kwargs={"enable_thinking": False, "x": [1]}, reasoning_effort="low")
    assert r.template_kwargs == (("enable_thinking", False), ("x", [1]))
    assert r.thinking is True and r.thinking_field == "reasoning_effort"
    assert _chat(reasoning_effort="none").thinking is False
    said = {"role": "assistant", "content": "b", "reasoning_content": "because"}
    r = _chat(messages=[USER, said, USER])
    assert r.messages[1].reasoning == "because"
    assert _param(_chat, reasoning_effort="max") == "reasoning_effort"
    assert _param(_chat, chat_template_kwargs=[1]) == "chat_template_kwargs"
    assert _param(_chat, chat_template_kwargs={"a-b": 1}) == "chat_template_kwargs.a-b"
    bad = {**said, "reasoning_content": 3}
    assert _param(_chat, messages=[USER, bad, USER]) == "messages[1].reasoning_content"


def test_messages_thinking() -> None:
    r = _messages(thinking={"type": "enabled", "budget_tokens": 10})
    assert (r.thinking, r.thinking_budget, r.thinking_field) == (True, 10, "thinking")
    assert _messages(thinking={"type": "disabled"}).thinking is False
    adaptive = _messages(thinking={"type": "adaptive"})
    assert (adaptive.thinking, adaptive.thinking_optional, adaptive.thinking_budget) == (
        True, True, None)  # fmt: skip
    assert _messages(thinking={"type": "enabled", "budget_tokens": 10}).thinking_optional is False
    assert _param(_messages, thinking={"type": "adaptive", "display": "hidden"}) == (
        "thinking.display")  # fmt: skip
    assert _param(_messages, thinking={"type": "enabled", "budget_tokens": 50}) == (
        "thinking.budget_tokens"  # not below max_tokens
    )
    blocks = [
        {"type": "thinking", "thinking": "hmm", "signature": ""},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": "yes"},
    ]
    r = _messages(messages=[USER, {"role": "assistant", "content": blocks}, USER])
    assert r.messages[1].reasoning == "hmm" and r.messages[1].parts[0].text == "yes"  # type: ignore[union-attr]
    user_thinks = {"role": "user", "content": [blocks[0]]}
    assert _param(_messages, messages=[user_thinks]) == "messages[0].content[0].type"


def test_responses_reasoning() -> None:
    r = parse_responses_request(
        {"model": "m", "input": "hi", "reasoning": {"effort": "none", "summary": "auto"}}
    )
    assert (r.thinking, r.reasoning_summary) == (False, "auto")
    thought = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}
    said = {"role": "assistant", "content": "yes"}
    r = parse_responses_request({"model": "m", "input": [USER, thought, said, USER]})
    assert [m.role for m in r.input] == ["user", "assistant", "user"]
    assert r.input[1].reasoning == "s"
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    r = parse_responses_request({"model": "m", "input": [USER, thought, call]})
    assert r.input[1].reasoning == "s" and r.input[1].tool_calls[0].name == "f"


def test_messages_thinking_display_and_ignored_keys() -> None:
    """Invariant: `display: "omitted"` asks for the thinking's text to be left out (the
    response's business: the request is the same); `block_binding` and unknown keys are
    named, not refused."""
    from gateway.api.thinking_fields import anthropic_thinking

    omitted = anthropic_thinking({"thinking": {"type": "adaptive", "display": "omitted"}}, 50)
    assert omitted.omit and omitted.optional
    shown = anthropic_thinking({"thinking": {"type": "enabled", "budget_tokens": 9,
                                             "display": "summarized"}}, 50)  # fmt: skip
    assert not shown.omit and shown.budget == 9
    bound = {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop"}}
    assert _messages(thinking=bound).ignored_fields == ("thinking.block_binding",)


def test_optional_thinking_on_a_model_that_does_not_think() -> None:
    """Invariant: adaptive thinking (or an effort) on a model without thinking markers is no
    thinking, the template's default; `enabled` there stays a 400 naming `thinking`."""
    from gateway.frontend.reasoning import template_kwargs

    assert template_kwargs(_messages(thinking={"type": "adaptive"}), None) == {}
    assert template_kwargs(_messages(output_config={"effort": "high"}), None) == {}
    enabled = _messages(thinking={"type": "enabled", "budget_tokens": 10})
    with pytest.raises(APIError) as info:
        template_kwargs(enabled, None)
    assert info.value.param == "thinking"
