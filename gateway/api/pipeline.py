"""The one request path every chat API shares: body -> neutral request -> media -> prompt ->
engine submit -> admission.

`ChatPipeline.admit` does everything up to the engine's admission event and hands back an
`Admission` (the event, the stream of the request's later events, and where the time went);
the wire format then renders the stream as JSON or SSE. Nothing here knows a wire format: the
caller passes its parser, and failures are `APIError`s the caller renders.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from starlette.requests import Request

from gateway.api.body_budget import BodyBudget
from gateway.api.http import authorize, read_json, unless_disconnected
from gateway.config import MIB, ServerConfig
from gateway.engine.client import EngineBusy, EngineUnavailable
from gateway.engine.core import Engine
from gateway.engine.remote.client import RemoteEngine
from gateway.engine.request import AdmittedEvent, ErrorEvent, ErrorKind
from gateway.errors import APIError, invalid
from gateway.frontend.affinity import affinity_key
from gateway.frontend.chat import ChatRequest, ImagePart, VideoPart
from gateway.frontend.prompt import Media, PromptBuilder, UnsupportedImage
from gateway.frontend.streams import EventStream, LoopDelivery
from gateway.media import DecodedImage, MediaLoader
from gateway.metrics import EdgeMetrics

# Images of a parsed request, in `ChatRequest.images` order. The default loads every image
# part through the media loader; the Responses API passes its own, which takes the images of
# a stored conversation from its store (no fetch, no decode, no hash) and loads only new ones.
ImageResolver = Callable[[ChatRequest], Awaitable[list[DecodedImage]]]

_A = TypeVar("_A")
_B = TypeVar("_B")


class ClientGone(Exception):
    """The client disconnected before admission; the request was cancelled (answer 499)."""


class Overloaded(APIError):
    """The engine's waiting queue is full. OpenAI answers 429, Anthropic 529."""


@dataclass(frozen=True)
class Timings:
    """perf_counter() marks of one request's way to admission (seconds)."""

    arrival: float
    read: float
    media: float
    prompt: float
    admit: float

    def server_timing(self) -> str:
        """A standard Server-Timing header value (ms per phase)."""
        marks = (self.arrival, self.read, self.media, self.prompt, self.admit)
        names = ("read", "media", "prompt", "admit")
        return ", ".join(
            f"{name};dur={1000 * (b - a):.1f}"
            for name, a, b in zip(names, marks[:-1], marks[1:], strict=True)
        )


@dataclass(frozen=True)
class Admission:
    """An admitted request: its later events arrive on `stream` (tokens, then one finish or
    error event). The caller owns cancelling it (`ChatPipeline.cancel`) if it stops reading."""

    request_id: str
    chat: ChatRequest
    event: AdmittedEvent
    stream: EventStream
    timings: Timings

    def headers(self) -> dict[str, str]:
        """x-request-id, x-cache (hits and cached tokens) and Server-Timing."""
        e = self.event
        return {
            "x-request-id": self.request_id,
            "x-cache": (
                f"vision-hits={e.vision_hits}; vision-misses={e.vision_misses}; "
                f"cached-tokens={e.cached_tokens}; prompt-tokens={e.prompt_tokens}; "
                f"vision-disk-hits={e.vision_disk_hits}; "
                f"disk-cached-tokens={e.disk_cached_tokens}"
            ),
            "server-timing": self.timings.server_timing(),
        }


class ChatPipeline:
    """The shared request path over one engine. Lives on the event loop thread.

    `open` (from the lifespan, once the model is loaded) makes it ready; `close` makes every
    later request a 503 while running ones finish.
    """

    def __init__(
        self,
        server: ServerConfig,
        served_model_name: str,
        engine: Engine | RemoteEngine,
        media: MediaLoader,
        metrics: EdgeMetrics,
    ) -> None:
        self._server = server
        self.served_model_name = served_model_name
        self.engine = engine
        self.media = media
        self._metrics = metrics
        self.prompts: PromptBuilder | None = None
        self._delivery: LoopDelivery | None = None
        self.draining = False
        # Admitted requests whose events may still be read, for `interrupt_all` at shutdown.
        self._live: weakref.WeakValueDictionary[str, EventStream] = weakref.WeakValueDictionary()
        self._bodies = BodyBudget(int(server.max_inflight_body_mb * MIB), metrics)

    def open(self, prompts: PromptBuilder, delivery: LoopDelivery) -> None:
        self.prompts = prompts
        self._delivery = delivery

    def close(self) -> None:
        self.draining = True

    @property
    def ready(self) -> bool:
        return self.prompts is not None and not self.draining

    def cancel(self, request_id: str) -> None:
        self.engine.cancel(request_id)

    def interrupt_all(self, message: str) -> int:
        """End every admitted request's event stream with a shutting-down error (each API
        renders it: an SSE error event, or a 503) and cancel it in the engine; returns how
        many streams were still open. Event loop only."""
        live = list(self._live.items())
        self._live.clear()
        for request_id, stream in live:
            stream.interrupt(ErrorEvent(ErrorKind.SHUTTING_DOWN, message))
            with contextlib.suppress(EngineUnavailable):
                self.engine.cancel(request_id)
        return len(live)

    async def load_images(self, parts: Sequence[ImagePart]) -> list[DecodedImage]:
        """Fetch, decode and hash `parts` under the media limits (APIError on failure)."""
        images = await self.media.load_all([(p.url, p.param) for p in parts])
        for image in images:
            self._metrics.image_decode_seconds.observe(image.decode_seconds)
            self._metrics.image_hash_seconds.observe(image.hash_seconds)
        return images

    async def _prepare(
        self,
        request: Request,
        parse: Callable[[Any], ChatRequest],
        resolve: ImageResolver | None = None,
    ) -> tuple[PromptBuilder, LoopDelivery, ChatRequest, list[Media], float]:
        """Authorize, read and parse the body, check the model, load the media."""
        authorize(request, self._server.api_key)
        prompts, delivery = self.prompts, self._delivery
        if self.draining or prompts is None or delivery is None:
            raise APIError(503, "the server is shutting down", "server_error", code="unavailable")
        body = await read_json(request, self._server.max_body_bytes, self._bodies)
        t_read = time.perf_counter()
        chat = parse(body)
        if chat.model != self.served_model_name:
            raise model_not_found(chat.model, self.served_model_name)
        self.media.check_media_count(len(chat.images), len(chat.videos))
        images, videos = await _both(
            resolve(chat) if resolve else self.load_images(chat.images),
            self.media.load_videos([(p.url, p.param) for p in chat.videos]),
        )
        # Back into prompt order: the placeholders of images and videos interleave.
        image_iter, video_iter = iter(images), iter(videos)
        media: list[Media] = [
            next(video_iter) if isinstance(p, VideoPart) else next(image_iter) for p in chat.media
        ]
        return prompts, delivery, chat, media, t_read

    async def count_tokens(self, request: Request, parse: Callable[[Any], ChatRequest]) -> int:
        """The prompt length (tokens, images included) the request would have; nothing runs
        on the engine. Same errors as `admit` up to the prompt."""
        prompts, _, chat, images, _ = await self._prepare(request, parse)
        try:
            return await asyncio.to_thread(prompts.count, chat, images)
        except ValueError as exc:
            raise prompt_error(exc, chat) from None

    async def admit(
        self,
        request: Request,
        parse: Callable[[Any], ChatRequest],
        id_prefix: str,
        resolve: ImageResolver | None = None,
    ) -> Admission:
        """Authorize, read and parse the body, load media, build the prompt, submit, and wait
        for admission. Raises APIError (4xx for the client's mistakes; `Overloaded` when the
        engine queue is full; 503 while shutting down) or ClientGone. `resolve` supplies the
        images (default: `load_images` of every image part)."""
        arrival = time.perf_counter()
        prompts, delivery, chat, images, t_read = await self._prepare(request, parse, resolve)
        request_id = f"{id_prefix}{uuid.uuid4().hex}"
        t_media = time.perf_counter()
        try:
            prepared = await asyncio.to_thread(prompts.build, chat, images, request_id, arrival)
        except ValueError as exc:
            raise prompt_error(exc, chat) from None
        prepared = replace(prepared, affinity_key=affinity_key(chat, prepared))
        t_prompt = time.perf_counter()
        stream = EventStream(delivery)
        try:
            self.engine.submit(prepared, stream.sink)
        except EngineBusy as busy:
            raise engine_busy(busy) from None
        except EngineUnavailable:
            raise APIError(503, "the engine is not running", code="unavailable") from None
        first = await unless_disconnected(request, stream.get())
        if first is None:
            self.engine.cancel(request_id)
            raise ClientGone(request_id)
        if isinstance(first, ErrorEvent):
            raise engine_error(first)
        assert isinstance(first, AdmittedEvent)
        timings = Timings(arrival, t_read, t_media, t_prompt, time.perf_counter())
        self._live[request_id] = stream
        return Admission(request_id, chat, first, stream, timings)


async def _both(first: Awaitable[_A], second: Awaitable[_B]) -> tuple[_A, _B]:
    """Await two loads concurrently; the first failure cancels the other and is raised (the
    image loads' error first when both have failed)."""
    tasks = [asyncio.ensure_future(first), asyncio.ensure_future(second)]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    for task in tasks:
        if task in done and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    return tasks[0].result(), tasks[1].result()


def prompt_error(exc: ValueError, chat: ChatRequest) -> APIError:
    """400 for a prompt that cannot be built: an image the processor refuses (named by its
    field), else e.g. an image placeholder typed into the text."""
    if isinstance(exc, UnsupportedImage):
        return invalid(str(exc), chat.media[exc.index].param, "unsupported_image")
    return invalid(f"could not build the prompt: {exc}", "messages")


def engine_busy(busy: EngineBusy) -> Overloaded:
    """The error for a full engine queue (429 + Retry-After in OpenAI's terms)."""
    return Overloaded(
        429,
        f"{busy}; retry shortly",
        "rate_limit_error",
        code="server_busy",
        headers={"Retry-After": "1"},
    )


def engine_error(event: ErrorEvent) -> APIError:
    """The error for an engine failure: 503 while shutting down, else 500."""
    if event.kind is ErrorKind.SHUTTING_DOWN:
        return APIError(503, event.message, "server_error", code="unavailable")
    return APIError(500, event.message, "server_error")


def model_not_found(name: str, served: str) -> APIError:
    return APIError(
        404,
        f"The model `{name}` does not exist on this server; it serves `{served}` (see /v1/models)",
        "invalid_request_error",
        "model",
        "model_not_found",
    )
