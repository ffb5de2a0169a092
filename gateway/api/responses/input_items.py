"""A Responses body's `input` -> the turn's messages (pure).

    input: "text" | [ {type: message?, role, content: "text" | [input_text | input_image |
                       input_audio | output_text]}
                     | {type: function_call, call_id, name, namespace?, arguments}
                     | {type: custom_tool_call, call_id, name, namespace?, input}
                     | {type: function_call_output | custom_tool_call_output, call_id,
                        output: "text" | [input_text | input_image | input_audio]}
                     | {type: reasoning, encrypted_content | content | summary} ]

A reasoning item is earlier thinking, owned by the assistant turn after it: its
`encrypted_content` when present (opened by the server's key: gateway.api.responses.sealed;
a blob the key did not seal is a 400 naming it), else its `content`, else its `summary`.
Message items' `id`s (Codex sends them) are not needed and not read.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gateway.api import fields
from gateway.api.audio_part import audio_url, input_audio
from gateway.api.responses.sealed import ReasoningSeal
from gateway.api.responses.tools import function_call, output_call_id, tool_message, with_calls
from gateway.errors import invalid
from gateway.frontend.chat import AudioPart, ChatMessage, ImagePart, TextPart

ROLES = ("system", "developer", "user", "assistant")
CALLS = ("function_call", "custom_tool_call")
OUTPUTS = ("function_call_output", "custom_tool_call_output")


def parse_input(
    raw: Any, seal: ReasoningSeal | None = None
) -> tuple[tuple[ChatMessage, ...], tuple[str, ...]]:
    """The input's messages (calls joined to the assistant message they follow) and the
    field paths of its outputs' `call_id`s. `seal` opens reasoning items' `encrypted_content`
    (None: no key, any blob is foreign)."""
    if isinstance(raw, str):
        return (ChatMessage("user", (TextPart(fields.text(raw, "input")),)),), ()
    if not isinstance(raw, list) or not raw:
        raise invalid("`input` must be a string or a non-empty array of message items", "input")
    messages: list[ChatMessage] = []
    params: list[str] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind in CALLS:
            with_calls(messages, function_call(item, where))
        elif kind == "reasoning":  # earlier thinking: the assistant turn after it owns it
            thought = _reasoning_item(item, where, seal)
            messages.append(ChatMessage("assistant", (), reasoning=thought))
        elif kind in OUTPUTS:
            call_id = output_call_id(item, where)
            parts = _content(item.get("output"), f"{where}.output", "tool")
            messages.append(tool_message(call_id, parts))
            params.append(f"{where}.call_id")
        else:
            message = _item(item, where)
            last = messages[-1] if messages else None
            if last and message.role == "assistant" and last.role == "assistant" and not last.parts:
                message = replace(message, reasoning=last.reasoning, tool_calls=last.tool_calls)
                messages.pop()
            messages.append(message)
    for i, message in enumerate(messages):
        if message.role == "assistant" and not message.parts:  # thinking without a turn after it
            messages[i] = replace(message, parts=(TextPart(""),))
    return tuple(messages), tuple(params)


def _reasoning_item(item: dict[str, Any], where: str, seal: ReasoningSeal | None) -> str:
    """A `reasoning` input item's text: its `encrypted_content` (what this server sealed),
    else its `content` (reasoning_text parts), else its `summary` (summary_text parts)."""
    blob = item.get("encrypted_content")
    if blob is not None:
        at = f"{where}.encrypted_content"
        if seal is None:
            raise invalid(f"`{at}`: this server holds no key to open it; leave it out", at)
        return seal.open(blob, at)
    for key in ("content", "summary"):
        parts = item.get(key) or []
        if not isinstance(parts, list):
            raise invalid(f"`{where}.{key}` must be an array", f"{where}.{key}")
        texts = []
        for j, part in enumerate(parts):
            text = part.get("text") if isinstance(part, dict) else None
            if not isinstance(text, str):
                raise invalid(f"`{where}.{key}[{j}].text` must be a string", f"{where}.{key}[{j}]")
            texts.append(fields.text(text, f"{where}.{key}[{j}].text"))
        if texts:
            return "\n\n".join(texts)
    return ""


def _item(item: Any, where: str) -> ChatMessage:
    if not isinstance(item, dict):
        raise invalid(f"`{where}` must be a message object with `role` and `content`", where)
    kind = item.get("type", "message")
    if kind != "message":
        raise invalid(
            f"`{where}.type` {kind!r}: this server accepts message, function_call, "
            "function_call_output, custom_tool_call, custom_tool_call_output and reasoning "
            "items (continue a conversation with `previous_response_id`)",
            f"{where}.type",
        )
    role = item.get("role")
    if role not in ROLES:
        raise invalid(f"`{where}.role` must be one of {', '.join(ROLES)}", f"{where}.role")
    role = "system" if role == "developer" else role
    return ChatMessage(role, _content(item.get("content"), f"{where}.content", role))


def _content(content: Any, where: str, role: str) -> tuple[TextPart | ImagePart | AudioPart, ...]:
    if isinstance(content, str):
        return (TextPart(fields.text(content, where)),)
    if not isinstance(content, list) or not content:
        raise invalid(f"`{where}` must be a string or an array of parts", where)
    return tuple(_part(p, f"{where}[{j}]", role) for j, p in enumerate(content))


def _part(part: Any, at: str, role: str) -> TextPart | ImagePart | AudioPart:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text", "text"):
        if not isinstance(part.get("text"), str):
            raise invalid(f"`{at}.text` must be a string", f"{at}.text")
        return TextPart(fields.text(part["text"], f"{at}.text"))
    if kind == "input_image":
        if role not in ("user", "tool"):  # a tool's output: the agent's screenshot
            raise invalid(
                f"`{at}`: images are only accepted in user messages and function call outputs",
                at,
            )
        if part.get("file_id") is not None:
            raise invalid(
                f"`{at}.file_id`: this server has no Files API; send the image as "
                "`image_url` (an http(s) URL or a data:image/... URI)",
                f"{at}.file_id",
            )
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise invalid(
                f"`{at}.image_url` must be a string: an http(s) URL, a data:image/... URI "
                "or a file path",
                f"{at}.image_url",
            )
        return ImagePart(url, f"{at}.image_url")
    if kind in ("input_audio", "audio_url"):
        if role not in ("user", "tool"):
            raise invalid(
                f"`{at}`: audio is only accepted in user messages and function call outputs",
                at,
            )
        if kind == "input_audio":
            return input_audio(part.get("input_audio"), at)
        return audio_url(part, at)
    if kind == "input_file":
        raise invalid(f"`{at}`: file inputs are not supported; send text, images or audio", at)
    raise invalid(
        f"`{at}.type` must be 'input_text', 'input_image', 'input_audio' or 'output_text'", at
    )
