"""The HTTP side of a chat request, above the front end: the API key (and the cache scope
that its tenant and the request's `cache_salt` give), the drain check, the bounded JSON body
(within the body budget shared by all requests), the wire format's parser, and the
connection watched until admission; then the front end's `ChatPipeline` does the rest.

Each API's routes go through one `Intake`; failures are `APIError`s they render in their own
shape (gateway.api.http.with_errors), and `ClientGone` when the client left before admission.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from starlette.requests import Request

from gateway.api.body_budget import BodyBudget
from gateway.api.http import read_json, unless_disconnected
from gateway.api.keys import Keyring
from gateway.config import MIB, ServerConfig
from gateway.frontend.admission import Admission
from gateway.frontend.chat import ChatRequest
from gateway.frontend.pipeline import ChatPipeline, ImageResolver
from gateway.metrics import EdgeMetrics

# A wire format's parser: a decoded JSON body -> the neutral request (APIError 400 on a
# mistake). Pure, or (the Responses API's `Turn.parse`) reading its own turn's state.
Parser = Callable[[Any], ChatRequest]


class ManyPrompts(Protocol):
    """A parsed body of several prompts, each a `ChatRequest` (/v1/completions)."""

    @property
    def prompts(self) -> tuple[ChatRequest, ...]: ...


M = TypeVar("M", bound=ManyPrompts)


class Intake:
    """Reads chat requests off HTTP into one pipeline. Event loop only."""

    def __init__(
        self, server: ServerConfig, pipeline: ChatPipeline, metrics: EdgeMetrics, keys: Keyring
    ) -> None:
        self._server = server
        self.keys = keys
        self.pipeline = pipeline
        self._bodies = BodyBudget(int(server.max_inflight_body_mb * MIB), metrics)

    async def _read(self, request: Request, parse: Parser) -> tuple[ChatRequest, float]:
        """Authorize, refuse while draining, read and parse the body; returns the request (in
        the caller's cache scope: tenant and `cache_salt`) and the perf_counter() mark of the
        read's end."""
        body, scope, t_read = await self._body(request)
        chat = parse(body)
        return replace(chat, cache_scope=scope(chat.cache_salt)), t_read

    async def _body(self, request: Request) -> tuple[Any, Callable[[str], str], float]:
        """Authorize, refuse while draining, read the body and load the model it names; the
        body, the caller's scope function and the perf_counter() mark of the read's end."""
        caller = self.keys.authorize(request, "chat")
        self.pipeline.accept()
        body = await read_json(request, self._server.max_body_bytes, self._bodies)
        t_read = time.perf_counter()
        # The named model's prompt side reads the request (Anthropic: its late system
        # turns), so a model not loaded yet is loaded first.
        await self.pipeline.preload(body.get("model") if isinstance(body, dict) else None)
        return body, functools.partial(self.keys.scope, caller), t_read

    async def read_plain(self, request: Request) -> tuple[Any, Callable[[str], str]]:
        """A request that is not a chat (embeddings): authorize, refuse while draining, read
        the bounded JSON body. Returns the body and the caller's scope function (a
        `cache_salt` -> the cache scope tag)."""
        caller = self.keys.authorize(request, "chat")
        self.pipeline.accept()
        body = await read_json(request, self._server.max_body_bytes, self._bodies)
        return body, functools.partial(self.keys.scope, caller)

    async def admit(
        self,
        request: Request,
        parse: Parser,
        id_prefix: str,
        resolve: ImageResolver | None = None,
    ) -> Admission:
        """Read the request, then `ChatPipeline.admit` it, cancelling it if the client goes
        away before admission (`ClientGone`). Raises APIError as the two steps do."""
        arrival = time.perf_counter()
        chat, t_read = await self._read(request, parse)
        return await self.pipeline.admit(
            chat,
            id_prefix,
            arrival=arrival,
            read=t_read,
            resolve=resolve,
            watch=functools.partial(unless_disconnected, request),
        )

    async def admit_each(
        self, request: Request, parse: Callable[[Any], M], id_prefix: str
    ) -> tuple[M, list[Admission]]:
        """`admit` for a body of several prompts (`parse` gives them as `prompts`, each a
        request of its own to the engine), admitted concurrently; returns the parsed body
        and the admissions in prompt order. If one fails, the others are cancelled and the
        first failure in prompt order is raised."""
        arrival = time.perf_counter()
        body, scope, t_read = await self._body(request)
        parsed = parse(body)
        chats = [replace(c, cache_scope=scope(c.cache_salt)) for c in parsed.prompts]
        watch = functools.partial(unless_disconnected, request)
        tasks = [
            asyncio.ensure_future(
                self.pipeline.admit(c, id_prefix, arrival=arrival, read=t_read, watch=watch)
            )
            for c in chats
        ]
        try:
            await asyncio.wait(tasks)  # every admission settles before any is given up
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            raise
        failed = [t.exception() for t in tasks if t.exception() is not None]
        if failed:
            for task in tasks:
                if task.exception() is None:
                    self.pipeline.cancel(task.result().request_id)
            raise failed[0]  # type: ignore[misc]
        return parsed, [t.result() for t in tasks]

    async def count_tokens(self, request: Request, parse: Parser) -> int:
        """The prompt length (tokens) of the request; nothing runs on the engine."""
        chat, _ = await self._read(request, parse)
        return await self.pipeline.count_tokens(chat)
