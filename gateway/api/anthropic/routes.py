"""The Anthropic Messages routes: `POST /v1/messages` and `POST /v1/messages/count_tokens`,
parsed by `gateway.api.anthropic.parse`, run through the intake and the front end's pipeline,
answered by `gateway.api.anthropic.render` (JSON or the Messages event stream; errors as
Anthropic error objects).
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.api.anthropic.parse import MessagesRequest, parse_messages
from gateway.api.anthropic.render import collect, render_error, sse_stream
from gateway.api.anthropic.system import renders_late_system
from gateway.api.http import unless_disconnected, with_errors
from gateway.api.intake import Intake
from gateway.frontend.chat import ChatRequest
from gateway.frontend.errors import ClientGone
from gateway.frontend.pipeline import ChatPipeline
from gateway.frontend.prompt import PromptBuilder


class _Fold:
    """Whether system turns after the start are folded into user messages, for the model a
    request names: asked of that model's chat template once per load (a probe render). The
    intake has loaded the named model before the parser runs (`ChatPipeline.preload`)."""

    def __init__(self, pipeline: ChatPipeline) -> None:
        self._pipeline = pipeline
        self._fold: weakref.WeakKeyDictionary[PromptBuilder, bool] = weakref.WeakKeyDictionary()

    def __call__(self, model: object) -> bool:
        prompts = self._pipeline.prompts_for(model) if isinstance(model, str) else None
        if prompts is None:  # an unknown model: the request gets its 404 from the pipeline
            return False
        if prompts not in self._fold:
            self._fold[prompts] = not renders_late_system(prompts.model.render)
        return self._fold[prompts]


class _Parsed:
    """The intake's parser for one request, keeping what the response needs beyond the
    chat request (`MessagesRequest`)."""

    def __init__(self, fold: _Fold, count_only: bool = False) -> None:
        self._fold, self._count_only = fold, count_only
        self.request: MessagesRequest | None = None

    def __call__(self, body: Any) -> ChatRequest:
        fold = self._fold(body.get("model") if isinstance(body, dict) else None)
        self.request = parse_messages(body, self._count_only, fold)
        return self.request.chat


def routes(intake: Intake) -> list[Route]:
    """The Anthropic routes over `intake`; their errors are Anthropic error objects."""
    pipeline = intake.pipeline
    fold = _Fold(pipeline)

    @with_errors(render_error)
    async def messages(request: Request) -> Response:
        parsed = _Parsed(fold)
        try:
            admission = await intake.admit(request, parsed, "msg_")
        except ClientGone:
            return Response(status_code=499)
        assert parsed.request is not None
        omit, context = parsed.request.omit_thinking, parsed.request.context_management
        request_id = admission.request_id
        headers = {**admission.headers(), "request-id": request_id}
        if admission.chat.stream:
            body = sse_stream(admission, lambda: pipeline.cancel(request_id), omit, context)
            return StreamingResponse(body, media_type="text/event-stream", headers=headers)
        result = await unless_disconnected(request, collect(admission, omit, context))
        if result is None:
            pipeline.cancel(request_id)
            return Response(status_code=499)
        return JSONResponse(result, headers=headers)

    @with_errors(render_error)
    async def count_tokens(request: Request) -> Response:
        start = time.perf_counter()
        parsed = _Parsed(fold, count_only=True)
        tokens = await intake.count_tokens(request, parsed)
        assert parsed.request is not None
        body: dict[str, Any] = {"input_tokens": tokens}
        if parsed.request.context_management is not None:  # as the API's beta reports it
            unedited = parsed.request.unedited
            original = tokens if unedited is None else await pipeline.count_tokens(unedited)
            body["context_management"] = {"original_input_tokens": original}
        headers = {"server-timing": f"count;dur={1000 * (time.perf_counter() - start):.1f}"}
        if parsed.request.chat.ignored_fields:
            headers["x-ignored-fields"] = ", ".join(parsed.request.chat.ignored_fields)
        return JSONResponse(body, headers=headers)

    return [
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    ]
