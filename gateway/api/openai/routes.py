"""The OpenAI Chat Completions route: `POST /v1/chat/completions`, parsed by
`gateway.api.openai.parse`, run through the intake and the front end's pipeline, answered by
`gateway.api.openai.render` (JSON or SSE chunks; errors as OpenAI error objects); and beside
it the legacy `POST /v1/completions` (`gateway.api.openai.completions`).
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.api.http import unless_disconnected, with_errors
from gateway.api.intake import Intake
from gateway.api.openai import completions
from gateway.api.openai.parse import parse_chat_request
from gateway.api.openai.render import collect, render_error, sse_stream
from gateway.frontend.errors import ClientGone


def routes(intake: Intake) -> list[Route]:
    """The OpenAI chat and completions routes over `intake`; their errors are OpenAI error
    objects."""
    pipeline = intake.pipeline

    @with_errors(render_error)
    async def chat_completions(request: Request) -> Response:
        try:
            admission = await intake.admit(request, parse_chat_request, "chatcmpl-")
        except ClientGone:
            return Response(status_code=499)
        chat, request_id = admission.chat, admission.request_id
        created = int(time.time())
        headers = admission.headers()
        if chat.stream:
            body = sse_stream(
                admission.stream,
                request_id,
                created,
                chat.model,
                chat.include_usage,
                lambda: pipeline.cancel(request_id),
                admission.tool_format,
                chat.n,
            )
            return StreamingResponse(body, media_type="text/event-stream", headers=headers)
        result = await unless_disconnected(
            request,
            collect(
                admission.stream,
                request_id,
                created,
                chat.model,
                chat.logprobs,
                admission.tool_format,
                chat.n,
            ),
        )
        if result is None:
            pipeline.cancel(request_id)
            return Response(status_code=499)
        return JSONResponse(result, headers=headers)

    return [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        *completions.routes(intake),
    ]
