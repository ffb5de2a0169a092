"""Responses-API wire bodies: the response object's status fields and the stream framing."""

from __future__ import annotations

import json

from gateway.api.responses.parse import parse_responses_request
from gateway.api.responses.render import EventWriter, ResponseMeta, error_event, response_body
from gateway.engine.request import TokenLogprob, Usage
from gateway.errors import APIError

META = ResponseMeta("resp_1", "msg_1", 7, parse_responses_request({"model": "m", "input": "x"}))


def _frames(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.strip().split("\n\n"):
        event, data = block.split("\n")
        out.append((event.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_status_and_usage() -> None:
    """Invariant: `incomplete` carries reason max_output_tokens; usage maps prompt/cached/
    completion tokens and the image counts; logprobs appear only when given."""
    usage = Usage(10, 3, 8, vision_hits=0, vision_misses=1)
    lp = [TokenLogprob("a", 5, -0.5, (97,), (("a", 5, -0.5, (97,)),))]
    body = response_body(META, "incomplete", "abc", lp, usage)
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["input_tokens_details"] == {
        "cache_write_tokens": 0,  # required by the openai SDK's ResponseUsage type
        "cached_tokens": 8,
        "images_encoded": 1,
        "images_cached": 0,
    }
    assert body["usage"]["total_tokens"] == 13
    part = body["output"][0]["content"][0]
    assert part["text"] == "abc" and part["logprobs"][0]["top_logprobs"][0]["bytes"] == [97]
    done = response_body(META, "completed", "abc", None, usage)
    assert done["incomplete_details"] is None and done["output"][0]["status"] == "completed"
    assert done["output"][0]["content"][0]["logprobs"] == []


def test_stream_framing_and_sequence_numbers() -> None:
    """Invariant: every event names itself in `event:` and `type`, and sequence numbers
    count from 0 across opening, deltas and closing; the terminal event follows status."""
    writer = EventWriter(META)
    final = response_body(META, "incomplete", "ab", None, Usage(1, 2, 0))
    frames = _frames(writer.opening() + writer.delta("a", ()) + writer.delta("b", ()))
    frames += _frames(writer.closing(final))
    assert all(name == body["type"] for name, body in frames)
    assert [b["sequence_number"] for _, b in frames] == list(range(len(frames)))
    assert frames[-1][0] == "response.incomplete" and frames[-4][1]["text"] == "ab"
    ((name, body),) = _frames(error_event(APIError(503, "bye", "server_error", None, "x"), 9))
    assert name == "error" and body["code"] == "x" and body["sequence_number"] == 9


def test_a_response_body_validates_against_the_openai_sdks_types() -> None:
    """Invariant: the body parses as the `openai` SDK's own `Response` model, strictly (its
    lenient reading hid a missing `cache_write_tokens`)."""
    from openai.types.responses import Response

    usage = Usage(10, 3, 8, vision_hits=0, vision_misses=1)
    for status in ("completed", "incomplete"):
        Response.model_validate(response_body(META, status, "abc", None, usage))


def test_codex_shaped_items_validate_and_carry_the_wire_names() -> None:
    """Invariant: a namespaced tool's call is a `function_call` with `namespace` and the
    inner `name`; a custom tool's is a `custom_tool_call` whose `input` is the string the
    model wrote; the reasoning item carries the sealed thinking when `include` asks (and only
    then); the body, with its namespace and custom tools echoed, validates as the SDK's
    Response."""
    from openai.types.responses import Response

    from gateway.api.responses.render import MadeCall, reasoning_item
    from gateway.api.responses.sealed import ReasoningSeal
    from gateway.tools.spec import ToolCall

    custom = {"type": "custom", "name": "apply_patch", "description": "patch"}
    ns = {"type": "namespace", "name": "multi_agent_v1", "description": "agents", "tools": [
        {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}]}  # fmt: skip
    body = {"model": "m", "input": "x", "tools": [ns, custom, {"type": "web_search"}],
            "include": ["reasoning.encrypted_content"],
            "reasoning": {"summary": "auto"}}  # fmt: skip
    seal = ReasoningSeal.random()
    meta = ResponseMeta("resp_1", "msg_1", 7, parse_responses_request(body), seal)
    calls = [
        MadeCall(ToolCall("call_a", "multi_agent_v1__spawn_agent", '{"message": "go"}')),
        MadeCall(ToolCall("call_b", "apply_patch", '{"input": "*** Begin Patch\\n"}')),
        MadeCall(ToolCall("call_c", "apply_patch", '{"input": "*** Be'), complete=False),
    ]
    out = response_body(meta, "completed", "", None, Usage(3, 4, 0), None, calls, "hmm")
    Response.model_validate(out)
    thought, spawn, patch, cut = out["output"]
    assert seal.open(thought["encrypted_content"], "x") == "hmm"
    assert thought["summary"] == [{"type": "summary_text", "text": "hmm"}]
    assert (spawn["type"], spawn["namespace"], spawn["name"]) == (
        "function_call", "multi_agent_v1", "spawn_agent")  # fmt: skip
    assert spawn["arguments"] == '{"message": "go"}' and spawn["id"] == "fc_a"
    assert (patch["type"], patch["name"], patch["input"]) == (
        "custom_tool_call", "apply_patch", "*** Begin Patch\n")  # fmt: skip
    assert "namespace" not in patch and patch["id"] == "ctc_b"
    assert cut["input"] == "" and cut["status"] == "incomplete"
    assert [t["type"] for t in out["tools"]] == ["namespace", "custom"]
    unasked = ResponseMeta("resp_2", "msg_2", 7, META.request, seal)
    assert reasoning_item(unasked, "completed", "hmm")["encrypted_content"] is None
    assert reasoning_item(meta, "in_progress", "")["encrypted_content"] is None
