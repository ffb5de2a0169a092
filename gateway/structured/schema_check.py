"""Walking a request's JSON Schema: metaschema validation with the offending path, strict
mode's closed objects, and finding where an llguidance error points.

Pure functions over the decoded schema (plain dicts and lists); nothing here is mutated.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator, SchemaError
from jsonschema.validators import validator_for

from gateway.errors import invalid

# Keywords whose value is a schema, a list of schemas, or a map of name -> schema.
_ONE = (
    "items",
    "additionalProperties",
    "not",
    "contains",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "additionalItems",
)
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def _path(where: str, parts: tuple[Any, ...] | list[Any]) -> str:
    out = where
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


MAX_DEPTH = 64  # nesting of objects and arrays inside a schema


def _depth(node: Any) -> int:
    """How deeply dicts and lists nest in `node` (iterative: no recursion limit to hit)."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            if level <= MAX_DEPTH:
                values = item.values() if isinstance(item, dict) else item
                stack.extend((v, level + 1) for v in values)
    return deepest


def check_depth(schema: dict[str, Any], where: str) -> None:
    """Refuse a schema nested deeper than `MAX_DEPTH` (before anything recursive reads it)."""
    if _depth(schema) > MAX_DEPTH:
        raise invalid(f"`{where}` nests deeper than {MAX_DEPTH} levels", where, "schema_too_large")


def check_schema(schema: dict[str, Any], where: str) -> None:
    """Refuse a schema that is not valid JSON Schema (its own `$schema` draft, else 2020-12),
    naming the path of the first error."""
    try:
        cls = validator_for(schema, default=Draft202012Validator)
        cls.check_schema(schema)
    except SchemaError as exc:
        path = _path(where, list(exc.absolute_path))
        raise invalid(f"`{path}` is not valid JSON Schema: {exc.message}", path) from None
    except Exception as exc:  # e.g. an unknown `$schema` draft: still the client's schema
        raise invalid(f"`{where}` is not a usable JSON Schema: {exc}", where) from None


def subschemas(schema: Any, parts: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], dict]]:
    """Every (path, subschema) of `schema`, depth first, the root first."""
    if not isinstance(schema, dict):
        return
    yield parts, schema
    for key in _ONE:
        if isinstance(schema.get(key), dict):
            yield from subschemas(schema[key], (*parts, key))
    for key in _MANY:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                yield from subschemas(sub, (*parts, key, i))
    if isinstance(schema.get("items"), list):  # draft 4-7 tuple form
        for i, sub in enumerate(schema["items"]):
            yield from subschemas(sub, (*parts, "items", i))
    for key in _MAP:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                yield from subschemas(sub, (*parts, key, name))


def close_objects(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `schema` in which every object schema without `additionalProperties` has
    `additionalProperties: false` (strict mode: only the listed properties)."""

    def walk(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out = dict(node)
        for key in _ONE:
            if isinstance(out.get(key), dict):
                out[key] = walk(out[key])
        for key in (*_MANY, "items"):
            if isinstance(out.get(key), list):
                out[key] = [walk(s) for s in out[key]]
        for key in _MAP:
            if isinstance(out.get(key), dict):
                out[key] = {name: walk(s) for name, s in out[key].items()}
        is_object = out.get("type") == "object" or "properties" in out
        if is_object and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out

    return walk(schema)


_QUOTED = re.compile(r"""["']([^"'\n]+)["']""")


def locate(schema: dict[str, Any], error: str, where: str) -> str:
    """The path of the schema part an llguidance error message points at: the first
    subschema holding a keyword the message quotes (e.g. `Unimplemented keys: ["not"]`), a
    `$ref` to the pointer it names, or a `pattern` it quotes; else the schema itself."""
    quoted = set(_QUOTED.findall(error))
    for parts, sub in subschemas(schema):
        for key, value in sub.items():
            if key in quoted:
                return _path(where, (*parts, key))
            if key == "$ref" and isinstance(value, str) and any(value.endswith(q) for q in quoted):
                return _path(where, (*parts, key))
            if key == "pattern" and isinstance(value, str) and value and value in error:
                return _path(where, (*parts, key))
    return where
