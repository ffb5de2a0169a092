"""`response_format` at the edge: what is accepted, and what a refusal names.

Pinned here: text means no grammar; json_object and json_schema give a grammar; every
malformed, invalid, unsupported or oversized format is a 400 whose `param` is the path of the
offending field inside the schema; strict mode closes objects without touching the input.
"""

from __future__ import annotations

import copy

import pytest

from gateway.api.openai.parse import parse_chat_request
from gateway.errors import APIError
from gateway.structured.response_format import MAX_SCHEMA_BYTES, response_format_grammar
from gateway.structured.schema_check import MAX_DEPTH, close_objects

S = "response_format.json_schema.schema"


def _fmt(schema: object, **extra: object) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, **extra}}


def test_text_is_free_and_json_formats_give_a_grammar() -> None:
    """Invariant: `text` (or no format) means no constraint; json_object and json_schema
    each give an llguidance grammar that reaches the engine through the chat request."""
    assert response_format_grammar(None) is None
    assert response_format_grammar({"type": "text"}) is None
    assert response_format_grammar({"type": "json_object"})
    grammar = response_format_grammar(_fmt({"type": "object"}, strict=True))
    assert grammar
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert parse_chat_request(body).grammar is None
    chat = parse_chat_request({**body, "response_format": _fmt({"type": "object"}, strict=True)})
    assert chat.grammar == grammar


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        ("json", "response_format"),
        ({"type": "xml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"schema": {}}},
            "response_format.json_schema.name",
        ),
        (_fmt({}, strict="yes"), "response_format.json_schema.strict"),
        (_fmt([1]), S),
        (_fmt({"properties": {"a": {"type": "strin"}}}), f"{S}.properties.a.type"),
        (_fmt({"properties": {"a": {"minimum": "x"}}}), f"{S}.properties.a.minimum"),
        (_fmt({"items": {"type": "array", "uniqueItems": True}}), f"{S}.items.uniqueItems"),
        (_fmt({"properties": {"a": {"not": {"type": "integer"}}}}), f"{S}.properties.a.not"),
        (_fmt({"properties": {"a": {"$ref": "#/$defs/none"}}}), f"{S}.properties.a.$ref"),
        (_fmt({"anyOf": [{"type": "string", "pattern": "(("}]}), f"{S}.anyOf[0].pattern"),
    ],
)
def test_a_refusal_names_the_path(response_format: object, param: str) -> None:
    """Invariant: a malformed, invalid or unsupported format is a 400 whose param is the
    exact path of what to fix, and whose message says it."""
    with pytest.raises(APIError) as info:
        response_format_grammar(response_format)
    assert info.value.status == 400
    assert info.value.param == param
    assert f"`{param}`" in info.value.message


def test_a_schema_too_large_is_refused_by_the_documented_limits() -> None:
    """Invariant: over MAX_SCHEMA_BYTES (compact JSON) or MAX_DEPTH nesting is a 400 with
    code schema_too_large, and just under the byte limit is fine."""
    names = {f"p{i}": {"type": "integer"} for i in range(MAX_SCHEMA_BYTES // 20)}
    with pytest.raises(APIError) as info:
        response_format_grammar(_fmt({"type": "object", "properties": names}))
    assert (info.value.status, info.value.code, info.value.param) == (400, "schema_too_large", S)
    assert str(MAX_SCHEMA_BYTES) in info.value.message
    deep: dict = {"type": "integer"}
    for _ in range(MAX_DEPTH):
        deep = {"type": "array", "items": deep}
    with pytest.raises(APIError) as info:
        response_format_grammar(_fmt(deep))
    assert info.value.code == "schema_too_large"
    fits = {f"p{i}": {"type": "integer"} for i in range(MAX_SCHEMA_BYTES // 40)}
    assert response_format_grammar(_fmt({"type": "object", "properties": fits}))


def test_strict_closes_every_object_and_leaves_the_request_alone() -> None:
    """Invariant: strict mode gives every object schema without additionalProperties
    `additionalProperties: false` (nested, in arrays, in $defs, in anyOf), keeps explicit
    ones, and does not mutate the schema it was given."""
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "string"}}},
            "list": {"type": "array", "items": {"$ref": "#/$defs/item"}},
            "either": {"anyOf": [{"type": "object"}, {"type": "null"}]},
            "open": {"type": "object", "additionalProperties": True},
        },
        "$defs": {"item": {"type": "object", "properties": {"x": {"type": "integer"}}}},
    }
    before = copy.deepcopy(schema)
    closed = close_objects(schema)
    assert schema == before
    assert closed["additionalProperties"] is False
    props = closed["properties"]
    assert props["a"]["additionalProperties"] is False
    assert closed["$defs"]["item"]["additionalProperties"] is False
    assert props["either"]["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in props["either"]["anyOf"][1]
    assert props["open"]["additionalProperties"] is True
