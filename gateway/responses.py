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

from gateway.engine.request import EngineBusy, ErrorEvent, ErrorKind, FinishEvent, TokenEvent
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
    away before the end (the generator is closed early), to free the request's row.

    Events that are already waiting are written together (one chunk per token still, but
    one transport write), so a busy loop does not fall further behind the engine."""
    done = False

    def token_chunk(event: TokenEvent) -> str:
        if not (event.text or event.logprobs):
            return ""  # held back (a possible stop string, a partial character)
        delta = {"content": event.text}
        return _sse(chunk_body(request_id, created, model, delta, None, list(event.logprobs)))

    def final_chunks(event: FinishEvent) -> str:
        out = []
        if event.text:
            out.append(_sse(chunk_body(request_id, created, model, {"content": event.text})))
        out.append(_sse(chunk_body(request_id, created, model, {}, event.finish_reason)))
        if usage:
            out.append(_sse(usage_chunk_body(request_id, created, model, event.usage)))
        return "".join(out) + "data: [DONE]\n\n"

    try:
        yield _sse(chunk_body(request_id, created, model, {"role": "assistant", "content": ""}))
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
                    out.append(_sse(engine_error(event).to_dict()) + "data: [DONE]\n\n")
                    break
            text = "".join(out)
            if text:
                yield text
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
            raise engine_error(event)


def engine_error(event: ErrorEvent) -> APIError:
    """The OpenAI error for an engine failure: 503 while shutting down, else 500."""
    if event.kind is ErrorKind.SHUTTING_DOWN:
        return APIError(503, event.message, "server_error", code="unavailable")
    return APIError(500, event.message, "server_error")


def engine_busy(busy: EngineBusy) -> APIError:
    return APIError(
        429,
        f"{busy}; retry shortly",
        "rate_limit_error",
        code="server_busy",
        headers={"Retry-After": "1"},
    )


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
