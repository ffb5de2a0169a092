"""OpenAI Chat Completions request bodies (`POST /v1/chat/completions`) -> `ChatRequest`.

The route is in `gateway.api.openai.routes`, response bodies and SSE chunks in
`gateway.api.openai.render`. Parsing is pure; every user mistake is an `APIError` whose
message names the field (`param`) and says what to change; errors are rendered as OpenAI
error objects.
"""

from __future__ import annotations

from typing import Any

from gateway.api import fields
from gateway.api.accepted import OPENAI_CHAT, refuse_unapplied, unknown_fields
from gateway.api.audio_part import audio_url, input_audio
from gateway.api.openai.tools import check_call_ids, parse_tools, tool_calls
from gateway.api.thinking_fields import effort_switch, message_reasoning, template_kwargs
from gateway.errors import invalid
from gateway.frontend.chat import ChatMessage, ChatRequest, ImagePart, Part, TextPart, VideoPart
from gateway.structured.response_format import response_format_grammar

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP_STRINGS = 16
MAX_TOP_LOGPROBS = 20
MAX_CHOICES = 128  # `n`; the server's --max-batch bounds it further (the prompt builder)


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a decoded JSON body. Unknown fields are ignored, as OpenAI clients send extras;
    every documented field is applied or refused (gateway.api.accepted), never ignored."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    model = fields.model_name(body)
    messages = _messages(body.get("messages"))
    refuse_unapplied(body, OPENAI_CHAT)
    max_tokens = fields.opt_int(body, "max_completion_tokens", 1, 1_000_000)
    if max_tokens is None:
        max_tokens = fields.opt_int(body, "max_tokens", 1, 1_000_000)
    temperature = fields.opt_num(body, "temperature", 0.0, 2.0, default=1.0)
    top_p = fields.opt_num(body, "top_p", 0.0, 1.0, default=1.0)
    if top_p == 0.0:
        raise invalid("`top_p` must be greater than 0 (use temperature 0 for greedy)", "top_p")
    top_k = fields.opt_int(body, "top_k", -1, 1_000_000) or 0
    seed = fields.opt_int(body, "seed", -(2**63), 2**64 - 1)
    logprobs = fields.opt_bool(body, "logprobs", False)
    top_logprobs = fields.opt_int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    if top_logprobs and not logprobs:
        raise invalid("`top_logprobs` requires `logprobs: true`", "top_logprobs")
    stream = fields.opt_bool(body, "stream", False)
    ignore_eos = fields.opt_bool(body, "ignore_eos", False)
    thinking = effort_switch(body.get("reasoning_effort"), "reasoning_effort")
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise invalid("`stream_options` must be an object", "stream_options")
        if not stream:  # as OpenAI's API answers
            raise invalid(
                "`stream_options` is only allowed when `stream` is true", "stream_options"
            )
        include_usage = bool(options.get("include_usage", False))
    n = fields.opt_int(body, "n", 1, MAX_CHOICES) or 1
    return ChatRequest(
        ignored_fields=unknown_fields(body, OPENAI_CHAT),
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k, 0),
        seed=None if seed is None else seed % (2**63),
        stop=fields.stop_strings(body.get("stop"), "stop", MAX_STOP_STRINGS, True),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        stream=stream,
        include_usage=include_usage,
        ignore_eos=ignore_eos,
        grammar=response_format_grammar(body.get("response_format")),
        cache_salt=fields.cache_salt(body),
        keep_alive_s=fields.keep_alive(body),
        tools=parse_tools(body),
        n=n,
        **fields.shaping(body, max_tokens),
        thinking=thinking,
        # The field a 400 names; the default unless the effort switched thinking.
        thinking_field="thinking" if thinking is None else "reasoning_effort",
        template_kwargs=template_kwargs(body),
    )


def _messages(raw: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(raw, list) or not raw:
        raise invalid("`messages` must be a non-empty array", "messages")
    out = []
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise invalid(f"`{where}` must be an object with `role` and `content`", where)
        role = msg.get("role")
        if role not in ROLES:
            raise invalid(f"`{where}.role` must be one of {', '.join(ROLES)}", f"{where}.role")
        role = "system" if role == "developer" else role
        calls = ()
        if role == "assistant":
            calls = tool_calls(msg.get("tool_calls"), f"{where}.tool_calls")
        content = msg.get("content")
        if calls and content is None:
            content = ""  # an assistant message that only calls tools
        # Images in tool results: the screenshot an agent's tool returns.
        parts = _content(content, f"{where}.content", allow_images=role in ("user", "tool"))
        if role != "tool":
            thought = message_reasoning(msg, where) if role == "assistant" else ""
            out.append(ChatMessage(role, parts, calls, reasoning=thought))
            continue
        call_id = msg.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise invalid(f"`{where}.tool_call_id` must be a string", f"{where}.tool_call_id")
        out.append(ChatMessage(role, parts, tool_call_id=call_id))
    check_call_ids(tuple(out))
    return tuple(out)


def _content(raw: Any, where: str, allow_images: bool) -> tuple[Part, ...]:
    if isinstance(raw, str):
        return (TextPart(fields.text(raw, where)),)
    if not isinstance(raw, list):
        raise invalid(f"`{where}` must be a string or an array of content parts", where)
    parts: list[Part] = []
    for j, part in enumerate(raw):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise invalid(f"`{at}.text` must be a string", f"{at}.text")
            parts.append(TextPart(fields.text(part["text"], f"{at}.text")))
        elif kind == "image_url":
            if not allow_images:
                raise invalid(f"`{at}`: images are only accepted in user messages", at)
            url = _media_url(part, at, "image_url", "image")
            parts.append(ImagePart(url, f"{at}.image_url.url"))
        elif kind == "video_url":  # vLLM's convention for video input
            if not allow_images:
                raise invalid(f"`{at}`: videos are only accepted in user messages", at)
            url = _media_url(part, at, "video_url", "video")
            parts.append(VideoPart(url, f"{at}.video_url.url"))
        elif kind in ("input_audio", "audio_url"):
            if not allow_images:
                raise invalid(f"`{at}`: audio is only accepted in user messages", at)
            if kind == "input_audio":
                parts.append(input_audio(part.get("input_audio"), at))
            else:
                parts.append(audio_url(part, at))
        else:
            raise invalid(
                f"`{at}.type` must be 'text', 'image_url', 'video_url', 'input_audio' or "
                "'audio_url'",
                f"{at}.type",
            )
    return tuple(parts)


def _media_url(part: dict[str, Any], at: str, key: str, mime: str) -> str:
    """The URL of an `image_url` or `video_url` part: an object with `url`, or the URL
    string itself."""
    url = fields.media_url(part, at, key, mime)
    value = part.get(key)
    detail = value.get("detail") if isinstance(value, dict) else None
    if detail is not None and detail not in ("auto", "low", "high"):
        # OpenAI's values; the image is always seen at the model's own resolution here
        raise invalid(f"`{at}.{key}.detail` must be 'auto', 'low' or 'high'", f"{at}.{key}.detail")
    return url
