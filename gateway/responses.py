"""Response bodies on the wire: collected JSON, SSE streams and error objects.

Pure formatting over engine events (see gateway.engine.request); no engine or cache access.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from gateway.engine.request import ErrorEvent, FinishEvent, TokenEvent
from gateway.errors import APIError
from gateway.openai_api import chunk_body, completion_body, usage_chunk_body
from gateway.streams import EventStream

log = logging.getLogger(__name__)


async def sse_stream(
    stream: EventStream,
    request_id: str,
    created: int,
    model: str,
    usage: bool,
    on_abandon: Callable[[], None],
) -> AsyncIterator[str]:
    """OpenAI chat.completion.chunk events until [DONE]. `on_abandon` runs if the client goes
    away before the end (the generator is closed early), to free the request's row."""
    done = False
    try:
        yield _sse(chunk_body(request_id, created, model, {"role": "assistant", "content": ""}))
        while True:
            event = await stream.get()
            if isinstance(event, TokenEvent):
                if event.text or event.logprobs:
                    delta = {"content": event.text}
                    body = chunk_body(request_id, created, model, delta, None, list(event.logprobs))
                    yield _sse(body)
            elif isinstance(event, FinishEvent):
                done = True
                if event.text:
                    yield _sse(chunk_body(request_id, created, model, {"content": event.text}))
                yield _sse(chunk_body(request_id, created, model, {}, event.finish_reason))
                if usage:
                    yield _sse(usage_chunk_body(request_id, created, model, event.usage))
                yield "data: [DONE]\n\n"
                return
            elif isinstance(event, ErrorEvent):
                done = True
                yield _sse(APIError(event.status, event.message, event.type).to_dict())
                yield "data: [DONE]\n\n"
                return
    finally:
        if not done:
            on_abandon()


async def collect(
    stream: EventStream, request_id: str, created: int, model: str, want_logprobs: bool
) -> dict[str, Any]:
    pieces: list[str] = []
    logprobs: list[Any] = []
    while True:
        event = await stream.get()
        if isinstance(event, TokenEvent):
            pieces.append(event.text)
            logprobs.extend(event.logprobs)
        elif isinstance(event, FinishEvent):
            pieces.append(event.text)
            text = "".join(pieces)
            lps = logprobs if want_logprobs else None
            return completion_body(
                request_id, created, model, text, event.finish_reason, event.usage, lps
            )
        elif isinstance(event, ErrorEvent):
            raise APIError(event.status, event.message, event.type)


def _sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


def error_response(error: APIError) -> Response:
    # ensure_ascii: messages may quote user input, including lone surrogates that UTF-8
    # cannot encode; escaped JSON is still exactly what the client sent.
    body = json.dumps(error.to_dict(), ensure_ascii=True)
    return Response(body, error.status, error.headers, media_type="application/json")


async def api_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    if exc.status >= 500:
        log.error("request failed: %s", exc.message)
    return error_response(exc)


async def http_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_response(APIError(exc.status_code, str(exc.detail), kind))


async def server_error(_: Request, exc: Exception) -> Response:
    log.exception("unhandled error", exc_info=exc)
    return error_response(
        APIError(500, f"internal server error: {type(exc).__name__}", "server_error")
    )
