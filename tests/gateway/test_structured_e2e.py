"""End to end: structured output through the real `openai` SDK against `vision-gateway serve`.

Pinned: json_schema (nested objects, arrays, enums, required, strict) completions parse and
validate, streamed and not, and streaming gives the same text; the SDK's
`beta.chat.completions.parse` with a Pydantic model returns a parsed object; an image
extraction repeated with the same schema hits the KV and grammar caches and answers the same;
a schema the server cannot enforce is a 400 naming the schema path; grammar cache counters are
in /metrics.
"""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from support import LEXER_BOMB, ServerProcess, data_uri, noise_png

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 20},
        "kind": {"enum": ["chart", "table", "photo"]},
        "rows": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "label": {"type": "string", "maxLength": 8},
                    "value": {"type": "integer", "minimum": -100, "maximum": 100},
                },
                "required": ["label", "value"],
                "additionalProperties": False,
            },
        },
        "ok": {"type": "boolean"},
    },
    "required": ["title", "kind", "rows", "ok"],
    "additionalProperties": False,
}
FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "figure", "schema": SCHEMA, "strict": True},
}


class Line(BaseModel):
    label: str = Field(max_length=8)
    qty: int = Field(ge=0, le=99)


class Receipt(BaseModel):
    shop: str = Field(max_length=12)
    currency: Literal["EUR", "USD"]
    lines: list[Line] = Field(max_length=2)


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--max-batch", "8", "--kv-block-tokens", "8")  # short prompts
    yield proc
    assert proc.stop(), proc.log()


def _messages(question: str, image: str | None = None) -> list[dict]:
    content: list[dict] = [{"type": "text", "text": question}]
    if image is not None:
        content.insert(0, {"type": "image_url", "image_url": {"url": image}})
    return [{"role": "user", "content": content}]


def test_json_schema_completions_validate_streamed_and_not(server: ServerProcess) -> None:
    """Invariant: many sampled completions under a strict nested schema all parse, validate
    and end with "stop"; the streamed answer is the same text as the non-streamed one."""
    client = server.client()
    texts = set()
    for seed in range(8):
        kw = dict(
            model="test",
            messages=_messages(f"describe figure {seed}"),
            response_format=FORMAT,
            temperature=1.0,
            seed=seed,
            max_tokens=300,
        )
        r = client.chat.completions.create(**kw)
        text = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop", text
        jsonschema.validate(json.loads(text), SCHEMA)
        texts.add(text)
        if seed < 3:
            chunks = list(client.chat.completions.create(**kw, stream=True))
            streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert streamed == text
            assert chunks[-1].choices[0].finish_reason == "stop"
    assert len(texts) > 4


def test_parse_with_a_pydantic_model(server: ServerProcess) -> None:
    """Invariant: the SDK's parse helper (strict json_schema from a Pydantic model) gets a
    parsed, validated object back, greedy and sampled."""
    client = server.client()
    for seed in (None, 1, 2):
        completion = client.beta.chat.completions.parse(
            model="test",
            messages=_messages("read the receipt"),
            response_format=Receipt,
            temperature=0 if seed is None else 1.0,
            seed=seed,
            max_tokens=200,
        )
        parsed = completion.choices[0].message.parsed
        assert isinstance(parsed, Receipt)
        assert parsed == Receipt.model_validate_json(completion.choices[0].message.content)


def test_a_repeat_image_extraction_hits_both_caches(server: ServerProcess) -> None:
    """Invariant: the same image and schema again reuses the image's KV (cached tokens) and
    the compiled grammar, and answers with the same tokens."""
    client = server.client()
    image = data_uri(noise_png(21, 84, 56))
    before = httpx.get(f"{server.base_url}/v1/cache/stats").json()["grammar"]
    answers = []
    for question in ("extract the figure", "extract the figure"):
        r = client.chat.completions.create(
            model="test",
            messages=_messages(question, image),
            response_format=FORMAT,
            temperature=0,
            max_tokens=300,
            logprobs=True,
        )
        answers.append(r)
    assert answers[1].usage.prompt_tokens_details.cached_tokens > 0
    assert answers[0].choices[0].message.content == answers[1].choices[0].message.content
    lps = [[t.logprob for t in a.choices[0].logprobs.content] for a in answers]
    assert lps[1] == pytest.approx(lps[0], abs=1e-4)
    after = httpx.get(f"{server.base_url}/v1/cache/stats").json()["grammar"]
    assert after["hits"] >= before["hits"] + 2  # FORMAT was compiled by the first test
    metrics = httpx.get(f"{server.base_url}/metrics").text
    assert "vision_gateway_grammar_cache_hits_total" in metrics
    assert 'vision_gateway_cache_bytes{cache="grammar"}' in metrics


def test_an_unsupported_schema_is_a_400_naming_the_path(server: ServerProcess) -> None:
    """Invariant: the SDK raises BadRequestError whose param is the offending schema path,
    and the server keeps serving."""
    client = server.client()
    bad = {"type": "object", "properties": {"ids": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="test",
            messages=_messages("hi"),
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": bad}},
        )
    error = info.value.body
    assert error["param"] == "response_format.json_schema.schema.properties.ids.uniqueItems"
    assert error["code"] == "unsupported_schema"
    r = client.chat.completions.create(
        model="test", messages=_messages("still there?"), max_tokens=3, temperature=0
    )
    assert r.choices[0].finish_reason == "length"


def test_a_schema_the_lexer_gives_up_on_is_a_400_every_time(server: ServerProcess) -> None:
    """Invariant: a schema that passes validation but outgrows the grammar engine while
    decoding (a nested bounded repetition in `pattern`) is a 400 `unsupported_schema` with
    llguidance's one-line reason, for a tool call as for `response_format`, and again on a
    repeat (was a 500 with the parser's state, then an empty 200 without the forced call)."""
    client = server.client()
    bomb = LEXER_BOMB
    asks = [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "b", "schema": bomb}}},
        {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": bomb}}],
            "tool_choice": "required",
        },  # fmt: skip
    ]
    for extra, param in [
        *zip(asks, ("response_format", "tools")),
        *zip(asks, ("response_format", "tools")),
    ]:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model="test", messages=_messages("hi"), max_tokens=16, **extra
            )
        error = info.value.body
        assert error["code"] == "unsupported_schema" and "lexer error" in error["message"]
        assert error["param"] == param
        assert "<state>" not in error["message"]
