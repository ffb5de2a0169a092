"""End to end: tool calling through the real `openai` and `anthropic` SDKs against
`vision-gateway serve` on the tiny Qwen2-VL (hermes calls, its template renders tools).

The random-weight model emits noise, so what is pinned is the grammar's guarantee: 64 sampled
calls at temperature 1 all name a tool and validate against its schema; streamed calls
reassemble to what the SDK reports; stop strings never cut a call, streamed or not; a tool
result holding an image (the screenshot case) is
accepted and cached like a user image; a tool_call_id matching nothing, a named tool_choice
not among the tools and a schema the server cannot enforce are 400s naming the field.
"""

from __future__ import annotations

import base64
import json

import anthropic
import jsonschema
import openai
import pytest
from support import ServerProcess, data_uri, noise_png

CLICK = {
    "type": "object",
    "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 1023},
        "y": {"type": "integer", "minimum": 0, "maximum": 1023},
        "button": {"enum": ["left", "right"]},
    },
    "required": ["x", "y", "button"],
    "additionalProperties": False,
}
TYPE = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 10}},
    "required": ["text"],
    "additionalProperties": False,
}
SCHEMAS = {"click": CLICK, "type_text": TYPE}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in SCHEMAS.items()]


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--max-batch", "8", "--no-warmup")
    yield proc
    assert proc.stop(), proc.log()


def _valid(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def test_64_sampled_calls_at_temperature_1_all_validate(server: ServerProcess) -> None:
    client = server.client()
    for seed in range(64):
        choice = "required" if seed % 2 else {"type": "function", "function": {"name": "click"}}
        r = client.chat.completions.create(
            model="test",
            messages=[{"role": "user", "content": "click the OK button"}],
            tools=TOOLS,
            tool_choice=choice,
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
            max_tokens=80,
        )
        message = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls", message
        assert len(message.tool_calls) == 1 and message.content is None
        call = message.tool_calls[0]
        assert call.id.startswith("call_")
        assert seed % 2 or call.function.name == "click"
        _valid(call.function.name, call.function.arguments)


def test_stop_strings_never_cut_a_call(server: ServerProcess) -> None:
    """Invariant: `stop` applies to an answer's text, never inside its tool calls: with stop
    strings that occur in every call's markup or JSON, forced calls still come back whole and
    valid with finish_reason "tool_calls", streamed or not (was: arguments cut at the stop
    string under "tool_calls", or the call's markup leaked into the content under "stop")."""
    client = server.client()
    ask = [{"role": "user", "content": "click the OK button"}]
    for stop in (["}"], ['"'], ["<"], ["\n", "x"]):
        r = client.chat.completions.create(
            model="test", messages=ask, tools=TOOLS, tool_choice="required", stop=stop,
            parallel_tool_calls=False, temperature=0, max_tokens=80,
        )  # fmt: skip
        assert r.choices[0].finish_reason == "tool_calls", (stop, r.choices[0])
        call = r.choices[0].message.tool_calls[0]
        _valid(call.function.name, call.function.arguments)
        chunks = client.chat.completions.create(
            model="test", messages=ask, tools=TOOLS, tool_choice="required", stop=stop,
            parallel_tool_calls=False, temperature=0, max_tokens=80, stream=True,
        )  # fmt: skip
        pieces, reasons = [], []
        for chunk in chunks:
            for c in chunk.choices:
                pieces += [t.function.arguments or "" for t in c.delta.tool_calls or ()]
                reasons += [c.finish_reason] if c.finish_reason else []
        assert reasons == ["tool_calls"] and "".join(pieces) == call.function.arguments


def test_a_call_cut_short_by_max_tokens_leaks_no_markup(server: ServerProcess) -> None:
    """Invariant: an answer cut by max_tokens before its call's name is complete has no call
    and none of the call's syntax in `content` (was '<tool_call>\\n{"name', then '<tool' cut
    inside the marker, as content); cut inside the arguments it carries the call with the
    arguments so far, under "length"."""
    client = server.client()
    ask = [{"role": "user", "content": "click the OK button"}]
    choice = {"type": "function", "function": {"name": "click"}}

    def call(max_tokens: int):  # noqa: ANN202
        return client.chat.completions.create(
            model="test", messages=ask, tools=TOOLS, tool_choice=choice, temperature=0,
            max_tokens=max_tokens,
        )  # fmt: skip

    whole = call(80)
    assert whole.choices[0].finish_reason == "tool_calls"
    arguments = whole.choices[0].message.tool_calls[0].function.arguments
    named = 0
    for max_tokens in [1, 2, *range(3, whole.usage.completion_tokens, 4)]:
        cut = call(max_tokens).choices[0]
        # A forced call: no text at all, not even the marker's first characters ("<tool").
        assert cut.finish_reason == "length" and not cut.message.content, (max_tokens, cut)
        if cut.message.tool_calls is None:
            assert not named, "a call, once named, stays in the answer"
            continue
        named += 1
        assert cut.message.tool_calls[0].function.name == "click"
        partial = cut.message.tool_calls[0].function.arguments
        assert arguments.startswith(partial) and (named > 1 or partial != arguments)
    assert named


def test_streamed_calls_and_an_image_tool_result(server: ServerProcess) -> None:
    client = server.client()
    ask = [{"role": "user", "content": "open the menu"}]
    stream = client.chat.completions.create(
        model="test", messages=ask, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, temperature=1.0, seed=7, max_tokens=80, stream=True,
    )  # fmt: skip
    calls: dict[int, dict] = {}
    reasons = []
    for chunk in stream:
        choice = chunk.choices[0]
        reasons.append(choice.finish_reason)
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": delta.id, "name": None, "args": ""})
            if delta.function.name:
                assert call["name"] is None and delta.id  # id and name come first, once
                call["name"] = delta.function.name
            call["args"] += delta.function.arguments or ""
    assert reasons[-1] == "tool_calls"
    assert len(calls) == 1
    call = calls[0]
    _valid(call["name"], call["args"])
    screenshot = data_uri(noise_png(3, 112, 112))
    history = [
        *ask,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call["id"], "type": "function",
             "function": {"name": call["name"], "arguments": call["args"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": [
            {"type": "text", "text": "done; the screen now:"},
            {"type": "image_url", "image_url": {"url": screenshot}}]},
    ]  # fmt: skip
    first = client.chat.completions.with_raw_response.create(
        model="test", messages=history, tools=TOOLS, max_tokens=4, temperature=0
    )
    assert "vision-misses=1" in first.headers["x-cache"]
    again = client.chat.completions.with_raw_response.create(
        model="test", messages=history, tools=TOOLS, max_tokens=4, temperature=0
    )
    assert "vision-misses=0" in again.headers["x-cache"]
    assert first.parse().choices[0].message == again.parse().choices[0].message


def test_anthropic_tool_use_streamed_and_tool_result_with_image(server: ServerProcess) -> None:
    client = anthropic.Anthropic(base_url=server.base_url, api_key="-", max_retries=0)
    tools = [{"name": n, "input_schema": s} for n, s in SCHEMAS.items()]
    ask = [{"role": "user", "content": "click it"}]
    # Greedy (Anthropic's default temperature is 1): a sampled first call made the second
    # prompt, and so whether its call closes within max_tokens, vary from run to run.
    with client.messages.stream(
        model="test", max_tokens=80, messages=ask, tools=tools, extra_body={"temperature": 0},
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    ) as stream:  # fmt: skip
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert "input_json" in kinds and message.stop_reason == "tool_use"
    (use,) = [b for b in message.content if b.type == "tool_use"]
    jsonschema.validate(use.input, SCHEMAS[use.name])
    png = base64.b64encode(noise_png(4, 112, 112)).decode()
    result = {"type": "tool_result", "tool_use_id": use.id, "content": [
        {"type": "text", "text": "clicked"},
        {"type": "image",
         "source": {"type": "base64", "media_type": "image/png", "data": png}}]}  # fmt: skip
    block = use.model_dump(include={"type", "id", "name", "input"})
    history = [*ask, {"role": "assistant", "content": [block]},
               {"role": "user", "content": [result]}]  # fmt: skip
    answer = client.messages.create(
        model="test", max_tokens=80, messages=history, tools=tools, extra_body={"temperature": 0},
        tool_choice={"type": "tool", "name": "type_text"},
    )  # fmt: skip
    assert answer.stop_reason == "tool_use"
    for block in answer.content:
        if block.type == "tool_use":
            assert block.name == "type_text"
            jsonschema.validate(block.input, TYPE)
    with pytest.raises(anthropic.BadRequestError, match="tool_use_id"):
        bad = {**result, "tool_use_id": "toolu_nothing"}
        turns = [*history[:2], {"role": "user", "content": [bad]}]
        client.messages.create(model="test", max_tokens=4, messages=turns)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "drag"}}},
         "tool_choice.function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "string", "pattern": "("}}}}}]},
         "tools[0].function.parameters.properties.a.pattern"),
        ({"messages": [{"role": "user", "content": "hi"},
                       {"role": "tool", "tool_call_id": "call_x", "content": "r"}]},
         "messages[1].tool_call_id"),
    ],
)  # fmt: skip
def test_bad_tool_requests_are_400_naming_the_field(
    server: ServerProcess, extra: dict, param: str
) -> None:
    body = {"model": "test", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    with pytest.raises(openai.BadRequestError) as info:
        server.client().chat.completions.create(**(body | extra), max_tokens=4)
    assert info.value.body["param"] == param, info.value.body


def test_a_forced_parser_on_a_template_without_tools_folds_them_into_the_prompt() -> None:
    """Invariant: Gemma 3's template renders no tools; with `--tool-call-parser hermes` the
    tools still reach the prompt (more prompt tokens than without them, more for a longer
    description), a forced call validates, and the agent loop goes on: the call and a tool
    result holding an image go back (was: tools silently dropped, and the history a 400
    "roles must alternate")."""
    gemma = ServerProcess("--tool-call-parser", "hermes", "--no-warmup", arch="gemma3")
    try:
        client = gemma.client()
        ask = [{"role": "user", "content": "click the OK button"}]
        counts = []
        for tools in (
            None,
            TOOLS,
            [{**TOOLS[0], "function": {**TOOLS[0]["function"], "description": "Click. " * 40}}],
        ):
            extra = {"tools": tools, "tool_choice": "required"} if tools else {}
            r = client.chat.completions.create(
                model="test", messages=ask, max_tokens=80, temperature=0, **extra
            )
            counts.append(r.usage.prompt_tokens)
        assert counts[0] < counts[1] < counts[2], counts
        r = client.chat.completions.create(
            model="test", messages=ask, tools=TOOLS, tool_choice="required", max_tokens=80,
            parallel_tool_calls=False, temperature=0,
        )  # fmt: skip
        call = r.choices[0].message.tool_calls[0]
        _valid(call.function.name, call.function.arguments)
        screen = {"type": "image_url", "image_url": {"url": data_uri(noise_png(5, 64, 64))}}
        result = {"role": "tool", "tool_call_id": call.id,
                  "content": [{"type": "text", "text": "clicked"}, screen]}  # fmt: skip
        history = [*ask, r.choices[0].message.model_dump(exclude_none=True), result]
        again = client.chat.completions.create(
            model="test", messages=history, tools=TOOLS, tool_choice="required", max_tokens=200,
            parallel_tool_calls=False, temperature=0,
        )  # fmt: skip
        assert again.choices[0].finish_reason == "tool_calls", again.choices[0]
        assert again.usage.prompt_tokens > r.usage.prompt_tokens
    finally:
        assert gemma.stop(), gemma.log()
