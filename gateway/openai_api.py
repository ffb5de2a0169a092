"""The OpenAI wire format: request bodies -> typed `ChatRequest`, engine events -> response
bodies and SSE chunks. Pure functions, no I/O; every user mistake is an `APIError` whose
message names the field (`param`) and says what to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gateway.engine.request import TokenLogprob, Usage
from gateway.errors import APIError, invalid
from gateway.structured.response_format import response_format_grammar

ROLES = ("system", "developer", "user", "assistant")
MAX_STOP_STRINGS = 16
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class ImagePart:
    url: str
    param: str  # dotted path of the url field, for error messages


@dataclass(frozen=True)
class ChatMessage:
    role: str  # system | user | assistant ("developer" is folded into system)
    parts: tuple[TextPart | ImagePart, ...]


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: tuple[ChatMessage, ...]
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    logprobs: bool
    top_logprobs: int
    stream: bool
    include_usage: bool
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens tokens (benchmarks)
    grammar: str | None = None  # structured output (`response_format`), see gateway.structured

    @property
    def images(self) -> list[ImagePart]:
        return [p for m in self.messages for p in m.parts if isinstance(p, ImagePart)]


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a decoded JSON body. Unknown fields are ignored, as OpenAI clients send extras
    (e.g. `user`); fields we cannot honour are refused rather than silently ignored."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("`model` is required and must be a string", "model")
    messages = _messages(body.get("messages"))
    _refuse_unsupported(body)
    max_tokens = _opt_int(body, "max_completion_tokens", 1, 1_000_000)
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens", 1, 1_000_000)
    temperature = _opt_num(body, "temperature", 0.0, 2.0, default=1.0)
    top_p = _opt_num(body, "top_p", 0.0, 1.0, default=1.0)
    if top_p == 0.0:
        raise invalid("`top_p` must be greater than 0 (use temperature 0 for greedy)", "top_p")
    top_k = _opt_int(body, "top_k", -1, 1_000_000) or 0
    seed = _opt_int(body, "seed", -(2**63), 2**64 - 1)
    logprobs = _opt_bool(body, "logprobs", False)
    top_logprobs = _opt_int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    if top_logprobs and not logprobs:
        raise invalid("`top_logprobs` requires `logprobs: true`", "top_logprobs")
    stream = _opt_bool(body, "stream", False)
    ignore_eos = _opt_bool(body, "ignore_eos", False)
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise invalid("`stream_options` must be an object", "stream_options")
        include_usage = bool(options.get("include_usage", False))
    n = _opt_int(body, "n", 1, 128) or 1
    if n != 1:
        raise invalid("`n` > 1 is not supported; send n separate requests", "n")
    return ChatRequest(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k, 0),
        seed=None if seed is None else seed % (2**63),
        stop=_stop(body.get("stop")),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        stream=stream,
        include_usage=include_usage,
        ignore_eos=ignore_eos,
        grammar=response_format_grammar(body.get("response_format")),
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
        parts = _content(msg.get("content"), f"{where}.content", allow_images=role == "user")
        out.append(ChatMessage(role, parts))
    return tuple(out)


def _text(value: str, where: str) -> str:
    """Text must be encodable as UTF-8 (JSON allows lone surrogates such as "\\ud800")."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid(
            f"`{where}` contains an unpaired surrogate; send valid Unicode", where
        ) from None
    return value


def _content(raw: Any, where: str, allow_images: bool) -> tuple[TextPart | ImagePart, ...]:
    if isinstance(raw, str):
        return (TextPart(_text(raw, where)),)
    if not isinstance(raw, list):
        raise invalid(f"`{where}` must be a string or an array of content parts", where)
    parts: list[TextPart | ImagePart] = []
    for j, part in enumerate(raw):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise invalid(f"`{at}.text` must be a string", f"{at}.text")
            parts.append(TextPart(_text(part["text"], f"{at}.text")))
        elif kind == "image_url":
            if not allow_images:
                raise invalid(f"`{at}`: images are only accepted in user messages", at)
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str) or not url:
                raise invalid(
                    f"`{at}.image_url.url` must be a string: an http(s) URL, a data:image/... "
                    "URI or a file path",
                    f"{at}.image_url.url",
                )
            parts.append(ImagePart(url, f"{at}.image_url.url"))
        else:
            raise invalid(f"`{at}.type` must be 'text' or 'image_url'", f"{at}.type")
    return tuple(parts)


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value not in (None, 0, 0.0):
            raise invalid(f"`{name}` is not supported by this server; omit it or send 0", name)
    if body.get("tools") or body.get("functions"):
        raise invalid("tool calling is not supported by this server", "tools")


def _stop(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise invalid("`stop` must be a non-empty string or an array of non-empty strings", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise invalid(f"`stop` accepts at most {MAX_STOP_STRINGS} strings", "stop")
    return tuple(_text(s, "stop") for s in stops)


def _opt_int(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        # A float stands for an integer only where it is exact (below 2**53): beyond that the
        # parser may already have rounded the client's integer (orjson turns integers outside
        # 64 bits into floats), and a rounded value must not slip into range.
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            value = int(value)
        else:
            raise invalid(f"`{name}` must be an integer", name)
    if not lo <= value <= hi:
        raise invalid(f"`{name}` must be between {lo} and {hi}, got {value}", name)
    return value


def _opt_num(body: dict[str, Any], name: str, lo: float, hi: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(f"`{name}` must be a number", name)
    if not lo <= value <= hi:
        raise invalid(f"`{name}` must be between {lo} and {hi}, got {value}", name)
    return float(value)


def _opt_bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"`{name}` must be true or false", name)
    return value


# ----- responses ----------------------------------------------------------------------------


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def logprobs_dict(entries: list[TokenLogprob]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": e.token,
                "logprob": e.logprob,
                "bytes": list(e.bytes),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": list(b)} for t, _, lp, b in e.top
                ],
            }
            for e in entries
        ]
    }


def completion_body(
    request_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    usage: Usage,
    logprobs: list[TokenLogprob] | None,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs_dict(logprobs) if logprobs is not None else None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage_dict(usage),
    }


def chunk_body(
    request_id: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    logprobs: list[TokenLogprob] | None = None,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": logprobs_dict(logprobs) if logprobs else None,
                "finish_reason": finish_reason,
            }
        ],
    }


def usage_chunk_body(request_id: str, created: int, model: str, usage: Usage) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_dict(usage),
    }


def model_not_found(name: str, served: str) -> APIError:
    return APIError(
        404,
        f"The model `{name}` does not exist on this server; it serves `{served}` (see /v1/models)",
        "invalid_request_error",
        "model",
        "model_not_found",
    )
