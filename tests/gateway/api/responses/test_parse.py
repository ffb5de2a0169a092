"""Responses-API request parsing: input shapes, settings, and refusals that name the field."""

from __future__ import annotations

import json

import pytest

from gateway.api.responses.parse import parse_responses_request
from gateway.errors import APIError
from gateway.frontend.chat import ImagePart, TextPart
from tests.gateway.api.responses.codex_body import codex_body


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
    """Invariant: bad function tools, unknown tool types, unknown items, files, file_id,
    background and unknown include values are 400s whose param names the field."""
    assert "namespace" in _refused("tools[0].type", tools=[{"type": "wbe_search"}]).message
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
    _refused("include[1]", include=["reasoning.encrypted_content", "reasoning.everything"])
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


def test_a_codex_body_parses_and_names_what_it_leaves_out() -> None:
    """Invariant: the body Codex sends (developer messages with ids, a namespace of function
    tools, web_search, include encrypted reasoning, store false, a summary without an
    effort, prompt_cache_key, client_metadata) is accepted; the built-in tool is named
    for x-ignored-fields (the bookkeeping fields are in the table); the summary switches
    nothing."""
    r = parse_responses_request(codex_body())
    assert r.ignored_fields == ("tools[4]",)  # client_metadata: in the table, informational
    assert r.encrypted_reasoning and not r.store and r.stream
    assert r.thinking is None and r.reasoning_summary == "auto"
    assert r.input[0].role == "system" and r.tools is not None
    names = [t.name for t in r.tools.tools]
    assert "multi_agent_v1__spawn_agent" in names and "web_search" not in names
    wire = r.tool_names.wire("multi_agent_v1__spawn_agent")
    assert (wire.namespace, wire.name, wire.custom) == ("multi_agent_v1", "spawn_agent", False)


def test_namespaces_flatten_as_codex_does_and_calls_map_back() -> None:
    """Invariant: a namespaced tool is offered under Codex's flat name (`ns__name`, the
    namespace's trailing and the name's leading underscores trimmed); a function_call item
    with a namespace is the call of that flat name; a duplicate flat name is a 400 naming the
    inner tool's name; a namespace of built-in tools is refused naming its tool."""
    ns = {"type": "namespace", "name": "mcp__cal__", "description": "calendar", "tools": [
        {**FN, "name": "__create"}, {**FN, "name": "list"}]}  # fmt: skip
    call = {**CALL, "name": "__create", "namespace": "mcp__cal__"}
    out = {"type": "function_call_output", "call_id": "call_1", "output": "ok"}
    r = _parse(tools=[FN, ns], input=[{"role": "user", "content": "go"}, call, out])
    assert r.tools is not None
    assert [t.name for t in r.tools.tools] == ["click", "mcp__cal__create", "mcp__cal__list"]
    assert r.input[1].tool_calls[0].name == "mcp__cal__create"
    echo = r.tools_echo[1]
    assert echo["type"] == "namespace" and echo["tools"][0]["name"] == "__create"
    named = _parse(tools=[ns], tool_choice={"type": "function", "name": "list", "namespace":
                   "mcp__cal__"}).tools  # fmt: skip
    assert named is not None and named.choice.name == "mcp__cal__list"
    clash = {**ns, "tools": [FN, {**FN}]}
    _refused("tools[0].tools[1].name", tools=[clash])
    _refused("tools[0].tools[0].type", tools=[{**ns, "tools": [{"type": "web_search"}]}])
    _refused("tools[0].tools", tools=[{**ns, "tools": []}])


def test_built_in_tools_are_left_out_and_named() -> None:
    """Invariant: built-in tools are dropped from the prompt and named `tools[i]`; only
    built-in tools means no tools (a required choice is then a 400: nothing could be
    called); forcing a built-in tool is a 400."""
    r = _parse(tools=[{"type": "web_search_preview"}, FN, {"type": "mcp", "server_label": "x"}])
    assert r.tools is not None and [t.name for t in r.tools.tools] == ["click"]
    assert r.ignored_fields == ("tools[0]", "tools[2]")
    assert [t["name"] for t in r.tools_echo] == ["click"]
    only = _parse(tools=[{"type": "web_search", "external_web_access": False}])
    assert only.tools is None and only.ignored_fields == ("tools[0]",)
    assert "built-in" in _refused("tool_choice", tools=[{"type": "web_search"}],
                                  tool_choice="required").message  # fmt: skip
    _refused("tool_choice", tools=[FN], tool_choice={"type": "web_search_preview"})


def test_custom_tools_take_one_string_and_grammars_are_refused() -> None:
    """Invariant: a free-text custom tool is offered as a function of one string `input`;
    a custom_tool_call item is that call with its input as the argument; a grammar-
    constrained custom tool is a 400 naming its `format`."""
    custom = {"type": "custom", "name": "apply_patch", "description": "patch"}
    call = {"type": "custom_tool_call", "call_id": "call_7", "name": "apply_patch",
            "input": "*** Begin Patch"}  # fmt: skip
    out = {"type": "custom_tool_call_output", "call_id": "call_7", "output": "done"}
    r = _parse(tools=[custom], input=[{"role": "user", "content": "fix"}, call, out])
    assert r.tools is not None and r.tools.tools[0].parameters["required"] == ["input"]
    assert r.tool_names.wire("apply_patch").custom
    (made,) = r.input[1].tool_calls
    assert json.loads(made.arguments) == {"input": "*** Begin Patch"}
    assert r.input[2].tool_call_id == "call_7" and r.output_params == ("input[2].call_id",)
    lark = {"type": "grammar", "syntax": "lark", "definition": "start: /x/"}
    assert "grammar" in _refused("tools[0].format", tools=[{**custom, "format": lark}]).message
    _refused("input[0].input", input=[{**call, "input": 3}])


def test_include_values_and_text_verbosity() -> None:
    """Invariant: include's encrypted reasoning is asked for; include values about built-in
    tools' outputs ask for nothing and are named `include[i]`; `text.verbosity` is a hint,
    named when sent, and checked."""
    r = _parse(include=["web_search_call.action.sources", "reasoning.encrypted_content"],
               text={"verbosity": "low"})  # fmt: skip
    assert r.encrypted_reasoning and not r.logprobs
    assert r.ignored_fields == ("include[0]", "text.verbosity")
    assert not _parse().encrypted_reasoning and _parse().ignored_fields == ()
    _refused("text.verbosity", text={"verbosity": "terse"})


def test_reasoning_effort_switches_and_a_summary_does_not() -> None:
    """Invariant: only `reasoning.effort` is a switch (none: off, others on); a summary
    alone leaves the switch to the turn (gateway.api.responses.turn: on where the model
    thinks)."""
    assert _parse(reasoning={"effort": "none"}).thinking is False
    assert _parse(reasoning={"effort": "low", "summary": "auto"}).thinking is True
    summary = _parse(reasoning={"summary": "detailed"})
    assert summary.thinking is None and summary.reasoning_summary == "detailed"
