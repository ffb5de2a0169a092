"""Anthropic response bodies on the wire: the `message` object, the Messages streaming event
sequence and error objects.

Usage follows the Messages API's accounting: `input_tokens` are the prompt tokens that were
computed, `cache_read_input_tokens` those whose KV came from the prefix cache (together: the
whole prompt), `cache_creation_input_tokens` is 0 (the cache is filled after the answer, and
nothing is billed here). Pure formatting over engine events; no engine or cache access.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import Response

from gateway.api.anthropic.thinking import thinking_block
from gateway.api.anthropic.tool_render import BlockStream, content_blocks, tool_stop
from gateway.api.http import json_response
from gateway.api.sse import sse_data
from gateway.engine.request import ErrorEvent, FinishEvent, TokenEvent
from gateway.errors import APIError
from gateway.frontend.admission import Admission
from gateway.frontend.errors import Overloaded, engine_error
from gateway.tools.calls import CallSplitter

# The Messages API's error types by status; other statuses keep the closest type.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
OVERLOADED = 529


def error_status(error: APIError) -> tuple[int, str]:
    """(status, Anthropic error type). A full engine queue is 529 overloaded_error, as the
    API answers when it is overloaded; 5xx other than 529 are api_error."""
    if isinstance(error, Overloaded):
        return OVERLOADED, "overloaded_error"
    kind = _ERROR_TYPES.get(error.status)
    if kind is None:
        kind = "api_error" if error.status >= 500 else "invalid_request_error"
    return error.status, kind


def error_body(error: APIError) -> dict[str, Any]:
    """`{"type": "error", "error": {"type", "message"}}`. Anthropic's errors have no `param`:
    the field at fault leads the message unless the message names it already (a bad image
    among several says which block to fix)."""
    _, kind = error_status(error)
    message = error.message
    if error.param and f"`{error.param}" not in message:
        message = f"`{error.param}`: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


def render_error(error: APIError) -> Response:
    status, _ = error_status(error)
    return json_response(error_body(error), status, error.headers)


def stop_reason(event: FinishEvent) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for a finished completion."""
    if event.stop_sequence is not None:
        return "stop_sequence", event.stop_sequence
    if event.finish_reason == "length":
        return "max_tokens", None
    return "end_turn", None


def usage_body(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
        "output_tokens": output_tokens,
    }


def message_body(
    admission: Admission,
    text: str,
    stop: tuple[str | None, str | None],
    output_tokens: int,
) -> dict[str, Any]:
    """The `message` object; `stop` is (None, None) in `message_start`."""
    event = admission.event
    return {
        "id": admission.request_id,
        "type": "message",
        "role": "assistant",
        "model": admission.chat.model,
        "content": [{"type": "text", "text": text}] if stop[0] is not None else [],
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": usage_body(event.prompt_tokens, event.cached_tokens, output_tokens),
    }


async def collect(
    admission: Admission, omit: bool = False, context: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The whole answer as one `message` (raises the APIError of an engine failure). `omit`:
    the thinking's text only in its block's signature (`thinking.display: "omitted"`);
    `context`: the message's `context_management` (the edits applied), if asked for."""
    pieces: list[str] = []
    thoughts: list[str] = []
    while True:
        event = await admission.stream.get()
        if isinstance(event, TokenEvent):
            pieces.append(event.text)
            thoughts.append(event.reasoning)
        elif isinstance(event, FinishEvent):
            pieces.append(event.text)
            thoughts.append(event.reasoning)
            output = event.usage.completion_tokens
            body = message_body(admission, "".join(pieces), stop_reason(event), output)
            if admission.tool_format is not None:
                splitter = CallSplitter(admission.tool_format, "toolu_")
                splitter.feed("".join(pieces))
                splitter.finish(cut=event.finish_reason == "length")
                body["content"] = content_blocks(splitter.text, splitter.calls)
                body["stop_reason"] = tool_stop(event, splitter.calls, body["stop_reason"])
            if any(thoughts):  # the thinking comes first, as its own block
                body["content"].insert(0, thinking_block("".join(thoughts), omit))
            if context is not None:
                body["context_management"] = context
            return body
        elif isinstance(event, ErrorEvent):
            raise engine_error(event)


def _delta(text: str) -> str:
    body = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": text},
    }
    return sse_data(body, "content_block_delta")


async def sse_stream(
    admission: Admission,
    on_abandon: Callable[[], None],
    omit: bool = False,
    context: dict[str, Any] | None = None,
) -> AsyncIterator[str]:
    """The Messages streaming sequence: message_start, content_block_start, ping,
    content_block_delta (text_delta)..., content_block_stop, message_delta (stop_reason,
    output usage, and `context` as its `context_management` if asked for), message_stop;
    an engine failure ends it with an `error` event. `omit` as in `collect`. `on_abandon`
    runs if the client goes away before the end, to free the request's row."""
    done = False
    start = {"type": "message_start", "message": message_body(admission, "", (None, None), 0)}
    block = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    blocks = None
    if admission.tool_format is not None:  # blocks open as text and calls come
        blocks = BlockStream(CallSplitter(admission.tool_format, "toolu_"), omit)
    elif admission.thinks:  # blocks open as thinking and text come
        blocks = BlockStream(None, omit)
    try:
        opening = "" if blocks is not None else sse_data(block, "content_block_start")
        yield (sse_data(start, "message_start") + opening + sse_data({"type": "ping"}, "ping"))
        while not done:
            out: list[str] = []
            for event in await admission.stream.get_ready():
                if isinstance(event, TokenEvent):
                    if event.reasoning and blocks is not None:
                        out.append(blocks.think(event.reasoning))
                    if event.text and blocks is not None:
                        out.append(blocks.feed(event.text))
                    elif event.text:  # empty: held back (a possible stop string, a partial char)
                        out.append(_delta(event.text))
                elif isinstance(event, FinishEvent):
                    done = True
                    out.append(_final(event, blocks, context))
                    break
                elif isinstance(event, ErrorEvent):
                    done = True
                    out.append(sse_data(error_body(engine_error(event)), "error"))
                    break
            if out:
                yield "".join(out)
    finally:
        if not done:
            on_abandon()


def _final(
    event: FinishEvent, blocks: BlockStream | None = None, context: dict[str, Any] | None = None
) -> str:
    reason, sequence = stop_reason(event)
    if blocks is not None:
        thought = blocks.think(event.reasoning) if event.reasoning else ""
        closing = thought + blocks.feed(event.text, end=True, cut=event.finish_reason == "length")
        reason = tool_stop(event, blocks.calls, reason)
    else:
        closing = (_delta(event.text) if event.text else "") + sse_data(
            {"type": "content_block_stop", "index": 0}, "content_block_stop"
        )
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": reason, "stop_sequence": sequence},
        "usage": {"output_tokens": event.usage.completion_tokens},
    }
    if context is not None:
        delta["context_management"] = context
    return (
        closing
        + sse_data(delta, "message_delta")
        + sse_data({"type": "message_stop"}, "message_stop")
    )
