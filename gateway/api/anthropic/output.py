"""`output_config` of a Messages body: `effort` (low, medium, high, xhigh, max: thinking on
where the model thinks, as a Chat Completions effort; gateway.api.thinking_fields) and
`format` ({type: json_schema, schema}: Anthropic's structured outputs, enforced by the same
grammar as Chat Completions' `response_format`, every object closed as Anthropic requires).
The deprecated top-level `output_format` is the same `format`. Other keys (`task_budget`,
...) are ignored and named. Pure; every mistake is a 400 naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llguidance import LLMatcher

from gateway.api.thinking_fields import anthropic_effort
from gateway.errors import invalid
from gateway.structured.response_format import JSON_OPTIONS, checked_schema


@dataclass(frozen=True)
class OutputConfig:
    """The effort (as sent; None: none), the answer's grammar (None: free text) and the field
    it came from, and the keys named as ignored."""

    effort: Any = None
    grammar: str | None = None
    grammar_field: str = "output_config.format"
    ignored: tuple[str, ...] = ()


def output_config(body: dict[str, Any]) -> OutputConfig:
    raw = body.get("output_config")
    if raw is None:
        raw = {}
    elif not isinstance(raw, dict):
        raise invalid("`output_config` must be an object such as {effort: 'high'}",
                      "output_config")  # fmt: skip
    effort = raw.get("effort")
    anthropic_effort(effort, "output_config.effort")
    known = ("effort", "format")
    ignored = tuple(f"output_config.{k}" for k, v in raw.items() if k not in known and v)
    fmt, field = raw.get("format"), "output_config.format"
    if body.get("output_format") is not None:
        if fmt is not None:
            raise invalid(
                "`output_format` is the deprecated name of `output_config.format`: send only "
                "`output_config.format`",
                "output_format",
            )
        fmt, field = body["output_format"], "output_format"
    return OutputConfig(effort, _grammar(fmt, field), field, ignored)


def _grammar(raw: Any, field: str) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.get("type") != "json_schema":
        raise invalid(
            f"`{field}` must be {{type: 'json_schema', schema: {{...}}}}", f"{field}.type"
        )
    schema = raw.get("schema")
    if not isinstance(schema, dict):
        raise invalid(f"`{field}.schema` must be a JSON Schema object", f"{field}.schema")
    checked = checked_schema(schema, True, f"{field}.schema")
    return LLMatcher.grammar_from_json_schema(checked, overrides=JSON_OPTIONS)  # type: ignore[arg-type]
