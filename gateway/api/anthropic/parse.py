"""Anthropic Messages request bodies (`POST /v1/messages`, `POST /v1/messages/count_tokens`)
-> `ChatRequest`. The routes are in `gateway.api.anthropic.routes`, response bodies and SSE
events in `gateway.api.anthropic.render`.

What is accepted: `system` (a string or text blocks), `messages` with text and image blocks
(`base64` with `media_type`, or `url`), a final assistant message as a prefill, `max_tokens`
(required), `stop_sequences`, `temperature`, `top_p`, `top_k`, `metadata`, `stream`, and
vLLM's `cache_salt` (scopes cache reuse). `tools` and `tool_choice` with `tool_use` and
`tool_result` blocks (text and images) are accepted (gateway.api.anthropic.tools).
`thinking` ({type: enabled, budget_tokens} / disabled / adaptive) switches a thinking
model's thinking (gateway.api.thinking_fields), and an assistant's `thinking` blocks go
back to the template as its earlier thinking (`redacted_thinking` blocks are dropped).
Features this server cannot honour (documents, MCP servers, ...) are refused with
a 400 that names the field, never ignored; so are unknown fields, as the API itself does.
Parsing is pure; errors are rendered as Anthropic error objects.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from gateway.api import fields
from gateway.api.anthropic.tools import parse_tools, tool_result, tool_use
from gateway.api.thinking_fields import anthropic_thinking
from gateway.errors import invalid
from gateway.frontend.chat import ChatMessage, ChatRequest, ImagePart, Part, TextPart

MAX_STOP_SEQUENCES = 16
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
_ACCEPTED = frozenset(
    {"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature",
     "top_p", "top_k", "metadata", "service_tier", "tools", "tool_choice", "thinking",
     "cache_control",  # automatic prompt caching: this server's caches are always automatic
     "cache_salt"}  # vLLM's extension: scopes cache reuse (docs/security.md)
)  # fmt: skip
_REFUSED = {
    "mcp_servers": "MCP servers",
    "container": "code execution containers",
    "context_management": "context management",
}
_BLOCK_FEATURES = {
    "document": "documents",
    "search_result": "search results",
    "server_tool_use": "tool use",
    "container_upload": "code execution containers",
}


def parse_messages_request(body: Any, count_only: bool = False) -> ChatRequest:
    """Validate a decoded JSON body. `count_only`: a count_tokens body (no `max_tokens`,
    no sampling fields)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    _refuse_unsupported(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("`model` is required and must be a string", "model")
    messages, prefill = _messages(body.get("messages"))
    system = _system(body.get("system"))
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise invalid('`metadata` must be an object (e.g. {"user_id": "..."})', "metadata")
    max_tokens = fields.opt_int(body, "max_tokens", 1, 1_000_000)
    if max_tokens is None and not count_only:
        raise invalid("`max_tokens` is required: the most tokens to generate", "max_tokens")
    top_p = fields.opt_num(body, "top_p", 0.0, 1.0, default=1.0)
    if top_p == 0.0:
        raise invalid("`top_p` must be greater than 0 (use temperature 0 for greedy)", "top_p")
    thinking, budget = anthropic_thinking(body, max_tokens or 1_000_001)
    return ChatRequest(
        model=model,
        messages=system + messages,
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
        prefill=prefill,
        cache_salt=fields.cache_salt(body),
        tools=parse_tools(body),
        thinking=thinking,
        thinking_budget=budget,
    )


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name, feature in _REFUSED.items():
        if body.get(name) is not None:
            raise invalid(f"`{name}`: {feature} is not supported by this server", name)
    for name in body:
        if name not in _ACCEPTED:
            raise invalid(f"`{name}`: unknown field (extra inputs are not permitted)", name)


def _system(raw: Any) -> tuple[ChatMessage, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (ChatMessage("system", (TextPart(fields.text(raw, "system")),)),) if raw else ()
    if not isinstance(raw, list):
        raise invalid("`system` must be a string or an array of text blocks", "system")
    parts = []
    for i, block in enumerate(raw):
        where = f"system[{i}]"
        if not isinstance(block, dict) or block.get("type") != "text":
            raise invalid(f'`{where}` must be a text block: {{"type": "text", ...}}', where)
        parts.append(TextPart(_block_text(block, where)))
    return (ChatMessage("system", tuple(parts)),) if parts else ()


def _messages(raw: Any) -> tuple[tuple[ChatMessage, ...], str]:
    """The messages, and the text of a final assistant message (the prefill) split off."""
    if not isinstance(raw, list) or not raw:
        raise invalid("`messages` must be a non-empty array", "messages")
    out: list[ChatMessage] = []
    # The previous message's tool_use ids -> their tools' names: as on Anthropic's API, the
    # next message answers each with a tool_result, and results answer nothing else.
    pending: dict[str, str] = {}
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise invalid(f"`{where}` must be an object with `role` and `content`", where)
        role = msg.get("role")
        if role not in ("user", "assistant"):
            raise invalid(f"`{where}.role` must be 'user' or 'assistant'", f"{where}.role")
        messages = _message(msg.get("content"), f"{where}.content", role, pending)
        answered = {m.tool_call_id for m in messages if m.role == "tool"}
        if pending.keys() - answered:
            _unanswered(where, pending.keys() - answered)
        out.extend(messages)
        pending = {c.id: c.name for m in messages for c in m.tool_calls}
    if pending:  # the last message's tool_use blocks: answered by nothing
        _unanswered(f"messages[{len(raw) - 1}]", pending.keys())
    prefill = ""
    if out[-1].role == "assistant" and not out[-1].tool_calls:
        last = out.pop()
        prefill = "".join(p.text for p in last.parts if isinstance(p, TextPart))
        if not out:
            raise invalid("`messages` must contain a user message", "messages")
    return tuple(out), prefill


def _unanswered(where: str, ids: Any) -> None:
    """400 naming the message `where` that should have answered (or, the last one, that
    asked) the tool_use blocks `ids` that have no tool_result."""
    listed = ", ".join(sorted(ids))
    raise invalid(
        f"`{where}`: tool_use ids were found without tool_result blocks immediately after: "
        f"{listed}; each tool_use block needs a tool_result in the next (user) message",
        where,
    )


def _message(raw: Any, where: str, role: str, made: dict[str, str]) -> list[ChatMessage]:
    """One Messages message as chat messages: an assistant's text with its `tool_use`
    calls; a user's `tool_result` blocks as `tool` messages (in order), then the rest of its
    content as a user message (if any)."""
    if not isinstance(raw, list):
        return [ChatMessage(role, _content(raw, where, role))]
    results: list[ChatMessage] = []
    calls = []
    rest: list[Any] = []
    thoughts: list[str] = []
    for j, block in enumerate(raw):
        at = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use" and role == "assistant":
            calls.append(tool_use(block, at))
            if any(c.id == calls[-1].id for c in calls[:-1]):
                raise invalid(
                    f"`{at}.id` {calls[-1].id!r} is the id of another tool_use", f"{at}.id"
                )
        elif kind == "tool_result" and role == "user":
            if rest:  # as Anthropic's API: the results first, then any other content
                message = f"`{at}`: tool_result blocks must come before any other content"
                raise invalid(message, at)
            content = block.get("content", "")
            parts = _content(content, f"{at}.content", "tool") if content != [] else ()
            results.append(tool_result(block, at, made, parts))
            if any(r.tool_call_id == results[-1].tool_call_id for r in results[:-1]):
                where_id = f"{at}.tool_use_id"
                raise invalid(f"`{where_id}`: this tool_use was answered already", where_id)
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            thoughts.append(_thinking_text(block, at))
        elif kind in ("tool_use", "tool_result", "thinking", "redacted_thinking"):
            raise invalid(f"`{at}`: {kind} blocks belong in {role!r} messages", f"{at}.type")
        else:
            rest.append((j, block))
    out = results
    if rest or not results:
        parts = _content_blocks(rest, where, role)
        out.append(ChatMessage(role, parts, tuple(calls), reasoning="".join(thoughts)))
    return out


def _thinking_text(block: dict[str, Any], at: str) -> str:
    """An assistant's earlier thinking: a `thinking` block's text ("" for a
    `redacted_thinking` block: encrypted elsewhere, nothing a template can render)."""
    if block.get("type") == "redacted_thinking":
        return ""
    text = block.get("thinking")
    if not isinstance(text, str):
        raise invalid(f"`{at}.thinking` must be a string", f"{at}.thinking")
    return fields.text(text, f"{at}.thinking")


def _content(raw: Any, where: str, role: str) -> tuple[Part, ...]:
    if isinstance(raw, str):
        return (TextPart(fields.text(raw, where)),)
    if not isinstance(raw, list):
        raise invalid(f"`{where}` must be a string or an array of content blocks", where)
    return _content_blocks(list(enumerate(raw)), where, role)


def _content_blocks(raw: list[tuple[int, Any]], where: str, role: str) -> tuple[Part, ...]:
    """Text and image blocks (with their indices in the message); images in user messages
    and tool results only."""
    parts: list[Part] = []
    for j, block in raw:
        at = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        kind = kind if isinstance(kind, str) else None  # e.g. a list: unhashable, and wrong
        if kind == "text":
            parts.append(TextPart(_block_text(block, at)))
        elif kind == "image":
            if role not in ("user", "tool"):
                raise invalid(f"`{at}`: images are only accepted in user messages", at)
            parts.append(_image(block.get("source"), f"{at}.source"))
        elif kind in _BLOCK_FEATURES:
            raise invalid(
                f"`{at}.type`: {kind!r} blocks ({_BLOCK_FEATURES[kind]}) are not supported by "
                "this server; send text and image blocks",
                f"{at}.type",
            )
        else:
            raise invalid(f"`{at}.type` must be 'text' or 'image'", f"{at}.type")
    return tuple(parts)


def _block_text(block: dict[str, Any], at: str) -> str:
    if not isinstance(block.get("text"), str):
        raise invalid(f"`{at}.text` must be a string", f"{at}.text")
    return fields.text(block["text"], f"{at}.text")


_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def _sniff(data: str) -> str | None:
    """The media type the base64 `data`'s first bytes show (PNG, JPEG, GIF, WebP), or None
    (not base64, or another format: the decoder then says what is wrong)."""
    try:
        head = base64.b64decode(data[:24], validate=True)
    except (ValueError, binascii.Error):
        return None
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return next((kind for magic, kind in _MAGIC if head.startswith(magic)), None)


def _image(source: Any, at: str) -> ImagePart:
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        media_type = source.get("media_type")
        if media_type not in IMAGE_MEDIA_TYPES:
            raise invalid(
                f"`{at}.media_type` must be one of {', '.join(IMAGE_MEDIA_TYPES)}",
                f"{at}.media_type",
            )
        data = source.get("data")
        if not isinstance(data, str) or not data:
            raise invalid(f"`{at}.data` must be a non-empty base64 string", f"{at}.data")
        if data.startswith("data:"):
            raise invalid(
                f"`{at}.data` must be bare base64: remove the `data:...;base64,` prefix (the "
                "media type goes in `media_type`)",
                f"{at}.data",
            )
        actual = _sniff(data)
        if actual is not None and actual != media_type:  # as Anthropic's API refuses it
            raise invalid(
                f"`{at}.data` holds a {actual} image but `{at}.media_type` says {media_type}: "
                "send the image's own media type",
                f"{at}.media_type",
            )
        return ImagePart(f"data:{media_type};base64,{data}", f"{at}.data")
    if kind == "url":
        url = source.get("url")
        if not isinstance(url, str) or not url:
            raise invalid(
                f"`{at}.url` must be a non-empty http(s) URL (or, with --allowed-media-dir, a "
                "local path or file:// URL)",
                f"{at}.url",
            )
        return ImagePart(url, f"{at}.url")
    if kind == "file":
        raise invalid(f"`{at}`: the Files API is not supported by this server", f"{at}.type")
    raise invalid(
        f"`{at}.type` must be 'base64' (with `media_type` and `data`) or 'url'", f"{at}.type"
    )
