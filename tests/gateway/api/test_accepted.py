"""No silent ignoring: every documented request field of each API is applied or refused.

Pinned here: the tables of gateway.api.accepted cover every request field the real `openai`
and `anthropic` SDKs document (chat completions, legacy completions, responses, messages);
walking each table against the real parser, an APPLIED field changes the typed request, an
INFORMATIONAL one parses and changes nothing, and a REFUSED one is a 400 naming it.
"""

from __future__ import annotations

import typing
from typing import Any

import pytest
from anthropic.types import message_create_params
from openai.types import completion_create_params as completion_create_params_legacy
from openai.types.chat import completion_create_params
from openai.types.responses import response_create_params

from gateway.api import accepted
from gateway.api.anthropic.parse import parse_messages_request
from gateway.api.openai.completions import parse_completion_request
from gateway.api.openai.parse import parse_chat_request
from gateway.api.responses.parse import parse_responses_request
from gateway.errors import APIError

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
FLAT_TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}
CLAUDE_TOOL = {"name": "f", "input_schema": {"type": "object"}}
LOGPROBS = "message.output_text.logprobs"

# field -> (fields it needs beside it, the value tried); anything not listed: "x"
OPENAI = {
    "model": ({}, "other"),
    "reasoning_effort": ({}, "none"),
    "chat_template_kwargs": ({}, {"enable_thinking": False}),
    "messages": ({}, [{"role": "user", "content": "bye"}]),
    "max_completion_tokens": ({}, 5),
    "max_tokens": ({}, 5),
    "temperature": ({}, 0.5),
    "top_p": ({}, 0.5),
    "seed": ({}, 3),
    "stop": ({}, ["x"]),
    "n": ({}, 2),
    "logprobs": ({}, True),
    "top_logprobs": ({"logprobs": True}, 2),
    "presence_penalty": ({}, 1.0),
    "frequency_penalty": ({}, 1.0),
    "logit_bias": ({}, {"5": 2}),
    "stream": ({}, True),
    "stream_options": ({"stream": True}, {"include_usage": True}),
    "response_format": ({}, {"type": "json_object"}),
    "tools": ({}, [TOOL]),
    "tool_choice": ({"tools": [TOOL]}, "required"),
    "parallel_tool_calls": ({"tools": [TOOL]}, False),
    "top_k": ({}, 5),
    "repetition_penalty": ({}, 1.2),
    "min_tokens": ({}, 2),
    "ignore_eos": ({}, True),
    "cache_salt": ({}, "salt"),
    "keep_alive": ({}, "5m"),
    "metadata": ({}, {"a": "b"}),
    "store": ({}, True),
    "service_tier": ({}, "auto"),
    "audio": ({}, {"voice": "alloy", "format": "wav"}),
    "modalities": ({}, ["text", "audio"]),
    "functions": ({}, [{"name": "f"}]),
    "function_call": ({}, "auto"),
    "best_of": ({}, 2),
    "use_beam_search": ({}, True),
    "length_penalty": ({}, 1.5),
    "min_p": ({}, 0.1),
    "stop_token_ids": ({}, [1]),
    "prompt_logprobs": ({}, 1),
}
RESPONSES = {
    "reasoning": ({}, {"effort": "none"}),
    "model": ({}, "other"),
    "input": ({}, "bye"),
    "previous_response_id": ({}, "resp_1"),
    "max_output_tokens": ({}, 5),
    "temperature": ({}, 0.5),
    "top_p": ({}, 0.5),
    "seed": ({}, 3),
    "top_logprobs": ({}, 2),
    "include": ({}, [LOGPROBS]),
    "text": ({}, {"format": {"type": "json_object"}}),
    "tools": ({}, [FLAT_TOOL]),
    "tool_choice": ({"tools": [FLAT_TOOL]}, "required"),
    "parallel_tool_calls": ({"tools": [FLAT_TOOL]}, False),
    "stream": ({}, True),
    "store": ({}, False),
    "truncation": ({}, "auto"),
    "metadata": ({}, {"a": "b"}),
    "cache_salt": ({}, "salt"),
    "keep_alive": ({}, "5m"),
    "stream_options": ({"stream": True}, {"include_obfuscation": False}),
    "background": ({}, True),
    "max_tool_calls": ({}, 3),
}
COMPLETIONS = {
    "model": ({}, "other"),
    "prompt": ({}, "bye"),
    "max_tokens": ({}, 5),
    "temperature": ({}, 0.5),
    "top_p": ({}, 0.5),
    "seed": ({}, 3),
    "stop": ({}, ["x"]),
    "n": ({}, 2),
    "best_of": ({}, 1),
    "logprobs": ({}, 2),
    "echo": ({}, True),
    "presence_penalty": ({}, 1.0),
    "frequency_penalty": ({}, 1.0),
    "logit_bias": ({}, {"5": 2}),
    "stream": ({}, True),
    "stream_options": ({"stream": True}, {"include_usage": True}),
    "top_k": ({}, 5),
    "repetition_penalty": ({}, 1.2),
    "min_tokens": ({}, 2),
    "ignore_eos": ({}, True),
    "cache_salt": ({}, "salt"),
    "keep_alive": ({}, "5m"),
    "use_beam_search": ({}, True),
    "length_penalty": ({}, 1.5),
    "min_p": ({}, 0.1),
    "stop_token_ids": ({}, [1]),
    "prompt_logprobs": ({}, 1),
    "response_format": ({}, {"type": "json_object"}),
    "guided_json": ({}, {"type": "object"}),
}
# An assistant turn that thought, and the edit that clears every turn's thinking.
THOUGHT = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": ""}]},
    {"role": "user", "content": "and?"},
]
CLEAR_THINKING = {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 0}}
ANTHROPIC = {
    "thinking": ({}, {"type": "disabled"}),
    "model": ({}, "other"),
    "messages": ({}, [{"role": "user", "content": "bye"}]),
    "system": ({}, "be brief"),
    "max_tokens": ({}, 5),
    "temperature": ({}, 0.5),
    "top_p": ({}, 0.5),
    "top_k": ({}, 5),
    "stop_sequences": ({}, ["x"]),
    "stream": ({}, True),
    "tools": ({}, [CLAUDE_TOOL]),
    "tool_choice": ({"tools": [CLAUDE_TOOL]}, {"type": "any"}),
    "cache_salt": ({}, "salt"),
    "keep_alive": ({}, "5m"),
    "metadata": ({}, {"user_id": "u"}),
    "service_tier": ({}, "auto"),
    "cache_control": ({}, {"type": "ephemeral"}),
    "mcp_servers": ({}, [{"type": "url", "url": "https://x", "name": "x"}]),
    "container": ({}, "c"),
    "context_management": ({"messages": THOUGHT}, {"edits": [CLEAR_THINKING]}),
    "output_config": ({}, {"effort": "low"}),
    "output_format": ({}, {"type": "json_schema", "schema": {"type": "object"}}),
}
CHAT_BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
RESPONSES_BASE = {"model": "m", "input": "hi"}
COMPLETIONS_BASE = {"model": "m", "prompt": "hi"}
ANTHROPIC_BASE = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}

APIS = {
    "openai": (accepted.OPENAI_CHAT, OPENAI, CHAT_BASE, parse_chat_request),
    "responses": (accepted.RESPONSES, RESPONSES, RESPONSES_BASE, parse_responses_request),
    "anthropic": (accepted.ANTHROPIC_MESSAGES, ANTHROPIC, ANTHROPIC_BASE, parse_messages_request),
    "completions": (
        accepted.OPENAI_COMPLETIONS,
        COMPLETIONS,
        COMPLETIONS_BASE,
        parse_completion_request,
    ),
}


def _documented(params: type) -> set[str]:
    return set(typing.get_type_hints(params)) | {"stream"}


@pytest.mark.parametrize(
    ("table", "params"),
    [
        (accepted.OPENAI_CHAT, completion_create_params.CompletionCreateParamsBase),
        (accepted.RESPONSES, response_create_params.ResponseCreateParamsBase),
        (accepted.ANTHROPIC_MESSAGES, message_create_params.MessageCreateParamsBase),
        (accepted.OPENAI_COMPLETIONS, completion_create_params_legacy.CompletionCreateParamsBase),
    ],
    ids=["openai", "responses", "anthropic", "completions"],
)
def test_the_tables_cover_every_field_the_sdks_document(table: dict, params: type) -> None:
    """Invariant: no request field of the SDK's own types is missing from the table."""
    missing = _documented(params) - set(table)
    assert not missing


def _cases() -> list[Any]:
    return [
        pytest.param(api, name, kind, id=f"{api}-{name}")
        for api, (table, _, _, _) in APIS.items()
        for name, (kind, _) in table.items()
        if kind != accepted.OTHER
    ]


@pytest.mark.parametrize(("api", "name", "kind"), _cases())
def test_each_field_is_applied_or_refused(api: str, name: str, kind: str) -> None:
    """Invariant: APPLIED changes the parsed request; INFORMATIONAL parses to the same
    request; REFUSED is a 400 whose param names the field."""
    _, samples, base, parse = APIS[api]
    context, value = samples.get(name, ({}, "x"))
    before = {**base, **context}
    after = {**before, name: value}
    if kind == accepted.REFUSED:
        with pytest.raises(APIError) as info:
            parse(after)
        assert info.value.status == 400 and info.value.param == name
        return
    changed = parse(after) != parse(before)
    assert changed == (kind == accepted.APPLIED)


def test_neutral_values_of_refused_fields_pass() -> None:
    """Invariant: a refused field sent with a value that asks for nothing (text-only
    modalities, false, null) is not an error."""
    for extra in ({"modalities": ["text"]}, {"use_beam_search": False}, {"audio": None}):
        parse_chat_request({**CHAT_BASE, **extra})
    parse_responses_request({**RESPONSES_BASE, "background": False})


def test_unknown_fields_are_named_for_the_ignored_fields_header() -> None:
    """Invariant: the fields no table lists are named (sorted; printable ASCII only, so a
    field name can never break the header into lines); documented ones are not."""
    from gateway.api.accepted import OPENAI_CHAT, unknown_fields

    body = {"model": "m", "messages": [], "max_token": 3, "temprature": 0, "a\r\nb": 1}
    assert unknown_fields(body, OPENAI_CHAT) == ("a??b", "max_token", "temprature")
    assert unknown_fields({"model": "m", "max_tokens": 3}, OPENAI_CHAT) == ()
