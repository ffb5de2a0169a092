"""OpenAI's `response_format` -> the llguidance grammar the engine enforces token by token.

    {"type": "text"}                      free text (None)
    {"type": "json_object"}               any JSON object
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": bool}}

Bounded output: whitespace between JSON tokens is not free. The grammar fixes the separators
to ", " and ": " and allows no other whitespace outside strings (llguidance's
`whitespace_flexible: false`), and these options override any `x-guidance` in the schema, so a
model cannot loop forever in indentation; a schema whose strings, arrays, numbers (with
`minimum`/`maximum`) and property sets are bounded always closes within a fixed number of
tokens. With `strict: true` an object without `additionalProperties` allows no other
properties (OpenAI's strict mode requires `additionalProperties: false`; the SDK's `parse`
helper sends it), so a strict schema's property set is bounded too.

Every refusal is an `APIError` (400) whose `param` is the path to the offending part of the
schema, e.g. `response_format.json_schema.schema.properties.tags.uniqueItems`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from llguidance import LLMatcher

from gateway.errors import invalid
from gateway.structured.schema_check import check_depth, check_schema, close_objects, locate

MAX_SCHEMA_BYTES = 64 * 1024  # the schema as compact JSON; larger ones are refused
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_TYPES = "'text', 'json_object' or 'json_schema'"


def response_format_grammar(raw: Any) -> str | None:
    """The llguidance grammar for a request body's `response_format` (None: free text).

    Raises APIError (400) naming the field or schema path for anything malformed, unsupported
    or over `MAX_SCHEMA_BYTES`.
    """
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise invalid(
            f"`response_format` must be an object with `type` {_TYPES}", "response_format"
        )
    kind = raw.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return _grammar({"type": "object"}, strict=False, where="response_format")
    if kind != "json_schema":
        raise invalid(f"`response_format.type` must be {_TYPES}", "response_format.type")
    spec = raw.get("json_schema")
    where = "response_format.json_schema"
    if not isinstance(spec, dict):
        raise invalid(f"`{where}` must be an object with `name` and `schema`", where)
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid(
            f"`{where}.name` is required: 1-64 letters, digits, underscores or dashes",
            f"{where}.name",
        )
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid(f"`{where}.strict` must be true or false", f"{where}.strict")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise invalid(f"`{where}.schema` must be a JSON Schema object", f"{where}.schema")
    return _grammar(schema, strict=bool(strict), where=f"{where}.schema")


def _grammar(schema: dict[str, Any], strict: bool, where: str) -> str:
    return LLMatcher.grammar_from_json_schema(  # type: ignore[arg-type]
        checked_schema(schema, strict, where), overrides=JSON_OPTIONS
    )


def checked_schema(schema: dict[str, Any], strict: bool, where: str) -> dict[str, Any]:
    """`schema` validated as one this server can enforce (closed objects when `strict`),
    ready for llguidance with `JSON_OPTIONS`. Raises APIError (400) naming the path of the
    offending part (`where` is the schema's own path), or `schema_too_large`."""
    check_depth(schema, where)
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_SCHEMA_BYTES:
        raise invalid(
            f"`{where}` is {size} bytes as compact JSON; this server accepts schemas of at "
            f"most {MAX_SCHEMA_BYTES} bytes",
            where,
            "schema_too_large",
        )
    check_schema(schema, where)
    if strict:
        schema = close_objects(schema)
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)  # type: ignore[arg-type]
        error = LLMatcher.validate_grammar(grammar)
    except Exception as exc:  # llguidance refuses what it cannot read: the client's schema
        raise invalid(f"`{where}` could not be compiled: {exc}", where) from None
    if error:
        path = locate(schema, error, where)
        first = " ".join(error.split())[:300]
        raise invalid(
            f"`{path}`: this server cannot enforce this schema ({first}); supported: JSON "
            "Schema types, properties, required, additionalProperties, items, prefixItems, "
            "enum, const, anyOf/oneOf/allOf, $ref/$defs, minLength/maxLength, pattern, "
            "format, minItems/maxItems, minimum/maximum",
            path,
            "unsupported_schema",
        )
    return schema
