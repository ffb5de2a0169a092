"""A Responses body's `tools` array: what the model is offered, under which names, and what
is left out.

    {type: function, name, description, parameters, strict}   offered as is
    {type: namespace, name, description, tools: [function | custom tools]}
                                                              each inner tool offered under
                                                              its flat name `<ns>__<name>`
    {type: custom, name, description, format: {type: text}}   a function of one string
                                                              argument, `input`
    built-in tools (web_search, file_search, mcp, ...)        left out of the prompt, named
                                                              back as `tools[i]` in
                                                              x-ignored-fields

The flat name of a namespaced tool is the one Codex itself uses where a namespace cannot be
kept (codex-rs/protocol/src/tool_name.rs: the namespace's trailing and the name's leading
underscores trimmed, joined by `__`); a call the model makes under it goes back to the client
as a `function_call` with `namespace` and the inner `name`, as the Responses API returns it
(`ToolNames`). A custom tool's call is a `custom_tool_call` whose `input` is the string the
model wrote. A custom tool whose `format` is a grammar (lark, regex) is a 400: the grammar
cannot be enforced inside the call's JSON, and an unenforced one would silently let through
input the client declared invalid. Built-in tools run on OpenAI's side; this server runs
none, and a tool offered is one the model may leave unused, so dropping them changes no
answer the client could rely on. Pure validation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.api import fields
from gateway.errors import invalid
from gateway.tools.spec import Tool, ToolChoice, ToolSet, check_named, check_tool, check_tools

BUILT_IN = frozenset(
    {
        "web_search",
        "web_search_2025_08_26",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "file_search",
        "computer",
        "computer_use_preview",
        "code_interpreter",
        "image_generation",
        "mcp",
        "local_shell",
        "shell",
        "apply_patch",
        "tool_search",
        "programmatic_tool_calling",
    }
)
NAMESPACE_DELIMITER = "__"
# A custom tool's one argument: the free text the model writes for it.
CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
    "additionalProperties": False,
}
_CHOICES = "'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}"


@dataclass(frozen=True)
class WireName:
    """How the client names a tool the model sees under a flat name."""

    name: str
    namespace: str | None = None
    custom: bool = False


@dataclass(frozen=True)
class ToolNames:
    """Flat name -> wire name, for the tools whose two differ (namespaced or custom)."""

    entries: tuple[tuple[str, WireName], ...] = ()

    def wire(self, flat: str) -> WireName:
        return dict(self.entries).get(flat) or WireName(flat)


@dataclass(frozen=True)
class ToolList:
    """The parsed `tools` and `tool_choice`."""

    tools: ToolSet | None = None
    echo: tuple[dict[str, Any], ...] = ()  # as the response body repeats them
    names: ToolNames = ToolNames()
    dropped: tuple[str, ...] = ()  # `tools[i]` of each built-in tool left out


def flat_name(namespace: str, name: str) -> str:
    """Codex's canonical flat name of a namespaced tool."""
    return f"{namespace.rstrip('_')}{NAMESPACE_DELIMITER}{name.lstrip('_')}"


@dataclass
class _Builder:
    tools: list[Tool] = field(default_factory=list)
    at: list[str] = field(default_factory=list)  # each tool's name field
    names: list[tuple[str, WireName]] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def add(self, entry: Any, where: str, namespace: str | None = None) -> dict[str, Any]:
        """One function or custom tool (in a namespace or not); returns its echo."""
        kind = entry.get("type") if isinstance(entry, dict) else None
        if kind not in ("function", "custom"):
            inside = "function or custom tools" if namespace else "function tools"
            raise invalid(f"`{where}.type` {kind!r}: expected {inside}", f"{where}.type")
        name = entry.get("name")
        if kind == "function" and isinstance(entry.get("function"), dict) and name is None:
            raise invalid(
                f"`{where}`: the Responses API takes function tools flat: move `name`, "
                "`description` and `parameters` out of `function` to the tool itself",
                f"{where}.function",
            )
        if not isinstance(name, str) or not name:
            raise invalid(f"`{where}.name` must be a non-empty string", f"{where}.name")
        flat = flat_name(namespace, name) if namespace else name
        if kind == "custom":
            _check_custom_format(entry.get("format"), f"{where}.format")
            strict, parameters = True, CUSTOM_PARAMETERS
        else:
            strict = True if entry.get("strict") is None else entry.get("strict")
            parameters = entry.get("parameters")
        tool = check_tool(
            flat, entry.get("description"), parameters, strict, where, "parameters"
        )  # fmt: skip
        self.tools.append(tool)
        self.at.append(f"{where}.name")
        if namespace or kind == "custom":
            self.names.append((flat, WireName(name, namespace, kind == "custom")))
        if kind == "custom":
            return {"type": "custom", "name": name, "description": entry.get("description"),
                    "format": {"type": "text"}}  # fmt: skip
        return {"type": "function", "name": name, "description": entry.get("description"),
                "parameters": parameters, "strict": strict}  # fmt: skip

    def namespace(self, entry: dict[str, Any], where: str) -> dict[str, Any]:
        name, inner = entry.get("name"), entry.get("tools")
        if not isinstance(name, str) or not name:
            raise invalid(f"`{where}.name` must be a non-empty string", f"{where}.name")
        if not isinstance(inner, list) or not inner:
            raise invalid(
                f"`{where}.tools` must be a non-empty array of function tools", f"{where}.tools"
            )
        description = entry.get("description")
        if description is not None and not isinstance(description, str):
            raise invalid(f"`{where}.description` must be a string", f"{where}.description")
        tools = [self.add(t, f"{where}.tools[{j}]", name) for j, t in enumerate(inner)]
        return {"type": "namespace", "name": name, "description": description or "",
                "tools": tools}  # fmt: skip

    def checked(self) -> tuple[Tool, ...]:
        seen: dict[str, str] = {}
        for tool, at in zip(self.tools, self.at, strict=True):
            if tool.name in seen:
                raise invalid(
                    f"`{at}`: {tool.name!r} is defined twice (also at `{seen[tool.name]}`)", at
                )
            seen[tool.name] = at
        return check_tools(self.tools, "tools")


def _check_custom_format(raw: Any, where: str) -> None:
    if raw is None or (isinstance(raw, dict) and raw.get("type") == "text"):
        return
    if isinstance(raw, dict) and raw.get("type") == "grammar":
        raise invalid(
            f"`{where}`: grammar-constrained custom tools (lark, regex) are not supported by "
            "this server (the grammar cannot be enforced); omit `format` (free text) or offer "
            "a function tool",
            where,
        )
    raise invalid(f"`{where}` must be {{\"type\": \"text\"}} (or omitted)", where)


def parse_tool_list(body: dict[str, Any]) -> ToolList:
    """`tools`, `tool_choice` and `parallel_tool_calls`; a 400 naming the field for any
    mistake."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    if raw is not None and not isinstance(raw, list):
        raise invalid("`tools` must be an array of tools", "tools")
    built = _Builder()
    echo = []
    for i, entry in enumerate(raw or []):
        where = f"tools[{i}]"
        kind = entry.get("type") if isinstance(entry, dict) else None
        if kind in BUILT_IN:
            built.dropped.append(where)
        elif kind == "namespace":
            echo.append(built.namespace(entry, where))
        elif kind in ("function", "custom"):
            echo.append(built.add(entry, where))
        else:
            raise invalid(
                f"`{where}.type` {kind!r}: expected function, custom or namespace tools (or "
                "a built-in tool, which this server leaves out)",
                f"{where}.type",
            )
    dropped = tuple(built.dropped)
    if not built.tools:
        if choice not in (None, "none", "auto"):
            why = " (built-in tools are not run by this server)" if dropped else ""
            raise invalid(f"`tool_choice` needs function tools in `tools`{why}", "tool_choice")
        return ToolList(dropped=dropped)
    checked = built.checked()
    names = ToolNames(tuple(built.names))
    mode = _choice(choice, names)
    check_named(mode, checked, "tool_choice.name")
    parallel = fields.opt_bool(body, "parallel_tool_calls", True)
    return ToolList(ToolSet(checked, mode, parallel), tuple(echo), names, dropped)


def _choice(raw: Any, names: ToolNames) -> ToolChoice:
    if raw is None:
        return ToolChoice("auto")
    if raw in ("none", "auto", "required"):
        return ToolChoice(raw)
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind in ("function", "custom"):
        name = raw.get("name")
        if isinstance(raw.get("function"), dict) and name is None:
            raise invalid(
                '`tool_choice`: the Responses API names the function flat: {"type": '
                '"function", "name": ...}, not inside `function`',
                "tool_choice.function",
            )
        if not isinstance(name, str) or not name:
            raise invalid("`tool_choice.name` must be a string", "tool_choice.name")
        namespace = raw.get("namespace")
        if namespace is not None and (not isinstance(namespace, str) or not namespace):
            raise invalid("`tool_choice.namespace` must be a string", "tool_choice.namespace")
        return ToolChoice("named", flat_name(namespace, name) if namespace else name)
    if kind in BUILT_IN:
        raise invalid(
            f"`tool_choice`: {kind!r} is a built-in tool, which this server does not run",
            "tool_choice",
        )
    raise invalid(f"`tool_choice` must be {_CHOICES}", "tool_choice")
