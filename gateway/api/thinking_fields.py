"""The thinking fields of the three APIs, parsed into `ChatRequest` fields (see
gateway.frontend.reasoning for what they do):

    Chat Completions  `chat_template_kwargs` (vLLM's: the template's own variables, e.g.
                      `enable_thinking`), `reasoning_effort` ("none" turns thinking off,
                      any other effort on); an assistant message's `reasoning_content`
    Messages          `thinking`: {type: enabled, budget_tokens} (on, at most that many
                      thinking tokens), {type: disabled}, {type: adaptive} (on where the
                      model thinks, no budget), `display: "omitted"` (the thinking's text
                      left out of the answer); `output_config.effort` as an effort
    Responses         `reasoning`: {effort, summary} (effort as above)

Pure; every mistake is an APIError naming the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gateway.api import fields
from gateway.errors import invalid

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
ANTHROPIC_EFFORTS = ("low", "medium", "high", "xhigh", "max")
# Messages' `thinking.display`: "omitted" leaves the thinking's text out of the answer;
# "updates" (a beta) is served as "summarized": the thinking as it comes.
DISPLAYS = ("summarized", "omitted", "updates")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
MAX_KWARGS_BYTES = 16 * 1024


def template_kwargs(body: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """`chat_template_kwargs`: an object of template variables (names are identifiers,
    values JSON, at most 16 KiB in all)."""
    raw = body.get("chat_template_kwargs")
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise invalid("`chat_template_kwargs` must be an object", "chat_template_kwargs")
    if len(json.dumps(raw)) > MAX_KWARGS_BYTES:
        raise invalid(
            f"`chat_template_kwargs` must be at most {MAX_KWARGS_BYTES} bytes of JSON",
            "chat_template_kwargs",
        )
    for name in raw:
        if not _NAME.fullmatch(name):
            raise invalid(
                f"`chat_template_kwargs.{name}`: a template variable's name must be an identifier",
                f"chat_template_kwargs.{name}",
            )
    return tuple(raw.items())


def effort_switch(value: Any, field: str) -> bool | None:
    """A `reasoning_effort` (or `reasoning.effort`): "none" -> off, any other -> on,
    absent -> None (the template's default)."""
    if value is None:
        return None
    if value not in EFFORTS:
        raise invalid(f"`{field}` must be one of {', '.join(EFFORTS)}", field)
    return value != "none"


@dataclass(frozen=True)
class AnthropicThinking:
    """Messages' `thinking` parsed: the template switch (None: the template's default), the
    thinking budget, whether the switch is optional (adaptive: think if the model can; a
    model that does not think answers without), whether the thinking's text is left out of
    the answer (`display: "omitted"`), and the keys this server ignored (named back)."""

    switch: bool | None = None
    budget: int | None = None
    optional: bool = False
    omit: bool = False
    ignored: tuple[str, ...] = ()


def anthropic_thinking(body: dict[str, Any], max_tokens: int) -> AnthropicThinking:
    """Messages' `thinking`: {type: enabled, budget_tokens} (on; `budget_tokens` at least 1
    and below `max_tokens`: the thinking is part of the answer's tokens), {type: adaptive}
    (on where the model thinks), {type: disabled}; `display` summarized / omitted /
    updates. `block_binding` and unknown keys are ignored and named."""
    raw = body.get("thinking")
    if raw is None:
        return AnthropicThinking()
    if not isinstance(raw, dict):
        raise invalid(
            "`thinking` must be an object such as {type: enabled, budget_tokens: N}", "thinking"
        )
    kind = raw.get("type")
    if kind not in ("enabled", "disabled", "adaptive"):
        raise invalid(
            "`thinking.type` must be 'enabled', 'disabled' or 'adaptive'", "thinking.type"
        )
    display = raw.get("display")
    if display is not None and display not in DISPLAYS:
        raise invalid(f"`thinking.display` must be one of {', '.join(DISPLAYS)}",
                      "thinking.display")  # fmt: skip
    known = {"type", "display"} | ({"budget_tokens"} if kind == "enabled" else set())
    ignored = tuple(f"thinking.{k}" for k, v in raw.items() if k not in known and v is not None)
    omit = display == "omitted"
    if kind == "disabled":
        return AnthropicThinking(False, ignored=ignored)
    if kind == "adaptive":
        return AnthropicThinking(True, optional=True, omit=omit, ignored=ignored)
    budget = fields.opt_int(
        {"thinking.budget_tokens": raw.get("budget_tokens")}, "thinking.budget_tokens", 1, 1_000_000
    )
    if budget is None:
        raise invalid(
            "`thinking.budget_tokens` is required when thinking is enabled",
            "thinking.budget_tokens",
        )
    if budget >= max_tokens:
        raise invalid(
            f"`thinking.budget_tokens` ({budget}) must be less than `max_tokens` ({max_tokens})",
            "thinking.budget_tokens",
        )
    return AnthropicThinking(True, budget, omit=omit, ignored=ignored)


def anthropic_effort(value: Any, field: str) -> bool | None:
    """An `output_config.effort` (low ... max): as a Chat Completions effort other than
    "none", thinking on (optionally: where the model thinks); absent -> None. The effort
    does not size the thinking."""
    if value is None:
        return None
    if value not in ANTHROPIC_EFFORTS:
        raise invalid(f"`{field}` must be one of {', '.join(ANTHROPIC_EFFORTS)}", field)
    return True


def responses_reasoning(body: dict[str, Any]) -> tuple[bool | None, str | None]:
    """Responses' `reasoning` -> (switch, summary mode or None)."""
    raw = body.get("reasoning")
    if raw is None:
        return None, None
    if not isinstance(raw, dict):
        raise invalid("`reasoning` must be an object such as {effort: 'low'}", "reasoning")
    summary = raw.get("summary", raw.get("generate_summary"))
    if summary is not None and summary not in ("auto", "concise", "detailed"):
        raise invalid(
            "`reasoning.summary` must be 'auto', 'concise' or 'detailed'", "reasoning.summary"
        )
    switch = effort_switch(raw.get("effort"), "reasoning.effort")
    if switch is None and summary is not None:  # a summary of the thinking asks for one
        switch = True
    return switch, summary


def message_reasoning(msg: dict[str, Any], where: str) -> str:
    """An assistant message's `reasoning_content` (or `reasoning`): its earlier thinking."""
    for name in ("reasoning_content", "reasoning"):
        value = msg.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise invalid(f"`{where}.{name}` must be a string", f"{where}.{name}")
        return value
    return ""
