"""The tools a request offers and how it lets the model use them, whatever API it came
through: frozen values built by the wire parsers, read by the prompt builder.

    Tool(name, description, parameters, strict)       one function the model may call
    ToolChoice(mode, name)                            none | auto | required | named
    ToolSet(tools, choice, parallel)                  what a request offers
    ToolCall(id, name, arguments)                     a call in the history (or an answer)

`check_tool` validates one tool as the client sent it (name, JSON Schema) and raises a 400
naming the field; the schema must be one llguidance can enforce (the same rules as
`response_format`, gateway.structured).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gateway.errors import invalid
from gateway.structured.response_format import checked_schema

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 128
MODES = ("none", "auto", "required", "named")
# A function without `parameters` takes no arguments: exactly `{}`.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class Tool:
    """One function. `parameters` is the validated JSON Schema of its arguments object
    (strict mode already applied: closed objects)."""

    name: str
    description: str
    parameters_json: str  # the schema as compact JSON (hashable, immutable)

    @property
    def parameters(self) -> dict[str, Any]:
        return json.loads(self.parameters_json)

    def template_dict(self) -> dict[str, Any]:
        """The tool as chat templates expect it (OpenAI's shape, as transformers passes it)."""
        function: dict[str, Any] = {"name": self.name, "description": self.description}
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    """`mode` none: never call (tools are still shown to the model); auto: text or calls;
    required: at least one call (exactly one without parallel calls); named: exactly one call
    of `name`, whatever `parallel` says."""

    mode: str = "auto"
    name: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"tool choice mode must be one of {MODES}, got {self.mode!r}")
        if (self.mode == "named") != (self.name is not None):
            raise ValueError("a named tool choice needs a name, other modes none")


@dataclass(frozen=True)
class ToolSet:
    """What a request offers: its tools (non-empty, names unique), the choice and whether
    several calls may come in one answer."""

    tools: tuple[Tool, ...]
    choice: ToolChoice = ToolChoice()
    parallel: bool = True

    @property
    def many(self) -> bool:
        """Whether one answer may hold several calls. A named choice is exactly one call of
        its tool (OpenAI's "forced function": a random-weight model under a per-tool grammar
        otherwise chained calls until max_tokens); `parallel_tool_calls: false` is one call."""
        return self.parallel and self.choice.mode != "named"

    @property
    def constrained(self) -> bool:
        """Whether answers are decoded under the tool grammar (and split into calls)."""
        return self.choice.mode != "none"

    def offered(self) -> tuple[Tool, ...]:
        """The tools a call may name: the named one only, or all."""
        if self.choice.mode == "named":
            return tuple(t for t in self.tools if t.name == self.choice.name)
        return self.tools


@dataclass(frozen=True)
class ToolCall:
    """A call: its id (the client's, or one we made), the function's name and its arguments
    as JSON text (an object)."""

    id: str
    name: str
    arguments: str

    def template_dict(self) -> dict[str, Any]:
        """The call as chat templates read an assistant message's `tool_calls` entry (the
        arguments as a mapping: templates write them with `tojson` or as a string)."""
        try:
            arguments: Any = json.loads(self.arguments) if self.arguments else {}
        except json.JSONDecodeError:
            arguments = self.arguments
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": arguments},
        }


def check_tool(
    name: Any, description: Any, parameters: Any, strict: Any, where: str, schema_field: str
) -> Tool:
    """One tool as sent: `where` is the tool's dotted path, `schema_field` the name of its
    schema field there (`function.parameters`, `input_schema`, `parameters`). Raises a 400
    naming the field for a bad name, a description that is not a string, or a schema that is
    not a JSON Schema object this server can enforce."""
    if not isinstance(name, str) or not NAME.match(name):
        raise invalid(
            f"`{where}.name` must be 1-64 letters, digits, underscores or dashes",
            f"{where}.name",
        )
    if description is not None and not isinstance(description, str):
        raise invalid(f"`{where}.description` must be a string", f"{where}.description")
    if strict is not None and not isinstance(strict, bool):
        raise invalid(f"`{where}.strict` must be true or false", f"{where}.strict")
    at = f"{where}.{schema_field}"
    if parameters is None:
        schema = NO_PARAMETERS
    elif not isinstance(parameters, dict):
        raise invalid(f"`{at}` must be a JSON Schema object", at)
    else:
        if parameters.get("type", "object") != "object":
            raise invalid(f"`{at}.type` must be 'object': arguments are a JSON object", at)
        schema = checked_schema({"type": "object", **parameters}, bool(strict), at)
    compact = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    return Tool(name, description or "", compact)


def check_tools(tools: list[Tool], where: str, name_at: str = "name") -> tuple[Tool, ...]:
    """A request's tools: at most MAX_TOOLS, names unique (400 naming the duplicate's field:
    `where[i].name_at`, e.g. Chat Completions' `tools[1].function.name`)."""
    if len(tools) > MAX_TOOLS:
        raise invalid(f"`{where}` accepts at most {MAX_TOOLS} tools", where)
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in seen:
            at = f"{where}[{i}].{name_at}"
            raise invalid(f"`{at}`: {tool.name!r} is defined twice", at)
        seen.add(tool.name)
    return tuple(tools)


def check_named(choice: ToolChoice, tools: tuple[Tool, ...], where: str) -> None:
    """A named choice must name one of the tools (400 naming `where`)."""
    if choice.mode == "named" and all(t.name != choice.name for t in tools):
        names = ", ".join(t.name for t in tools)
        raise invalid(f"`{where}`: {choice.name!r} is not one of the tools ({names})", where)
