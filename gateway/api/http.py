"""HTTP plumbing shared by the wire formats: bounded JSON bodies, disconnects, and per-route
error rendering (API keys: gateway/api/keys.py).

Everything here is protocol-neutral: failures are `APIError`s and each route renders them in
its own API's error shape (`with_errors`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.api.body_budget import BodyBudget
from gateway.api.fields import printable
from gateway.errors import APIError, invalid, too_large

log = logging.getLogger(__name__)
T = TypeVar("T")
Handler = Callable[[Request], Awaitable[Response]]
Renderer = Callable[[APIError], Response]


async def read_json(request: Request, limit: int, budget: BodyBudget | None = None) -> Any:
    """The request body as JSON: 413 when it is over `limit` bytes (from Content-Length before
    reading, else while reading), 429 when `budget` cannot hold it, 400 when it is not JSON,
    499 when the client leaves. The budget is held only while the body is read and parsed."""
    declared = request.headers.get("content-length")
    announced = int(declared) if declared is not None and declared.isdigit() else None
    if announced is not None and announced > limit:
        raise too_large(f"the request body is over {limit} bytes (--max-body-bytes)")
    held = 0

    def hold(size: int) -> None:
        nonlocal held
        if budget is not None and size > held:
            budget.reserve(size - held)
            held = size

    try:
        hold(announced or 0)
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large(f"the request body is over {limit} bytes (--max-body-bytes)")
                hold(size)  # a chunked body (or one longer than announced) reserves as it comes
                chunks.append(chunk)
        except ClientDisconnect:
            raise APIError(499, "the client closed the connection", code="client_closed") from None
        return parse_json(b"".join(chunks))
    finally:
        if budget is not None and held:
            budget.release(held)


def parse_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)  # ~8x faster than json on a 4 MB data-URI body
    except orjson.JSONDecodeError:
        pass  # the stdlib decides (and words the error) for what orjson refuses, e.g.
        # integers over 64 bits, lone surrogates, NaN, very deep nesting
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise invalid("the request body is nested too deeply") from None


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """Await `work`; return None early (cancelling it) if the client goes away first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    return None


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def with_errors(render: Renderer) -> Callable[[Handler], Handler]:
    """Route decorator: an `APIError` (or any other exception, as a 500) raised by the handler
    becomes `render(error)`, so each API answers in its own error shape. 5xx are logged."""

    def wrap(handler: Handler) -> Handler:
        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except APIError as error:
                response = render(error)
                log_refusal(request, error, response.status_code)
                return response
            except Exception as exc:
                log.exception("unhandled error", exc_info=exc)
                return render(internal_error(exc))

        route.__name__ = getattr(handler, "__name__", "route")
        route.__doc__ = handler.__doc__
        return route

    return wrap


def log_refusal(request: Request, error: APIError, status: int | None = None) -> None:
    """One log line per request answered with an error, saying why by its code and the field
    at fault: 4xx (the client's mistakes and refusals: a full queue, a missing key) at info,
    5xx at error with the message; 499 (the client left) at debug. A 4xx's message is not
    logged: it may quote the request (an image URL's query string, a prompt's text), which
    the log never holds (docs/security.md). `status`: what the response carries, when its
    API renders the error with another one (Anthropic's 529 for a full queue)."""
    status = status or error.status
    path = printable(request.url.path, 80)  # client text: one line, bounded
    what = f"{request.method} {path} -> {status} {error.code or error.type}"
    if error.param:
        what += f" ({printable(error.param, 80)})"
    if status == 499:
        log.debug("%s: the client closed the connection", what)
    elif status >= 500 and status != 529:  # 529: Anthropic's overloaded, a refusal
        log.error("%s: %s", what, error.message)
    else:
        log.info("%s", what)


def internal_error(exc: BaseException) -> APIError:
    return APIError(500, f"internal server error: {type(exc).__name__}", "server_error")


def json_response(body: Any, status: int, headers: dict[str, str] | None) -> Response:
    # ensure_ascii: messages may quote user input, including lone surrogates that UTF-8
    # cannot encode; escaped JSON is still exactly what the client sent.
    text = json.dumps(body, ensure_ascii=True)
    return Response(text, status, headers, media_type="application/json")
