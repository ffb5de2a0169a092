"""Responses-API request parsing: input shapes, settings, and refusals that name the field."""

from __future__ import annotations

import pytest

from gateway.api.responses.parse import parse_responses_request
from gateway.errors import APIError
from gateway.frontend.chat import ImagePart, TextPart


def _parse(**body: object):
    return parse_responses_request({"model": "m", "input": "hi", **body})


def _refused(param: str, **body: object) -> APIError:
    with pytest.raises(APIError) as info:
        _parse(**body)
    assert info.value.status == 400 and info.value.param == param, info.value
    return info.value


def test_string_input_is_one_user_message() -> None:
    """Invariant: `input` as a string is one user text message; defaults as OpenAI's."""
    r = _parse()
    assert [m.role for m in r.input] == ["user"] and r.input[0].parts == (TextPart("hi"),)
    assert r.store and not r.stream and r.temperature == 1.0 and r.grammar is None
    assert r.text_format == {"type": "text"} and not r.logprobs


def test_message_items_with_images_in_order() -> None:
    """Invariant: input_text / input_image parts keep their order; developer -> system;
    assistant output_text is text."""
    r = _parse(
        input=[
            {"role": "developer", "content": "be brief"},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": "data:image/png;base64,AA"},
                    {"type": "input_text", "text": "what?"},
                ],
            },
            {"role": "assistant", "content": [{"type": "output_text", "text": "a cat"}]},
        ]
    )
    assert [m.role for m in r.input] == ["system", "user", "assistant"]
    image, text = r.input[1].parts
    assert isinstance(image, ImagePart) and image.param == "input[1].content[0].image_url"
    assert text == TextPart("what?") and r.input[2].parts == (TextPart("a cat"),)


def test_settings_and_logprobs_include() -> None:
    """Invariant: max_output_tokens, temperature, top_p, instructions, previous_response_id,
    and logprobs through `include` or `top_logprobs` are read."""
    r = _parse(
        max_output_tokens=7,
        temperature=0,
        top_p=0.5,
        instructions="sys",
        previous_response_id="resp_1",
        include=["message.output_text.logprobs"],
        top_logprobs=3,
        store=False,
    )
    assert (r.max_output_tokens, r.temperature, r.top_p) == (7, 0.0, 0.5)
    assert r.instructions == "sys" and r.previous_response_id == "resp_1"
    assert r.logprobs and r.top_logprobs == 3 and not r.store


def test_text_format_maps_to_structured_output() -> None:
    """Invariant: text.format json_schema (flat, as the Responses API sends it) and
    json_object become grammars; a bad schema is refused naming `text.format...`."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    r = _parse(text={"format": {"type": "json_schema", "name": "x", "schema": schema}})
    assert r.grammar is not None and r.text_format["name"] == "x"
    assert _parse(text={"format": {"type": "json_object"}}).grammar is not None
    error = _refused("text.format.type", text={"format": {"type": "yaml"}})
    assert "text.format" in error.message and "response_format" not in error.message


FN = {"type": "function", "name": "click", "parameters": {"type": "object", "properties": {
    "x": {"type": "integer"}}, "required": ["x"]}}  # fmt: skip
CALL = {"type": "function_call", "call_id": "call_1", "name": "click", "arguments": '{"x": 1}'}


def test_function_tools_choice_and_call_items() -> None:
    """Invariant: function tools become a ToolSet (strict by default, as OpenAI's: closed
    objects) echoed with their defaults; function_call items join the assistant message
    before them; a function_call_output is a tool message whose parts may hold images, its
    call_id's field path kept for the check against the stored conversation."""
    img = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    r = _parse(
        tools=[FN],
        tool_choice={"type": "function", "name": "click"},
        parallel_tool_calls=False,
        input=[
            {"role": "user", "content": "click"},
            {"role": "assistant", "content": "on it"},
            CALL,
            {**CALL, "call_id": "call_2"},
            {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
            {"type": "function_call_output", "call_id": "call_2", "output": [
                {"type": "input_text", "text": "now:"}, img]},
        ],
    )  # fmt: skip
    assert r.tools is not None and r.tools.choice.name == "click" and not r.tools.parallel
    assert r.tools.tools[0].parameters["additionalProperties"] is False
    assert r.tools_echo[0]["strict"] is True and r.tool_choice_echo["name"] == "click"
    assert [m.role for m in r.input] == ["user", "assistant", "tool", "tool"]
    assert [c.id for c in r.input[1].tool_calls] == ["call_1", "call_2"]
    assert r.input[1].parts == (TextPart("on it"),)
    assert isinstance(r.input[3].parts[1], ImagePart) and r.input[3].tool_call_id == "call_2"
    assert r.output_params == ("input[4].call_id", "input[5].call_id")
    loose = _parse(tools=[{**FN, "strict": False}]).tools
    assert loose is not None and "additionalProperties" not in loose.tools[0].parameters


def test_refusals_name_the_field() -> None:
    """Invariant: built-in tools, bad function tools, unknown items, files, file_id,
    background and unknown include values are 400s whose param names the field."""
    assert "web_search" in _refused("tools[0].type", tools=[{"type": "web_search"}]).message
    _refused("tools[0].name", tools=[{"type": "function", "name": "a b", "parameters": {}}])
    bad = {"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}}
    _refused("tools[0].parameters.properties.a.pattern", tools=[{**FN, "parameters": bad}])
    _refused("tools[1].name", tools=[FN, FN])
    chat_shaped = {"type": "function", "function": {"name": "f", "parameters": {}}}
    assert "move `name`" in _refused("tools[0].function", tools=[chat_shaped]).message
    nested = {"type": "function", "function": {"name": "click"}}
    _refused("tool_choice.function", tools=[FN], tool_choice=nested)
    _refused("tool_choice", tool_choice="required")
    _refused("tool_choice.name", tools=[FN], tool_choice={"type": "function", "name": "g"})
    _refused("input[0].type", input=[{"type": "web_search_call", "id": "ws_1"}])
    _refused("reasoning.effort", reasoning={"effort": "max"})
    _refused("input[0].summary[0]", input=[{"type": "reasoning", "summary": [{"text": 1}]}])
    _refused("input[0].output", input=[{"type": "function_call_output", "call_id": "c"}])
    _refused("input[0].arguments", input=[{**CALL, "arguments": {"x": 1}}])
    part = {"type": "input_image", "file_id": "file-1"}
    assert (
        "Files API"
        in _refused(
            "input[0].content[0].file_id", input=[{"role": "user", "content": [part]}]
        ).message
    )
    _refused("background", background=True)
    _refused("include", include=["file_search_call.results"])
    _refused("input", input=[])
    _refused("input[0].role", input=[{"role": "tool", "content": "x"}])
    _refused("top_p", top_p=0)
    img = {"type": "input_image", "image_url": "x"}
    _refused("input[0].content[0]", input=[{"role": "assistant", "content": [img]}])


def test_link_outputs_names_the_call_or_the_field() -> None:
    """Invariant: a function_call_output answers a call of the stored conversation or of
    its own input (then it is named after it); a call id matching nothing is a 400 naming
    that output's `call_id`."""
    from gateway.api.responses.tools import link_outputs
    from gateway.frontend.chat import ChatMessage
    from gateway.tools.spec import ToolCall

    history = (ChatMessage("assistant", (TextPart(""),), (ToolCall("call_9", "click", "{}"),)),)
    out = {"type": "function_call_output", "call_id": "call_9", "output": "ok"}
    r = _parse(input=[out])
    (linked,) = link_outputs(history, r.input, r.output_params)
    assert linked.name == "click" and linked.tool_call_id == "call_9"
    with pytest.raises(APIError) as info:
        link_outputs((), r.input, r.output_params)
    assert info.value.param == "input[0].call_id"
