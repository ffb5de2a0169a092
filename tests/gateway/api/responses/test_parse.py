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


def test_refusals_name_the_field() -> None:
    """Invariant: tools (function and built-in), tool items, files, file_id, background and
    unknown include values are 400s whose param names the field."""
    assert "web_search" in _refused("tools", tools=[{"type": "web_search"}]).message
    _refused("tools", tools=[{"type": "function", "name": "f", "parameters": {}}])
    _refused("tool_choice", tool_choice="required")
    _refused("input[0].type", input=[{"type": "function_call_output", "call_id": "c"}])
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
