"""`context_management`: the context edits Anthropic's API applies to a conversation before
the model reads it, applied here the same way, in the order sent.

    clear_thinking_20251015   `keep`: "all" (or {type: all}), or {type: thinking_turns,
                              value: N}: the thinking of every assistant message but the last
                              N is dropped (default N = 1)
    clear_tool_uses_20250919  once `trigger` is passed ({type: input_tokens | tool_uses,
                              value}; default 100,000 input tokens), the results of every tool
                              use but the last `keep` ({type: tool_uses, value}; default 3) and
                              those of `exclude_tools` become a short placeholder text, and
                              with `clear_tool_inputs` (true, or a list of tool names) their
                              calls' inputs become {}; nothing is cleared when that removes
                              fewer than `clear_at_least` ({type: input_tokens, value}) tokens

Token counts here are estimates made before the prompt exists: a token per 4 characters of
text (system, tool definitions, messages, thinking, calls) and 1,000 per image or video.
Each edit that cleared something is reported as Anthropic reports it (`applied_edits`).
An edit of another type is ignored and named (`context_management.edits[i]`). Pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from gateway.api import fields
from gateway.errors import invalid
from gateway.frontend.chat import ChatMessage, TextPart
from gateway.tools.spec import ToolSet

CLEAR_THINKING = "clear_thinking_20251015"
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
PLACEHOLDER = "[This tool result was cleared to save context.]"
CHARS_PER_TOKEN = 4
MEDIA_TOKENS = 1_000
_THINKING_KEYS = frozenset({"type", "keep"})
_TOOL_KEYS = frozenset(
    {"type", "trigger", "keep", "clear_at_least", "exclude_tools", "clear_tool_inputs"}
)


@dataclass(frozen=True)
class Edit:
    """One edit: `keep` (thinking turns or tool uses; None: all), the trigger (kind,
    value), `clear_at_least` (tokens), the tools never cleared and whose inputs to clear
    (True: all)."""

    kind: str
    keep: int | None
    trigger: tuple[str, int] = ("input_tokens", 100_000)
    clear_at_least: int = 0
    exclude: frozenset[str] = frozenset()
    clear_inputs: bool | frozenset[str] = False


def parse_context_management(raw: Any) -> tuple[tuple[Edit, ...], tuple[str, ...]]:
    """The edits asked for, and the names of what was ignored (unknown edits and keys)."""
    if raw is None:
        return (), ()
    if not isinstance(raw, dict):
        raise invalid("`context_management` must be an object with `edits`", "context_management")
    ignored = [f"context_management.{k}" for k in raw if k != "edits"]
    edits = [] if raw.get("edits") is None else raw["edits"]
    if not isinstance(edits, list):
        raise invalid("`context_management.edits` must be an array", "context_management.edits")
    out = []
    for i, edit in enumerate(edits):
        at = f"context_management.edits[{i}]"
        kind = edit.get("type") if isinstance(edit, dict) else None
        if not isinstance(kind, str):
            raise invalid(f"`{at}` must be an object with a `type`", f"{at}.type")
        if kind == CLEAR_THINKING:
            out.append(Edit(kind, _thinking_keep(edit.get("keep", _ONE_TURN), f"{at}.keep")))
        elif kind == CLEAR_TOOL_USES:
            out.append(_tool_edit(edit, at))
        else:
            ignored.append(at)
            continue
        known = _THINKING_KEYS if kind == CLEAR_THINKING else _TOOL_KEYS
        ignored.extend(f"{at}.{k}" for k in edit if k not in known)
    return tuple(out), tuple(ignored)


_ONE_TURN = {"type": "thinking_turns", "value": 1}


def _thinking_keep(raw: Any, at: str) -> int | None:
    if raw == "all" or (isinstance(raw, dict) and raw.get("type") == "all"):
        return None
    if not isinstance(raw, dict) or raw.get("type") != "thinking_turns":
        raise invalid(f"`{at}` must be 'all' or {{type: thinking_turns, value: N}}", at)
    return _count(raw, at, "thinking_turns")


def _count(raw: Any, at: str, *kinds: str) -> int:
    """A {type, value} object's value (a count >= 0); its type must be one of `kinds`."""
    if not isinstance(raw, dict) or raw.get("type") not in kinds:
        listed = " or ".join(kinds)
        raise invalid(f"`{at}` must be an object {{type: {listed}, value: N}}", at)
    value = fields.opt_int({f"{at}.value": raw.get("value")}, f"{at}.value", 0, 100_000_000)
    if value is None:
        raise invalid(f"`{at}.value` is required", f"{at}.value")
    return value


def _tool_edit(raw: dict[str, Any], at: str) -> Edit:
    trigger = raw.get("trigger") or {"type": "input_tokens", "value": 100_000}
    threshold = _count(trigger, f"{at}.trigger", "input_tokens", "tool_uses")
    keep = _count(raw.get("keep") or {"type": "tool_uses", "value": 3}, f"{at}.keep", "tool_uses")
    least = raw.get("clear_at_least")
    inputs = raw.get("clear_tool_inputs") or False
    if not isinstance(inputs, bool):
        inputs = frozenset(_names(inputs, f"{at}.clear_tool_inputs"))
    return Edit(
        CLEAR_TOOL_USES,
        keep,
        (trigger["type"], threshold),
        _count(least, f"{at}.clear_at_least", "input_tokens") if least is not None else 0,
        frozenset(_names(raw.get("exclude_tools") or [], f"{at}.exclude_tools")),
        inputs,
    )


def _names(raw: Any, at: str) -> list[str]:
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise invalid(f"`{at}` must be an array of tool names", at)
    return raw


def apply_edits(
    edits: tuple[Edit, ...], messages: tuple[ChatMessage, ...], tools: ToolSet | None
) -> tuple[tuple[ChatMessage, ...], list[dict[str, Any]]]:
    """`messages` after the edits, and the edits that cleared something, as Anthropic
    reports them in `context_management.applied_edits`."""
    applied = []
    for edit in edits:
        if edit.kind == CLEAR_THINKING:
            messages, report = _clear_thinking(edit, messages)
        else:
            messages, report = _clear_tool_uses(edit, messages, tools)
        if report is not None:
            applied.append(report)
    return messages, applied


def _tokens(chars: int, media: int = 0) -> int:
    return -(-chars // CHARS_PER_TOKEN) + media * MEDIA_TOKENS


def _message_tokens(m: ChatMessage) -> int:
    chars = sum(len(p.text) for p in m.parts if isinstance(p, TextPart)) + len(m.reasoning)
    chars += sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
    return _tokens(chars, sum(not isinstance(p, TextPart) for p in m.parts))


def _clear_thinking(
    edit: Edit, messages: tuple[ChatMessage, ...]
) -> tuple[tuple[ChatMessage, ...], dict[str, Any] | None]:
    if edit.keep is None:
        return messages, None
    turns = [i for i, m in enumerate(messages) if m.role == "assistant"]
    older = turns[: max(0, len(turns) - edit.keep)]
    cleared = [i for i in older if messages[i].reasoning]
    if not cleared:
        return messages, None
    out = list(messages)
    for i in cleared:
        out[i] = replace(messages[i], reasoning="")
    tokens = sum(_tokens(len(messages[i].reasoning)) for i in cleared)
    report = {"type": CLEAR_THINKING, "cleared_thinking_turns": len(cleared),
              "cleared_input_tokens": tokens}  # fmt: skip
    return tuple(out), report


def _clear_tool_uses(
    edit: Edit, messages: tuple[ChatMessage, ...], tools: ToolSet | None
) -> tuple[tuple[ChatMessage, ...], dict[str, Any] | None]:
    results = [i for i, m in enumerate(messages) if m.role == "tool"]
    kind, threshold = edit.trigger
    if kind == "tool_uses":
        size = len(results)
    else:
        definitions = [t.template_dict() for t in tools.tools] if tools is not None else []
        size = sum(map(_message_tokens, messages)) + _tokens(len(json.dumps(definitions)))
    if size <= threshold:
        return messages, None
    older = results[: max(0, len(results) - (edit.keep or 0))]
    cleared = [i for i in older if messages[i].name not in edit.exclude
               and messages[i].parts != (TextPart(PLACEHOLDER),)]  # fmt: skip
    out = list(messages)
    tokens = 0
    for i in cleared:
        tokens += _message_tokens(messages[i]) - _tokens(len(PLACEHOLDER))
        out[i] = replace(messages[i], parts=(TextPart(PLACEHOLDER),))
        if edit.clear_inputs is True or messages[i].name in (edit.clear_inputs or ()):
            tokens += _clear_input(out, messages[i].tool_call_id)
    if not cleared or tokens < edit.clear_at_least:
        return messages, None
    report = {"type": CLEAR_TOOL_USES, "cleared_tool_uses": len(cleared),
              "cleared_input_tokens": max(tokens, 0)}  # fmt: skip
    return tuple(out), report


def _clear_input(messages: list[ChatMessage], call_id: str | None) -> int:
    """Empty the input of the call `call_id` in place; the tokens it held."""
    for i, m in enumerate(messages):
        for j, call in enumerate(m.tool_calls):
            if call.id == call_id:
                calls = list(m.tool_calls)
                calls[j] = replace(call, arguments="{}")
                messages[i] = replace(m, tool_calls=tuple(calls))
                return max(0, _tokens(len(call.arguments)) - 1)
    return 0
