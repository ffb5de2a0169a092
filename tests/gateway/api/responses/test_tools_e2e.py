"""End to end: function tools through the real `openai` SDK's `responses` against
`vision-gateway serve` on the tiny Qwen2-VL (hermes calls; random weights, so what is pinned
is the grammar's guarantee and the API's shapes, never the model's choices).

Pinned: forced calls come back as `function_call` items whose arguments validate; the
streamed events rebuild exactly the final response (the SDK's own stream accumulator reads
them); a follow-up through `previous_response_id` with a `function_call_output` holding a
screenshot continues the stored conversation, and the screenshot is cached by pixels (a
later turn encodes no image); a call_id matching nothing is a 400 naming it.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from support import ServerProcess, data_uri, noise_png

CLICK = {
    "type": "object",
    "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 1023},
        "y": {"type": "integer", "minimum": 0, "maximum": 1023},
    },
    "required": ["x", "y"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "name": "click", "parameters": CLICK}]


@pytest.fixture(scope="module")
def client():
    proc = ServerProcess("--max-batch", "4", "--no-warmup", "--kv-block-tokens", "8")
    yield proc.client()
    assert proc.stop(), proc.log()


def _call(client: openai.OpenAI, seed: int, **kw: object):  # noqa: ANN202
    kw.setdefault("input", "click OK")
    return client.responses.create(
        model="test", tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
        temperature=1.0, extra_body={"seed": seed}, max_output_tokens=120, **kw,
    )  # type: ignore[call-overload]  # fmt: skip


def test_forced_calls_are_function_call_items_that_validate(client: openai.OpenAI) -> None:
    for seed in range(8):
        r = _call(client, seed)
        assert r.status == "completed", r
        (item,) = r.output
        assert item.type == "function_call" and item.name == "click"
        assert item.call_id.startswith("call_") and item.id == "fc_" + item.call_id[5:]
        jsonschema.validate(json.loads(item.arguments), CLICK)
        assert r.tool_choice == "required" and r.tools[0].name == "click"
        assert r.parallel_tool_calls is False


def test_streamed_events_rebuild_the_response(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model="test", input="click OK", tools=TOOLS,
        tool_choice={"type": "function", "name": "click"}, parallel_tool_calls=False,
        temperature=1.0, extra_body={"seed": 3},
        max_output_tokens=120,
    ) as stream:  # type: ignore[call-overload]  # fmt: skip
        events = list(stream)
        kinds = [e.type for e in events]
        assert kinds[-1] == "response.completed", events[-1]
        accumulated = stream.get_final_response()
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    final = events[-1].response
    (item,) = final.output
    assert item.type == "function_call" and deltas == item.arguments
    assert accumulated.output[0].arguments == item.arguments  # the SDK's own accumulation
    assert [e.sequence_number for e in events] == list(range(len(events)))
    jsonschema.validate(json.loads(item.arguments), CLICK)


def test_tool_result_with_a_screenshot_continues_and_is_cached(client: openai.OpenAI) -> None:
    first = _call(client, 5)
    (call,) = first.output
    screenshot = data_uri(noise_png(11, 112, 112))
    result = {"type": "function_call_output", "call_id": call.call_id, "output": [
        {"type": "input_text", "text": "clicked; the screen now:"},
        {"type": "input_image", "image_url": screenshot}]}  # fmt: skip
    raw = client.responses.with_raw_response.create(
        model="test", previous_response_id=first.id, input=[result], tools=TOOLS,
        tool_choice="required", parallel_tool_calls=False, temperature=0, max_output_tokens=120,
    )  # fmt: skip
    assert "vision-misses=1" in raw.headers["x-cache"], raw.headers["x-cache"]
    second = raw.parse()
    assert second.previous_response_id == first.id and second.output[0].type == "function_call"
    assert second.usage.input_tokens_details.cached_tokens > 0  # the first turn's prefix
    # The same follow-up again, sent in full without the store: the screenshot is found by
    # its pixels and the answer is the same (temperature 0).
    full = [{"role": "user", "content": "click OK"},
            call.model_dump(include={"type", "call_id", "name", "arguments"}), result]  # fmt: skip
    again = client.responses.with_raw_response.create(
        model="test", input=full, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_output_tokens=120, store=False,
    )  # fmt: skip
    assert "vision-misses=0" in again.headers["x-cache"], again.headers["x-cache"]
    assert again.parse().output[0].arguments == second.output[0].arguments
    # The second call is answered before the next question (OpenAI's rule: a continued
    # response's calls each get an output first).
    answered = {"type": "function_call_output", "call_id": second.output[0].call_id,
                "output": "done"}  # fmt: skip
    third = client.responses.with_raw_response.create(
        model="test", previous_response_id=second.id, tools=TOOLS, tool_choice="none",
        input=[answered, {"role": "user", "content": "and now?"}], temperature=0,
        max_output_tokens=4,
    )  # fmt: skip
    assert "vision-misses=0" in third.headers["x-cache"]
    assert third.parse().output[0].type == "message"


def test_a_history_openai_refuses_is_a_400(client: openai.OpenAI) -> None:
    """Invariant: as on OpenAI's API, a continued response's function call must be answered
    before anything else, once, and call ids are unique: else a 400 (was a 200)."""
    first = _call(client, 2)
    (call,) = first.output
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "ok"}
    for bad in ("next question", [output, output]):
        with pytest.raises(openai.BadRequestError):
            client.responses.create(model="test", previous_response_id=first.id, input=bad,
                                    tools=TOOLS, max_output_tokens=4)  # fmt: skip
    made = call.model_dump(include={"type", "call_id", "name", "arguments"})
    twice = [{"role": "user", "content": "go"}, made, made, output]
    with pytest.raises(openai.BadRequestError):
        client.responses.create(
            model="test", tools=TOOLS, max_output_tokens=4, store=False, input=twice
        )


def test_an_output_for_no_call_is_a_400_naming_it(client: openai.OpenAI) -> None:
    first = _call(client, 1)
    bad = {"type": "function_call_output", "call_id": "call_nothing", "output": "ok"}
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(
            model="test", previous_response_id=first.id, input=[bad], tools=TOOLS
        )
    assert info.value.body["param"] == "input[0].call_id", info.value.body  # type: ignore[index]
