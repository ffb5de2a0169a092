"""System text of a Messages body: the top-level `system` and `role: "system"` messages.

The top-level `system` (a string or text blocks) and any system messages before the first
user or assistant message are one system message at the start. A later system message is a
system turn where it stands (`clear_at: "next_user_message"`: only until a user message
follows it); its `tool_addition` / `tool_removal` blocks change the tools offered
(gateway.api.anthropic.tools), its `output_config.effort` sets the effort of the answer it
precedes. Where the served chat template does not render a system turn after the start
(`renders_late_system` says, once per server), `place_system` folds each into a user
message, wrapped in `<system-reminder>` tags: appended to the user message it follows, else
put before the next user message (after any tool results), else a user message of its own.

A text block that is only a client's billing metadata (`x-anthropic-billing-header: ...`,
whose `cch=` value may change on every request) is not rendered: it would change the
prompt's first tokens and defeat every prefix cache. Pure, but for the probe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gateway.api import fields
from gateway.api.anthropic.content import block_text
from gateway.api.thinking_fields import anthropic_effort
from gateway.errors import invalid
from gateway.frontend.chat import ChatMessage, Part, TextPart

BILLING_PREFIX = "x-anthropic-billing-header:"
_CLEAR_AT = ("never", "next_user_message")
_PROBE = "vision-gateway-probe"


@dataclass(frozen=True)
class ToolChange:
    """A `tool_addition` (`added`) or `tool_removal` block at `where`: the tool's `name`,
    and for an inline `tool_definition` the definition as sent (checked by the tools'
    parser)."""

    where: str
    name: str
    added: bool
    definition: dict[str, Any] | None = None


@dataclass(frozen=True)
class SystemTurn:
    """One `role: "system"` message: its text (empty when it is not shown), tool changes,
    effort and the keys named as ignored; `index` is its place in `messages`."""

    index: int
    parts: tuple[Part, ...]
    tool_changes: tuple[ToolChange, ...] = ()
    effort: Any = None
    ignored: tuple[str, ...] = ()

    @property
    def messages(self) -> tuple[ChatMessage, ...]:
        return (ChatMessage("system", self.parts),) if self.parts else ()


def system_prompt(raw: Any) -> tuple[ChatMessage, ...]:
    """The top-level `system`: a string or an array of text blocks."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        text = fields.text(raw, "system")
        return (ChatMessage("system", (TextPart(text),)),) if text and not _billing(text) else ()
    if not isinstance(raw, list):
        raise invalid("`system` must be a string or an array of text blocks", "system")
    parts = []
    for i, block in enumerate(raw):
        where = f"system[{i}]"
        if not isinstance(block, dict) or block.get("type") != "text":
            raise invalid(f'`{where}` must be a text block: {{"type": "text", ...}}', where)
        text = block_text(block, where)
        if not _billing(text):
            parts.append(TextPart(text))
    return (ChatMessage("system", tuple(parts)),) if parts else ()


def _billing(text: str) -> bool:
    return text.lstrip().startswith(BILLING_PREFIX)


def system_turn(msg: dict[str, Any], where: str, index: int, followed_by_user: bool) -> SystemTurn:
    """A `role: "system"` message at `messages[index]`; `followed_by_user`: a user message
    comes later (which hides one with `clear_at: "next_user_message"`)."""
    clear_at = msg.get("clear_at")
    if clear_at is not None and clear_at not in _CLEAR_AT:
        raise invalid(f"`{where}.clear_at` must be one of {', '.join(_CLEAR_AT)}",
                      f"{where}.clear_at")  # fmt: skip
    effort, ignored = _output_config(msg.get("output_config"), where)
    raw = msg.get("content")
    if raw is None and msg.get("output_config") is not None:
        raw = []
    if isinstance(raw, str):
        raw = [{"type": "text", "text": raw}]
    if not isinstance(raw, list):
        raise invalid(f"`{where}.content` must be a string or an array of text blocks",
                      f"{where}.content")  # fmt: skip
    parts: list[Part] = []
    changes: list[ToolChange] = []
    for j, block in enumerate(raw):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            text = block_text(block, at)
            if not _billing(text):
                parts.append(TextPart(text))
        elif kind in ("tool_addition", "tool_removal"):
            change = _tool_change(block, at, kind == "tool_addition")
            if change is None:
                ignored.append(at)
            else:
                changes.append(change)
        else:
            raise invalid(f"`{at}.type` must be 'text', 'tool_addition' or 'tool_removal'",
                          f"{at}.type")  # fmt: skip
    hidden = clear_at == "next_user_message" and followed_by_user
    return SystemTurn(index, () if hidden else tuple(parts), tuple(changes), effort,
                      tuple(ignored))  # fmt: skip


def _output_config(raw: Any, where: str) -> tuple[Any, list[str]]:
    """A system message's `output_config`: its effort (validated), other keys ignored."""
    if raw is None:
        return None, []
    at = f"{where}.output_config"
    if not isinstance(raw, dict):
        raise invalid(f"`{at}` must be an object such as {{effort: 'low'}}", at)
    effort = raw.get("effort")
    anthropic_effort(effort, f"{at}.effort")
    return effort, [f"{at}.{k}" for k, v in raw.items() if k != "effort" and v is not None]


def _tool_change(block: dict[str, Any], at: str, added: bool) -> ToolChange | None:
    """A `tool_addition` / `tool_removal` block (None: an MCP tool, which is not served)."""
    tool = block.get("tool")
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind in ("mcp_tool_reference", "mcp_toolset_reference"):
        return None
    if kind == "tool_reference":
        name = tool.get("name")  # type: ignore[union-attr]
        if not isinstance(name, str) or not name:
            raise invalid(f"`{at}.tool.name` must be a tool's name", f"{at}.tool.name")
        return ToolChange(at, name, added)
    if kind == "tool_definition" and added:
        definition = tool.get("definition")  # type: ignore[union-attr]
        if not isinstance(definition, dict):
            raise invalid(f"`{at}.tool.definition` must be a tool (`name`, `input_schema`)",
                          f"{at}.tool.definition")  # fmt: skip
        return ToolChange(f"{at}.tool.definition", str(definition.get("name")), True, definition)
    kinds = "'tool_reference' or 'tool_definition'" if added else "'tool_reference'"
    raise invalid(f"`{at}.tool.type` must be {kinds}", f"{at}.tool.type")


def renders_late_system(render: Callable[[list[dict[str, Any]]], str]) -> bool:
    """Whether a chat template (`render`: messages -> text) renders a system turn after the
    first user message where it stands, in a conversation that goes on after it: templates
    that raise (system only at the start, strict alternation) or drop it do not."""
    probe = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "a"},
        {"role": "system", "content": _PROBE},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    try:
        return _PROBE in render(probe)
    except Exception:  # noqa: BLE001 - any refusal of the probe means: fold
        return False


def place_system(messages: tuple[ChatMessage, ...], fold: bool) -> tuple[ChatMessage, ...]:
    """The system messages before the first other message merged into one; later ones kept
    where they stand, or (`fold`) folded into user messages as the module says."""
    lead = 0
    while lead < len(messages) and messages[lead].role == "system":
        lead += 1
    head: tuple[ChatMessage, ...] = ()
    if lead:
        parts = _joined([m.parts for m in messages[:lead]], TextPart("\n\n"))
        head = (ChatMessage("system", parts),)
    rest = messages[lead:]
    return head + (_folded(rest) if fold else rest)


def _joined(groups: list[tuple[Part, ...]], separator: Part) -> tuple[Part, ...]:
    out: list[Part] = []
    for group in groups:
        out.extend((separator, *group) if out else group)
    return tuple(out)


def _folded(messages: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...]:
    out: list[ChatMessage] = []
    carry: list[Part] = []  # folded text waiting for the next user message
    for m in messages:
        if m.role == "system":
            text = "".join(p.text for p in m.parts if isinstance(p, TextPart))
            reminder = TextPart(f"<system-reminder>\n{text}\n</system-reminder>")
            if out and out[-1].role == "user" and not carry:
                out[-1] = replace(out[-1], parts=(*out[-1].parts, TextPart("\n\n"), reminder))
            else:
                carry.extend((TextPart("\n\n"), reminder) if carry else (reminder,))
            continue
        if carry and m.role == "user":
            m = replace(m, parts=(*carry, TextPart("\n\n"), *m.parts))
            carry = []
        elif carry and m.role == "assistant":  # before the answer it preceded, in its place
            out.append(ChatMessage("user", tuple(carry)))
            carry = []
        out.append(m)  # tool results stay next to their calls: the carry waits
    if carry:
        out.append(ChatMessage("user", tuple(carry)))
    return tuple(out)
