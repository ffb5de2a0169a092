"""Thinking models: which markers a chat template thinks in, the template's thinking switch,
and how a rendered prompt leaves the answer (inside a thinking, free to open one, or with
the thinking closed).

    think    Qwen3, Qwen3-VL Thinking, Qwen3.5/3.6: `<think>` ... `</think>`; the switch is
             `enable_thinking` (Qwen3's hybrid template: False writes an empty
             `<think>\\n\\n</think>\\n\\n`; Thinking-only templates open `<think>\\n` in
             the generation prompt)
    channel  Gemma 4: `<|channel>thought\\n` ... `<channel|>`; `enable_thinking` puts
             `<|think|>` in the system turn, its absence closes an empty channel

`detect` reads the checkpoint's template (as gateway.tools.formats does for calls); a
format is used only when both markers are one token each in the tokenizer (the engine splits
the answer by token ids, gateway.engine.tokens.thinking). Pure functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.engine.request import ThinkingParams
from gateway.errors import invalid
from gateway.frontend.chat import ChatRequest

SWITCH = "enable_thinking"

# Arguments of `apply_chat_template` itself, or variables the server sets: a client's
# `chat_template_kwargs` may not set them.
RESERVED = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "chat_template",
        "return_dict",
        "return_tensors",
        "padding",
        "truncation",
        "max_length",
        "tokenizer_kwargs",
        "bos_token",
        "eos_token",
        "pad_token",
        "unk_token",
    }
)


@dataclass(frozen=True)
class ReasoningFormat:
    """One family's thinking markers (text) and the text that opens the thinking after the
    start marker without being part of it (`header`)."""

    name: str
    start: str
    end: str
    header: str = ""


THINK = ReasoningFormat("think", "<think>", "</think>")
CHANNEL = ReasoningFormat("channel", "<|channel>", "<channel|>", "thought\n")


def detect(template: str | None) -> ReasoningFormat | None:
    """The thinking markers a chat template writes, or None (a model that does not think)."""
    if not template:
        return None
    for fmt in (CHANNEL, THINK):
        if fmt.start in template and fmt.end in template:
            return fmt
    return None


@dataclass(frozen=True)
class Reasoning:
    """A served model's thinking: its format and the markers' token ids."""

    fmt: ReasoningFormat
    start_id: int
    end_id: int

    @classmethod
    def of(cls, template: str | None, tokenize: Callable[[str], list[int]]) -> Reasoning | None:
        """The model's thinking, when its template thinks in markers that are one token
        each (else None: answers are not split)."""
        fmt = detect(template)
        if fmt is None:
            return None
        start, end = tokenize(fmt.start), tokenize(fmt.end)
        if len(start) != 1 or len(end) != 1:
            return None
        return cls(fmt, start[0], end[0])

    def params(self, rendered: str, chat: ChatRequest) -> ThinkingParams | None:
        """How the answer to `rendered` (the template's text) and `chat.prefill` after it
        starts: None when the thinking is closed (it is off, or a prefill closed it), else
        the markers, whether the thinking is open (the template or the prefill opened it),
        the request's budget, and whether a grammar waits for the thinking's end (the
        thinking was asked for, or is open)."""
        tail = rendered.rstrip()
        if tail.endswith(self.fmt.end):
            state = "closed"
        elif tail.endswith(self.fmt.start) or tail.endswith(
            self.fmt.start + self.fmt.header.rstrip()
        ):
            state = "inside"
        else:
            state = "start"
        if chat.prefill:  # an Anthropic prefill continues the answer: its markers count
            opened, closed = chat.prefill.rfind(self.fmt.start), chat.prefill.rfind(self.fmt.end)
            if closed > opened or (closed >= 0 and opened < 0):
                state = "closed"
            elif opened >= 0:
                state = "inside"
            elif state == "start" and chat.prefill.strip():
                state = "closed"  # the answer began without a thinking
        if state == "closed":
            return None
        inside = state == "inside"
        return ThinkingParams(
            start_id=self.start_id,
            end_id=self.end_id,
            inside=inside,
            budget=chat.thinking_budget,
            grammar_waits=inside or switch(chat) is True,
            header="" if inside else self.fmt.header,
        )


def switch(chat: ChatRequest) -> bool | None:
    """The request's thinking switch: its `thinking` field, else its template kwargs'
    `enable_thinking`, else None (the template's default)."""
    if chat.thinking is not None:
        return chat.thinking
    value = dict(chat.template_kwargs).get(SWITCH)
    return value if isinstance(value, bool) else None


def template_kwargs(chat: ChatRequest, reasoning: Reasoning | None) -> dict[str, Any]:
    """The template variables for `chat`: its `chat_template_kwargs` with the thinking
    switch applied. Asking a model that does not think to think is a 400 naming the field
    that asked, unless the request asked optionally (`thinking_optional`: it then answers
    without thinking); a switch that turns thinking off is honoured by any model."""
    kwargs = dict(chat.template_kwargs)
    for name in kwargs:
        if name in RESERVED:
            raise invalid(
                f"`chat_template_kwargs.{name}` is set by the server and cannot be overridden",
                f"chat_template_kwargs.{name}",
            )
    on = switch(chat)
    if on and reasoning is None and chat.thinking_optional:
        on = None  # "think if you can": the template's own default, which does not think
    if on and reasoning is None:
        field = f"chat_template_kwargs.{SWITCH}"
        if chat.thinking is not None:
            field = chat.thinking_field
        raise invalid(
            f"`{field}`: this model's chat template does not think (no thinking markers this "
            "server knows: <think>...</think>, <|channel>...<channel|>); omit it or serve a "
            "thinking model",
            field,
        )
    if on is not None:
        kwargs[SWITCH] = on
    return kwargs
