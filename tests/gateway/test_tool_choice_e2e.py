"""End to end: a forced tool choice is exactly one call, through the real `openai` and
`anthropic` SDKs against `vision-gateway serve` on the tiny Qwen2-VL at temperature 1.

Pinned: a named choice (Chat Completions `{"type": "function", "function": {"name"}}`,
Responses `{"type": "function", "name"}`, Anthropic `{"type": "tool", "name"}`) answers with
one call of that tool and nothing else, parallel calls allowed or not (OpenAI's "forced
function"; was: seeds 3 and 5 made 4 and 2 calls, and a client's token budget ran out on
them); `required` with `parallel_tool_calls: false` is one call too.
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest
from support import ServerProcess

CLICK = {
    "type": "object",
    "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 1023},
        "button": {"enum": ["left", "right"]},
    },
    "required": ["x", "button"],
    "additionalProperties": False,
}
TYPE = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 10}},
    "required": ["text"],
    "additionalProperties": False,
}
SCHEMAS = {"click": CLICK, "type_text": TYPE}
ASK = "click the OK button"
SEEDS = (3, 5, 0, 1, 2, 7, 11)
MAX_TOKENS = 200  # room for several calls: a single call is ~40 tokens


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--max-batch", "8", "--no-warmup")
    yield proc
    assert proc.stop(), proc.log()


def _valid(name: str, arguments: str | dict) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, SCHEMAS[name])


@pytest.mark.parametrize("seed", SEEDS)
def test_chat_completions_named_choice_is_one_call(server: ServerProcess, seed: int) -> None:
    r = server.client().chat.completions.create(
        model="test",
        messages=[{"role": "user", "content": ASK}],
        tools=[{"type": "function", "function": {"name": n, "parameters": s}}
               for n, s in SCHEMAS.items()],
        tool_choice={"type": "function", "function": {"name": "type_text"}},
        temperature=1.0, seed=seed, max_tokens=MAX_TOKENS,
    )  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    assert [c.function.name for c in choice.message.tool_calls] == ["type_text"]
    _valid("type_text", choice.message.tool_calls[0].function.arguments)


@pytest.mark.parametrize("seed", SEEDS)
def test_chat_completions_required_without_parallel_is_one_call(
    server: ServerProcess, seed: int
) -> None:
    r = server.client().chat.completions.create(
        model="test",
        messages=[{"role": "user", "content": ASK}],
        tools=[{"type": "function", "function": {"name": n, "parameters": s}}
               for n, s in SCHEMAS.items()],
        tool_choice="required", parallel_tool_calls=False,
        temperature=1.0, seed=seed, max_tokens=MAX_TOKENS,
    )  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0].function
    _valid(call.name, call.arguments)


@pytest.mark.parametrize("seed", SEEDS)
def test_responses_named_choice_is_one_call(server: ServerProcess, seed: int) -> None:
    r = server.client().responses.create(
        model="test",
        input=ASK,
        tools=[{"type": "function", "name": n, "parameters": s, "strict": True}
               for n, s in SCHEMAS.items()],
        tool_choice={"type": "function", "name": "type_text"},
        temperature=1.0, max_output_tokens=MAX_TOKENS, extra_body={"seed": seed},
    )  # fmt: skip
    assert r.status == "completed", r
    assert [(item.type, item.name) for item in r.output] == [("function_call", "type_text")]
    _valid("type_text", r.output[0].arguments)


def test_anthropic_named_choice_is_one_tool_use(server: ServerProcess) -> None:
    """Anthropic's API has no seed: eight draws at its default temperature, 1 (this SDK
    version has no `temperature` argument), each one tool_use."""
    client = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
    for _ in range(8):
        m = client.messages.create(
            model="test",
            max_tokens=MAX_TOKENS,
            messages=[{"role": "user", "content": ASK}],
            tools=[{"name": n, "input_schema": s} for n, s in SCHEMAS.items()],
            tool_choice={"type": "tool", "name": "click"},
        )
        assert m.stop_reason == "tool_use", m
        assert [(b.type, getattr(b, "name", None)) for b in m.content] == [("tool_use", "click")]
        _valid("click", m.content[0].input)
