"""`output_config` of a Messages body (gateway.api.anthropic.output).

Pinned: `effort` (low ... max) turns thinking on where the model thinks (optional: a model
that does not think answers without), `thinking: disabled` still wins; `format` (and the
deprecated top-level `output_format`) becomes the answer's grammar, named by its field,
refused next to tools that constrain the answer; other keys are ignored and named; mistakes
are 400s naming the field (a schema's own path).
"""

from __future__ import annotations

import pytest

from gateway.api.anthropic.parse import parse_messages_request
from gateway.errors import APIError

BASE = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}
FORMAT = {"type": "json_schema", "schema": SCHEMA}
TOOL = {"name": "f", "input_schema": {"type": "object"}}


def _parse(**fields: object):
    return parse_messages_request({**BASE, **fields})


def test_effort_turns_thinking_on_where_the_model_thinks() -> None:
    r = _parse(output_config={"effort": "max"})
    assert (r.thinking, r.thinking_optional, r.thinking_budget) == (True, True, None)
    assert _parse(output_config={"effort": "low"}, thinking={"type": "disabled"}).thinking is False
    enabled = _parse(output_config={"effort": "low"},
                     thinking={"type": "enabled", "budget_tokens": 2})  # fmt: skip
    assert (enabled.thinking, enabled.thinking_optional) == (True, False)
    assert _parse(output_config={}).thinking is None


def test_format_is_the_answers_grammar() -> None:
    r = _parse(output_config={"format": FORMAT})
    assert r.grammar is not None and r.grammar_field == "output_config.format"
    old = _parse(output_format=FORMAT)
    assert old.grammar == r.grammar and old.grammar_field == "output_format"
    unconstrained = _parse(output_config={"format": FORMAT}, tools=[TOOL],
                           tool_choice={"type": "none"})  # fmt: skip
    assert unconstrained.grammar == r.grammar


def test_other_keys_are_named() -> None:
    r = _parse(output_config={"effort": "high", "task_budget": {"type": "tokens", "total": 9}})
    assert r.ignored_fields == ("output_config.task_budget",)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"output_config": "high"}, "output_config"),
        ({"output_config": {"effort": "none"}}, "output_config.effort"),
        ({"output_config": {"format": {"type": "json_object"}}}, "output_config.format.type"),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
        ({"output_config": {"format": {"type": "json_schema",
                                       "schema": {"type": "object", "not": {}}}}},
         "output_config.format.schema.not"),
        ({"output_config": {"format": FORMAT}, "tools": [TOOL]}, "output_config.format"),
        ({"output_config": {"format": FORMAT}, "output_format": FORMAT}, "output_format"),
    ],
)  # fmt: skip
def test_mistakes_name_the_field(fields: dict, param: str) -> None:
    with pytest.raises(APIError) as info:
        _parse(**fields)
    assert info.value.status == 400 and info.value.param == param
