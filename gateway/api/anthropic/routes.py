"""The Anthropic Messages routes: `POST /v1/messages` and `POST /v1/messages/count_tokens`,
parsed by `gateway.api.anthropic.parse`, run through the intake and the front end's pipeline,
answered by `gateway.api.anthropic.render` (JSON or the Messages event stream; errors as
Anthropic error objects).
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.api.anthropic.parse import parse_messages_request
from gateway.api.anthropic.render import collect, render_error, sse_stream
from gateway.api.http import unless_disconnected, with_errors
from gateway.api.intake import Intake
from gateway.frontend.errors import ClientGone


def routes(intake: Intake) -> list[Route]:
    """The Anthropic routes over `intake`; their errors are Anthropic error objects."""
    pipeline = intake.pipeline

    @with_errors(render_error)
    async def messages(request: Request) -> Response:
        try:
            admission = await intake.admit(request, parse_messages_request, "msg_")
        except ClientGone:
            return Response(status_code=499)
        request_id = admission.request_id
        headers = {**admission.headers(), "request-id": request_id}
        if admission.chat.stream:
            body = sse_stream(admission, lambda: pipeline.cancel(request_id))
            return StreamingResponse(body, media_type="text/event-stream", headers=headers)
        result = await unless_disconnected(request, collect(admission))
        if result is None:
            pipeline.cancel(request_id)
            return Response(status_code=499)
        return JSONResponse(result, headers=headers)

    @with_errors(render_error)
    async def count_tokens(request: Request) -> Response:
        start = time.perf_counter()
        tokens = await intake.count_tokens(
            request, lambda body: parse_messages_request(body, count_only=True)
        )
        timing = f"count;dur={1000 * (time.perf_counter() - start):.1f}"
        return JSONResponse({"input_tokens": tokens}, headers={"server-timing": timing})

    return [
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    ]
