"""Tools for a chat template that renders none: the conversation folded into plain turns.

A template such as Gemma 3's, SmolVLM's or Mistral Small 3.1's ignores a `tools` argument and
refuses `tool` messages (roles must alternate user/assistant). When the operator forces a call
syntax on such a model (`--tool-call-parser hermes`), the gateway itself tells the model about
the tools and replays the tool history as text, in that syntax, before the template renders:

- a system block lists the tools as JSON (hermes style: `<tools>...</tools>`) and shows the
  call syntax the grammar enforces (`ToolFormat.call_text`), prepended to the first system
  message (or as one);
- an assistant message's calls become its text, written exactly as the model writes a call
  (compact JSON with ", " / ": "), so a follow-up turn renders what the model produced;
- a `tool` message becomes part of a user turn, wrapped as `<tool_response>...</tool_response>`
  (its images stay parts in place), and consecutive user turns merge into one.

This is prompting, not training: how well a model follows it depends on the model (Google
documents prompt-based function calling for Gemma 3 in this shape). The grammar still forces
every call to parse and validate. Pure functions over the template's message dicts.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.tools.formats import ToolFormat


def renders_tools(template: str | None) -> bool:
    """Does this chat template read a `tools` variable (else tools must be folded in)?"""
    return bool(template) and "tools" in template  # type: ignore[operator]


def needs_folding(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> bool:
    """Is there anything tool-shaped to fold: offered tools, calls or tool results?"""
    return bool(tools) or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)


def tools_block(fmt: ToolFormat, tools: list[dict[str, Any]]) -> str:
    """The system text that offers `tools` (template dicts) in the call syntax of `fmt`."""
    listing = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    example = fmt.call_text("<function-name>", "<args-json-object>")
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listing}\n</tools>\n\n"
        f"For each function call, answer with a JSON object in this form:\n{example}"
    )


def fold(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, fmt: ToolFormat
) -> list[dict[str, Any]]:
    """`messages` (gateway.frontend.prompt.template_messages) with the tools offered in a
    system block and every call and tool result as text of plain user/assistant turns."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if role == "tool":
            _add_user(out, _response_parts(message["content"]))
            continue
        entry = {k: v for k, v in message.items() if k not in ("tool_calls", "tool_call_id")}
        if message.get("tool_calls"):
            calls = [_call_text(fmt, call) for call in message["tool_calls"]]
            entry["content"] = _join(_text(message.get("content")), fmt.separator.join(calls))
        if role == "user":
            _add_user(out, _parts(entry["content"]))
        else:
            out.append(entry)
    if tools:
        block = tools_block(fmt, tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": _join(block, _text(out[0]["content"]))}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def _call_text(fmt: ToolFormat, call: dict[str, Any]) -> str:
    function = call["function"]
    arguments = function["arguments"]
    if not isinstance(arguments, str):  # a mapping: as the model writes it
        arguments = json.dumps(arguments, ensure_ascii=False)
    return fmt.call_text(function["name"], arguments)


def _response_parts(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    parts = _parts(content)
    return [_text_part("<tool_response>\n"), *parts, _text_part("\n</tool_response>")]


def _add_user(out: list[dict[str, Any]], parts: list[dict[str, Any]]) -> None:
    """Append a user turn, merged into the previous one if that is a user turn too."""
    if out and out[-1]["role"] == "user":
        parts = [*_parts(out[-1]["content"]), _text_part("\n"), *parts]
        out.pop()
    texts_only = all(p["type"] == "text" for p in parts)
    content: Any = "".join(p["text"] for p in parts) if texts_only else _merge_texts(parts)
    out.append({"role": "user", "content": content})


def _merge_texts(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adjacent text parts joined (a template writes each part as it comes)."""
    merged: list[dict[str, Any]] = []
    for part in parts:
        if part["type"] == "text" and merged and merged[-1]["type"] == "text":
            merged[-1] = _text_part(merged[-1]["text"] + part["text"])
        else:
            merged.append(part)
    return merged


def _parts(content: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if content is None:
        return []
    return [_text_part(content)] if isinstance(content, str) else list(content)


def _text(content: str | list[dict[str, Any]] | None) -> str:
    """A system or assistant message's text (their content holds no images)."""
    return "".join(p.get("text", "") for p in _parts(content))


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _join(first: str, second: str) -> str:
    return f"{first}\n\n{second}" if first and second else first or second
