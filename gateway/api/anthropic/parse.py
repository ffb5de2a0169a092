"""Anthropic Messages request bodies (`POST /v1/messages`, `POST /v1/messages/count_tokens`)
-> `ChatRequest`. The routes are in `gateway.api.anthropic.routes`, response bodies and SSE
events in `gateway.api.anthropic.render`.

What is applied: `system` and `role: "system"` messages (gateway.api.anthropic.system),
`messages` with text and image blocks, tool use and thinking (gateway.api.anthropic.messages,
.content, .tools), a final assistant message as a prefill, `max_tokens` (required),
`stop_sequences`, `temperature`, `top_p`, `top_k`, `stream`, `tools` and `tool_choice`,
`thinking` (gateway.api.thinking_fields), `output_config` (.output), `context_management`
(.context) and vLLM's `cache_salt` (scopes cache reuse). Fields that change nothing here
(`metadata`, `service_tier`, `cache_control`, ...) are accepted (gateway.api.accepted).
Features this server cannot honour and that would change the answer (MCP servers, code
execution containers, compaction, documents, ...) are refused with a 400 that names the
field. Anything else the server does not know, or drops (server tools, unknown edits, ...),
is ignored and named back in the `x-ignored-fields` header. Parsing is pure; errors are
rendered as Anthropic error objects.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gateway.api import fields
from gateway.api.accepted import ANTHROPIC_MESSAGES, refuse_unapplied, unknown_fields
from gateway.api.anthropic.context import apply_edits, parse_context_management
from gateway.api.anthropic.messages import conversation
from gateway.api.anthropic.output import output_config
from gateway.api.anthropic.system import place_system, system_prompt
from gateway.api.anthropic.tools import parse_tools
from gateway.api.thinking_fields import anthropic_thinking
from gateway.errors import invalid
from gateway.frontend.chat import ChatRequest

MAX_STOP_SEQUENCES = 16
MAX_IGNORED = 16  # names in the x-ignored-fields header


@dataclass(frozen=True)
class MessagesRequest:
    """A parsed body: the chat request, and what the response needs beyond it: whether the
    thinking's text is omitted (`thinking.display`), the response's `context_management`
    (`{"applied_edits": [...]}` when the body asked for edits, else None) and the request
    before its edits (None when they changed nothing), whose length count_tokens reports."""

    chat: ChatRequest
    omit_thinking: bool = False
    context_management: dict[str, Any] | None = None
    unedited: ChatRequest | None = None


def parse_messages_request(
    body: Any, count_only: bool = False, fold_system: bool = False
) -> ChatRequest:
    """The chat request of a body (see `parse_messages`)."""
    return parse_messages(body, count_only, fold_system).chat


def parse_messages(
    body: Any, count_only: bool = False, fold_system: bool = False
) -> MessagesRequest:
    """Validate a decoded JSON body. `count_only`: a count_tokens body (no `max_tokens`).
    `fold_system`: the served template does not render system turns after the start, so
    they are folded into user messages (gateway.api.anthropic.system)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    refuse_unapplied(body, ANTHROPIC_MESSAGES)
    model = fields.model_name(body)
    talk = conversation(body.get("messages"))
    max_tokens = fields.opt_int(body, "max_tokens", 1, 1_000_000)
    if max_tokens is None and not count_only:
        raise invalid("`max_tokens` is required: the most tokens to generate", "max_tokens")
    top_p = fields.opt_num(body, "top_p", 0.0, 1.0, default=1.0)
    if top_p == 0.0:
        raise invalid("`top_p` must be greater than 0 (use temperature 0 for greedy)", "top_p")
    thinking = anthropic_thinking(body, max_tokens or 1_000_001)
    output = output_config(body)
    switch, optional = thinking.switch, thinking.optional
    effort = talk.effort if talk.effort is not None else output.effort
    if switch is None and effort is not None:  # an effort: think where the model thinks
        switch, optional = True, True
    tools, tools_ignored = parse_tools(body, talk.tool_changes)
    if output.grammar is not None and tools is not None and tools.constrained:
        raise invalid(
            f"`{output.grammar_field}` cannot be combined with tools unless `tool_choice` is "
            "'none': this server decodes an answer under one grammar",
            output.grammar_field,
        )
    edits, edits_ignored = parse_context_management(body.get("context_management"))
    unedited = (*system_prompt(body.get("system")), *talk.messages)
    messages, applied = apply_edits(edits, unedited, tools)
    ignored = [*unknown_fields(body, ANTHROPIC_MESSAGES), *_metadata(body.get("metadata")),
               *thinking.ignored, *output.ignored, *talk.ignored, *tools_ignored,
               *edits_ignored]  # fmt: skip
    chat = ChatRequest(
        model=model,
        messages=place_system(messages, fold_system),
        max_tokens=max_tokens,
        temperature=fields.opt_num(body, "temperature", 0.0, 1.0, default=1.0),
        top_p=top_p,
        top_k=fields.opt_int(body, "top_k", 0, 1_000_000) or 0,
        seed=None,
        stop=fields.stop_strings(
            body.get("stop_sequences"), "stop_sequences", MAX_STOP_SEQUENCES, False
        ),
        logprobs=False,
        top_logprobs=0,
        stream=fields.opt_bool(body, "stream", False),
        include_usage=True,
        grammar=output.grammar,
        grammar_field=output.grammar_field,
        prefill=talk.prefill,
        cache_salt=fields.cache_salt(body),
        keep_alive_s=fields.keep_alive(body),
        tools=tools,
        thinking=switch,
        thinking_optional=optional,
        thinking_budget=thinking.budget,
        ignored_fields=_named(ignored),
    )
    context = {"applied_edits": applied} if body.get("context_management") is not None else None
    before = replace(chat, messages=place_system(unedited, fold_system)) if applied else None
    return MessagesRequest(chat, thinking.omit, context, before)


def _metadata(raw: Any) -> list[str]:
    """`metadata`: an object; `user_id` (a string, any) has no effect on the answer, other
    keys are named as ignored."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        raise invalid('`metadata` must be an object (e.g. {"user_id": "..."})', "metadata")
    user = raw.get("user_id")
    if user is not None and not isinstance(user, str):
        raise invalid("`metadata.user_id` must be a string", "metadata.user_id")
    return [f"metadata.{k}" for k in raw if k != "user_id"]


def _named(names: list[str]) -> tuple[str, ...]:
    """The x-ignored-fields header's names: printable, each once, at most MAX_IGNORED."""
    return tuple(dict.fromkeys(fields.printable(n, 64) for n in names))[:MAX_IGNORED]
