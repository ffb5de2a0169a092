"""OpenAI response bodies on the wire: `chat.completion` JSON, `chat.completion.chunk` SSE
streams and error objects.

Pure formatting over engine events (see gateway.engine.request); no engine or cache access.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import Response

from gateway.api.http import json_response
from gateway.api.openai.tool_render import call_dicts, finish_reason, piece_delta
from gateway.api.sse import DONE, sse_data
from gateway.engine.request import (
    ErrorEvent,
    Event,
    FinishEvent,
    TokenEvent,
    TokenLogprob,
    Usage,
)
from gateway.errors import APIError
from gateway.frontend.errors import engine_error
from gateway.frontend.streams import EventStream
from gateway.tools.calls import CallSplitter
from gateway.tools.formats import ToolFormat


def error_body(error: APIError) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}`."""
    return {
        "error": {
            "message": error.message,
            "type": error.type,
            "param": error.param,
            "code": error.code,
        }
    }


def render_error(error: APIError) -> Response:
    """An APIError as OpenAI's error response (status, body, headers such as Retry-After)."""
    return json_response(error_body(error), error.status, error.headers)


async def sse_stream(
    stream: EventStream[Event],
    request_id: str,
    created: int,
    model: str,
    usage: bool,
    on_abandon: Callable[[], None],
    tool_format: ToolFormat | None = None,
) -> AsyncIterator[str]:
    """OpenAI chat.completion.chunk events until [DONE]. `on_abandon` runs if the client goes
    away before the end (the generator is closed early), to free the request's row. With a
    `tool_format` the answer is split into `content` and `tool_calls` deltas.

    Events that are already waiting are written together (one chunk per token still, but
    one transport write), so a busy loop does not fall further behind the engine."""
    done = False
    splitter = CallSplitter(tool_format) if tool_format is not None else None

    def split_chunks(text: str, logprobs: list[TokenLogprob], end: bool = False) -> str:
        assert splitter is not None
        pieces = splitter.feed(text) + (splitter.finish() if end else [])
        deltas = [d for d in map(piece_delta, pieces) if d is not None]
        if logprobs and not deltas:
            deltas = [{"content": ""}]
        return "".join(
            sse_data(chunk_body(request_id, created, model, d, None, logprobs if i == 0 else None))
            for i, d in enumerate(deltas)
        )

    def token_chunk(event: TokenEvent) -> str:
        thought, logprobs = "", event.logprobs
        if event.reasoning:  # vLLM's `delta.reasoning_content`; the token's logprobs ride on it
            delta = {"reasoning_content": event.reasoning}
            thought = sse_data(chunk_body(request_id, created, model, delta, None, list(logprobs)))
            logprobs = ()
        if not (event.text or logprobs):
            return thought  # held back (a possible stop string, a partial character)
        if splitter is not None:
            return thought + split_chunks(event.text, list(logprobs))
        delta = {"content": event.text}
        return thought + sse_data(
            chunk_body(request_id, created, model, delta, None, list(logprobs))
        )

    def final_chunks(event: FinishEvent) -> str:
        out = []
        reason: str = event.finish_reason
        if event.reasoning:
            delta = {"reasoning_content": event.reasoning}
            out.append(sse_data(chunk_body(request_id, created, model, delta)))
        if splitter is not None:
            out.append(split_chunks(event.text, [], end=True))
            reason = finish_reason(event, splitter.calls)
        elif event.text:
            out.append(sse_data(chunk_body(request_id, created, model, {"content": event.text})))
        out.append(sse_data(chunk_body(request_id, created, model, {}, reason)))
        if usage:
            out.append(sse_data(usage_chunk_body(request_id, created, model, event.usage)))
        return "".join(out) + DONE

    try:
        yield sse_data(chunk_body(request_id, created, model, {"role": "assistant", "content": ""}))
        while not done:
            out: list[str] = []
            for event in await stream.get_ready():
                if isinstance(event, TokenEvent):
                    out.append(token_chunk(event))
                elif isinstance(event, FinishEvent):
                    done = True
                    out.append(final_chunks(event))
                    break
                elif isinstance(event, ErrorEvent):
                    done = True
                    out.append(sse_data(error_body(engine_error(event))) + DONE)
                    break
            text = "".join(out)
            if text:
                yield text
    finally:
        if not done:
            on_abandon()


async def collect(
    stream: EventStream[Event],
    request_id: str,
    created: int,
    model: str,
    want_logprobs: bool,
    tool_format: ToolFormat | None = None,
) -> dict[str, Any]:
    pieces: list[str] = []
    thoughts: list[str] = []
    logprobs: list[Any] = []
    while True:
        event = await stream.get()
        if isinstance(event, TokenEvent):
            pieces.append(event.text)
            thoughts.append(event.reasoning)
            logprobs.extend(event.logprobs)
        elif isinstance(event, FinishEvent):
            pieces.append(event.text)
            thoughts.append(event.reasoning)
            text = "".join(pieces)
            lps = logprobs if want_logprobs else None
            body = completion_body(
                request_id, created, model, text, event.finish_reason, event.usage, lps
            )
            if any(thoughts):  # vLLM's field: the model's thinking, apart from its answer
                body["choices"][0]["message"]["reasoning_content"] = "".join(thoughts)
            if tool_format is not None:
                splitter = CallSplitter(tool_format)
                splitter.feed(text)
                splitter.finish()
                choice = body["choices"][0]
                if splitter.calls:
                    content = splitter.text
                    choice["message"]["content"] = content if content.strip() else None
                    choice["message"]["tool_calls"] = call_dicts(splitter.calls)
                choice["finish_reason"] = finish_reason(event, splitter.calls)
            return body
        elif isinstance(event, ErrorEvent):
            raise engine_error(event)


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        **(
            {"completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens}}
            if usage.reasoning_tokens
            else {}
        ),
    }


def logprob_list(entries: list[TokenLogprob] | tuple[TokenLogprob, ...]) -> list[dict[str, Any]]:
    """Token logprobs in OpenAI's wire shape (chat `logprobs.content`, Responses deltas)."""
    return [
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


def logprobs_dict(entries: list[TokenLogprob]) -> dict[str, Any]:
    return {"content": logprob_list(entries)}


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
