"""The OpenAI Responses API: `POST /v1/responses` (plain and streamed), and
`GET`/`DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel` and
`GET /v1/responses/{id}/input_items` over the stored conversations.

A turn runs through the intake and the front end's pipeline like a chat completion
(gateway.api.responses.turn builds its conversation); the engine's prefix cache then finds the
KV of the conversation so far, and the stored decoded images spare the turn any image read,
decode or hash. A client that stores nothing here (`store: false`) keeps the thinking in
the reasoning items' `encrypted_content`, sealed by the key in the disk cache's folder
(gateway.api.responses.sealed). Errors are OpenAI error objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.api.http import unless_disconnected, with_errors
from gateway.api.intake import Intake
from gateway.api.openai.render import render_error
from gateway.api.responses.item_page import item_page, parse_item_query
from gateway.api.responses.render import (
    STATUS_BY_FINISH,
    EventWriter,
    MadeCall,
    ResponseMeta,
    error_event,
    response_body,
)
from gateway.api.responses.sealed import ReasoningSeal
from gateway.api.responses.store import ResponseStore, StoredResponse
from gateway.api.responses.tool_events import ToolEvents
from gateway.api.responses.turn import Turn, not_found
from gateway.config import CacheConfig, ServerConfig
from gateway.engine.request import ErrorEvent, Event, FinishEvent, TokenEvent, TokenLogprob, Usage
from gateway.errors import APIError
from gateway.frontend.admission import Admission
from gateway.frontend.errors import ClientGone, engine_error
from gateway.tools.calls import CallEnd, CallSplitter, Piece, TextPiece

CANCEL_WAIT_S = 30.0


@dataclass
class Outcome:
    """A response's engine events folded up: text, logprobs, then a finish or an error.
    With a `splitter` (tools on) the text is also split into text and calls as it comes:
    `split` holds the pieces of the last event."""

    pieces: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    usage: Usage | None = None
    status: str | None = None  # set when done
    error: APIError | None = None
    splitter: CallSplitter | None = None
    split: list[Piece] = field(default_factory=list)
    complete: dict[int, bool] = field(default_factory=dict)  # by call index
    thinks: bool = False  # the model may think: its thinking is a `reasoning` item
    thoughts: list[str] = field(default_factory=list)
    thought: str = ""  # the thinking of the last event

    def _split(self, text: str, end: bool, cut: bool = False) -> None:
        if self.splitter is None:
            return
        self.split = self.splitter.feed(text) + (self.splitter.finish(cut) if end else [])
        self.complete.update((p.index, p.complete) for p in self.split if isinstance(p, CallEnd))

    @property
    def answer(self) -> str:
        """The answer's text: without the calls when it was split."""
        return self.text if self.splitter is None else self.splitter.text

    @property
    def calls(self) -> list[MadeCall]:
        if self.splitter is None:
            return []
        return [MadeCall(c, self.complete.get(i, False)) for i, c in enumerate(self.splitter.calls)]

    @property
    def done(self) -> bool:
        return self.status is not None

    def add(self, event: Event) -> tuple[str, tuple[TokenLogprob, ...]]:
        """Fold `event` in; returns the text and logprobs it adds (a stream's delta)."""
        self.split = []
        self.thought = event.reasoning if isinstance(event, (TokenEvent, FinishEvent)) else ""
        self.thoughts.append(self.thought)
        if isinstance(event, TokenEvent):
            self.pieces.append(event.text)
            if not event.reasoning:  # the message's logprobs: its own tokens' (and markers')
                self.logprobs.extend(event.logprobs)
            self._split(event.text, end=False)
            return event.text, event.logprobs
        if isinstance(event, FinishEvent):
            self.pieces.append(event.text)
            self.usage, self.status = event.usage, STATUS_BY_FINISH[event.finish_reason]
            self._split(event.text, end=True, cut=event.finish_reason == "length")
            return event.text, ()
        if isinstance(event, ErrorEvent):
            self.error, self.status = engine_error(event), "failed"
        return "", ()

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def reasoning(self) -> str | None:
        """The thinking so far ("" none yet; None: the model does not think)."""
        return "".join(self.thoughts) if self.thinks else None


@dataclass
class Running:
    """A response being generated: its owner, its input items (as listed), and its final
    body once done."""

    owner: str
    meta: ResponseMeta
    items: tuple[dict[str, Any], ...] = ()
    done: asyncio.Event = field(default_factory=asyncio.Event)
    body: dict[str, Any] | None = None


class ResponsesAPI:
    """The routes over one intake (and its pipeline) and one store. Event loop only."""

    def __init__(
        self, intake: Intake, server: ServerConfig, cache: CacheConfig | None = None
    ) -> None:
        self.intake = intake
        self.pipeline = intake.pipeline
        self.keys = intake.keys
        self.store = ResponseStore(server.responses)
        self.running: dict[str, Running] = {}
        folder = cache.cache_dir if cache is not None else None
        group = cache.cache_dir_group if cache is not None else False
        self.seal = ReasoningSeal.for_folder(folder, group)

    def routes(self) -> list[Route]:
        one = "/v1/responses/{response_id}"
        return [
            Route("/v1/responses", with_errors(render_error)(self.create), methods=["POST"]),
            Route(one, with_errors(render_error)(self.retrieve), methods=["GET"]),
            Route(one, with_errors(render_error)(self.delete), methods=["DELETE"]),
            Route(f"{one}/cancel", with_errors(render_error)(self.cancel), methods=["POST"]),
            Route(
                f"{one}/input_items", with_errors(render_error)(self.input_items), methods=["GET"]
            ),
        ]

    async def create(self, request: Request) -> Response:
        owner = self.keys.authorize(request, "chat").owner
        turn = Turn(self.pipeline, self.store, self.running, owner, self.seal)
        try:
            admission = await self.intake.admit(request, turn.parse, "resp_", turn.resolve)
        except ClientGone:
            return Response(status_code=499)
        except APIError as exc:
            # The prompt builder names the conversation `messages` (an over-long prompt, a
            # template's refusal); here it is `input` (with any stored turns before it).
            if exc.param == "messages":
                raise replace(exc, param="input") from None
            raise
        assert turn.request is not None
        meta = ResponseMeta(
            admission.request_id,
            f"msg_{uuid.uuid4().hex}",
            int(time.time()),
            turn.request,
            self.seal,
        )
        run = self.running[meta.response_id] = Running(turn.owner, meta, turn.items)
        headers = admission.headers()
        if turn.request.stream:
            body = self._stream(admission, turn, run)
            return StreamingResponse(body, media_type="text/event-stream", headers=headers)
        outcome = _outcome(admission)
        finished = await unless_disconnected(request, self._drain(admission, outcome))
        if finished is None:
            self.pipeline.cancel(meta.response_id)
            self._finish(turn, run, outcome)
            return Response(status_code=499)
        if outcome.error is not None:
            self._finish(turn, run, outcome)
            raise outcome.error
        return JSONResponse(self._finish(turn, run, outcome), headers=headers)

    @staticmethod
    async def _drain(admission: Admission, outcome: Outcome) -> bool:
        while not outcome.done:
            outcome.add(await admission.stream.get())
        return True

    async def _stream(self, admission: Admission, turn: Turn, run: Running) -> AsyncIterator[str]:
        writer = EventWriter(run.meta)
        outcome = _outcome(admission)
        # Tools or thinking: items open as the answer's parts come (gateway.api.responses.
        # tool_events), the thinking's `reasoning` item first.
        lazy = outcome.splitter is not None or outcome.thinks
        tools = ToolEvents(writer, blank_opens=outcome.splitter is None) if lazy else None
        want_logprobs = run.meta.request.logprobs
        try:
            yield writer.opening() if tools is None else tools.opening()
            while not outcome.done:
                out: list[str] = []
                for event in await admission.stream.get_ready():
                    text, logprobs = outcome.add(event)
                    logprobs = logprobs if want_logprobs else ()
                    if tools is not None and outcome.thought:
                        out.append(tools.think(outcome.thought))
                    if tools is not None:
                        plain = [TextPiece(text)] if text else []
                        split = outcome.split if outcome.splitter else plain
                        out.append(tools.pieces(split, logprobs))
                    elif text or logprobs:
                        out.append(writer.delta(text, logprobs))
                    if outcome.done:
                        break
                if outcome.error is not None:
                    self._finish(turn, run, outcome)
                    out.append(error_event(outcome.error, writer.sequence))
                elif outcome.done:
                    final = self._finish(turn, run, outcome)
                    out.append(writer.closing(final) if tools is None else tools.closing(final))
                if out:
                    yield "".join(out)
        finally:
            if not outcome.done:  # the client went away: free the row, keep what was said
                self.pipeline.cancel(run.meta.response_id)
                self._finish(turn, run, outcome)

    def _finish(self, turn: Turn, run: Running, outcome: Outcome) -> dict[str, Any]:
        """The final body; stored (with the conversation) when the request asked for it."""
        request = run.meta.request
        status = outcome.status or "cancelled"
        # With tools the message's logprobs are left out: they would include the calls'.
        want = request.logprobs and outcome.splitter is None
        logprobs = outcome.logprobs if want else None
        answer, calls = outcome.answer, outcome.calls
        body = response_body(
            run.meta,
            status,
            answer,
            logprobs,
            outcome.usage,
            outcome.error,
            calls,
            outcome.reasoning,
        )
        if request.store:
            made = tuple(c.call for c in calls)
            said = turn.conversation(answer, made, outcome.reasoning or "")
            entry = StoredResponse(run.meta.response_id, run.owner, body, said, turn.items)
            self.store.put(entry, turn.image_map())
        run.body = body
        self.running.pop(run.meta.response_id, None)
        run.done.set()
        return body

    def _owner(self, request: Request) -> str:
        return self.keys.authorize(request, "chat").owner

    async def retrieve(self, request: Request) -> Response:
        owner, response_id = self._owner(request), request.path_params["response_id"]
        run = self.running.get(response_id)
        if run is not None and run.owner == owner:
            return JSONResponse(response_body(run.meta, "in_progress"))
        stored = self.store.get(response_id, owner)
        if stored is None:
            raise not_found(response_id)
        return JSONResponse(stored.body)

    async def input_items(self, request: Request) -> Response:
        """A page of the input items of a stored response (one still running too, when it
        will be stored): 404 as GET, then a 400 naming a bad query parameter."""
        owner, response_id = self._owner(request), request.path_params["response_id"]
        run = self.running.get(response_id)
        if run is not None and run.owner == owner and run.meta.request.store:
            items = run.items
        else:
            stored = self.store.get(response_id, owner)
            if stored is None:
                raise not_found(response_id)
            items = stored.items
        query = parse_item_query(request.query_params.multi_items())
        return JSONResponse(item_page(items, query))

    async def delete(self, request: Request) -> Response:
        owner, response_id = self._owner(request), request.path_params["response_id"]
        run = self.running.get(response_id)
        if run is not None and run.owner == owner:
            raise _conflict(f"response '{response_id}' is in progress; cancel it first")
        if not self.store.delete(response_id, owner):
            raise not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})

    async def cancel(self, request: Request) -> Response:
        """Stop a running response (its row is freed; what was generated is kept) and answer
        its final body, status `cancelled`; 409 for one that has already finished."""
        owner, response_id = self._owner(request), request.path_params["response_id"]
        run = self.running.get(response_id)
        if run is not None and run.owner == owner:
            self.pipeline.cancel(response_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.done.wait(), CANCEL_WAIT_S)
            return JSONResponse(run.body or response_body(run.meta, "cancelled"))
        stored = self.store.get(response_id, owner)
        if stored is None:
            raise not_found(response_id)
        raise _conflict(
            f"response '{response_id}' is already {stored.body['status']}; only a running "
            "response can be cancelled"
        )


def _outcome(admission: Admission) -> Outcome:
    """An empty outcome; it splits the answer when it is decoded under a tool grammar."""
    fmt = admission.tool_format
    return Outcome(splitter=None if fmt is None else CallSplitter(fmt), thinks=admission.thinks)


def _conflict(message: str) -> APIError:
    return APIError(409, message, "invalid_request_error", None, "response_state_conflict")


def routes(intake: Intake, server: ServerConfig, cache: CacheConfig | None = None) -> list[Route]:
    """The Responses API's routes over `intake`; stored state bounded by `server.responses`;
    the reasoning key kept in `cache.cache_dir` (None, or no folder: a key of this process)."""
    return ResponsesAPI(intake, server, cache).routes()
