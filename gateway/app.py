"""The Starlette application: routes, auth, body limits, error objects, streaming.

`create_app` wires one Engine, one MediaLoader and one PromptBuilder; the lifespan starts the
engine (loading the model on its own thread) and stops it after uvicorn has drained requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.config import EngineConfig, MediaConfig, ServerConfig
from gateway.engine.core import Engine
from gateway.engine.model import VisionLanguageModel
from gateway.engine.process import EngineUnavailable, RemoteEngine
from gateway.engine.request import AdmittedEvent, EngineBusy, ErrorEvent
from gateway.errors import APIError, invalid, too_large
from gateway.media import MediaLoader
from gateway.metrics import EdgeMetrics, Metrics
from gateway.openai_api import (
    model_not_found,
    parse_chat_request,
)
from gateway.prompt import PromptBuilder
from gateway.responses import (
    api_error,
    collect,
    engine_busy,
    engine_error,
    http_error,
    server_error,
    sse_stream,
)
from gateway.streams import EventStream, LoopDelivery
from gateway.warmup import Warmup
from gateway.web import web_routes

log = logging.getLogger(__name__)
T = TypeVar("T")


class Gateway:
    """Request handlers over one engine. Lives on the event loop thread."""

    def __init__(
        self,
        server: ServerConfig,
        engine_config: EngineConfig,
        media: MediaConfig,
        loader: Callable[[], VisionLanguageModel] | None = None,
        notice: str | None = None,
    ) -> None:
        self.server = server
        self.engine_config = engine_config
        self.metrics = EdgeMetrics()
        self.engine: Engine | RemoteEngine
        if loader is None and server.engine_process:
            self.engine = RemoteEngine(engine_config, server.log_level)
        else:  # one process (tests inject model loaders; debugging)
            self.engine = Engine(engine_config, Metrics(), loader)
        self.media = MediaLoader(media)
        self.prompts: PromptBuilder | None = None
        self.notice = notice
        self.draining = False
        self.created = int(time.time())

    # ----- lifecycle --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # The engine thread releases the GIL while MLX computes and must get it back at once
        # when a step is done; with CPython's default 5 ms switch interval a busy event loop
        # (SSE chunks of many streams) could hold it for half a decode step.
        sys.setswitchinterval(0.0005)
        self.delivery = LoopDelivery(asyncio.get_running_loop())
        await asyncio.to_thread(self.engine.start)
        try:
            assert self.engine.model is not None
            prompts = PromptBuilder(
                self.engine.model,
                self.engine.needs_pixels,
                self.engine_config.max_context_tokens,
                self.engine_config.default_max_tokens,
            )
            if self.engine_config.warmup:
                sizes = self.engine_config.warmup_image_sizes
                log.info("warming up (text, image sizes %s); --no-warmup skips this", sizes)
                seconds = await asyncio.to_thread(Warmup(self.engine, prompts).run, sizes)
                log.info("warm-up done in %.1f s", seconds)
            self.prompts = prompts  # from here on /health says ready
            if self.engine_config.warmup:
                await self._warm_http(app)
            log.info(
                "serving %s as %r", self.engine_config.model, self.engine_config.served_model_name
            )
            yield
        finally:  # also when start-up fails after the engine started: never leave it running
            self.draining = True
            await asyncio.to_thread(self.engine.stop)
            await self.media.aclose()

    async def _warm_http(self, app: Starlette) -> None:
        """One streamed and one plain chat request through the app itself (in-process, before
        the port opens): the first request through Starlette, the SSE writer and the JSON
        paths cost tens of ms once, which would otherwise land on a user's first request."""
        headers = {"authorization": f"Bearer {self.server.api_key}"} if self.server.api_key else {}
        body = {
            "model": self.engine_config.served_model_name,
            "messages": [{"role": "user", "content": "warm-up"}],
            "max_tokens": 2,
            "temperature": 0,
        }
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://warm-up") as client:
            for stream in (True, False):
                response = await client.post(
                    "/v1/chat/completions", json={**body, "stream": stream}, headers=headers
                )
                if response.status_code != 200:
                    log.warning("HTTP warm-up got %d: %s", response.status_code, response.text)
        self.engine.reset_caches()

    # ----- helpers ----------------------------------------------------------------------------

    @staticmethod
    async def _engine_call(method: Callable[[], T]) -> T:
        """A call into the engine (a pipe round trip when it runs in its own process), off the
        event loop so streams keep flowing; 503 if the engine is gone."""
        try:
            return await asyncio.to_thread(method)
        except EngineUnavailable:
            raise APIError(503, "the engine is not running", code="unavailable") from None

    def _authorize(self, request: Request, key: str | None) -> None:
        if key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        given = token.strip().encode("latin-1", errors="replace")  # headers are latin-1
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, key.encode("utf-8")):
            raise APIError(
                401,
                "missing or wrong API key: send `Authorization: Bearer <key>`",
                "authentication_error",
                code="invalid_api_key",
            )

    async def _read_json(self, request: Request) -> Any:
        limit = self.server.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_large(f"the request body is over {limit} bytes (--max-body-bytes)")
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large(f"the request body is over {limit} bytes (--max-body-bytes)")
                chunks.append(chunk)
        except ClientDisconnect:
            raise APIError(499, "the client closed the connection", code="client_closed") from None
        raw = b"".join(chunks)
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

    @staticmethod
    async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
        """Await `work`; return None early if the client goes away first."""
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

    # ----- routes -----------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        arrival = time.perf_counter()
        self._authorize(request, self.server.api_key)
        if self.draining or self.prompts is None:
            raise APIError(503, "the server is shutting down", "server_error", code="unavailable")
        body = await self._read_json(request)
        t_read = time.perf_counter()
        chat = parse_chat_request(body)
        served = self.engine_config.served_model_name
        if chat.model != served:
            raise model_not_found(chat.model, served)
        images = await self.media.load_all([(p.url, p.param) for p in chat.images])
        for image in images:
            self.metrics.image_decode_seconds.observe(image.decode_seconds)
            self.metrics.image_hash_seconds.observe(image.hash_seconds)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        t_media = time.perf_counter()
        try:
            prepared = await asyncio.to_thread(
                self.prompts.build, chat, images, request_id, arrival
            )
        except ValueError as exc:  # e.g. an image placeholder typed into the text
            raise invalid(f"could not build the prompt: {exc}", "messages") from None
        t_prompt = time.perf_counter()
        stream = EventStream(self.delivery)
        try:
            self.engine.submit(prepared, stream.sink)
        except EngineBusy as busy:
            raise engine_busy(busy) from None
        except EngineUnavailable:
            raise APIError(503, "the engine is not running", code="unavailable") from None
        first = await self._unless_disconnected(request, stream.get())
        if first is None:
            self.engine.cancel(request_id)
            return Response(status_code=499)
        if isinstance(first, ErrorEvent):
            raise engine_error(first)
        assert isinstance(first, AdmittedEvent)
        t_admit = time.perf_counter()
        headers = {
            "x-request-id": request_id,
            "x-cache": (
                f"vision-hits={first.vision_hits}; vision-misses={first.vision_misses}; "
                f"cached-tokens={first.cached_tokens}; prompt-tokens={first.prompt_tokens}"
            ),
            # Standard Server-Timing: where this request's time went before its first token.
            "server-timing": ", ".join(
                f"{name};dur={1000 * (b - a):.1f}"
                for name, a, b in (
                    ("read", arrival, t_read),
                    ("media", t_read, t_media),
                    ("prompt", t_media, t_prompt),
                    ("admit", t_prompt, t_admit),
                )
            ),
        }
        created = int(time.time())
        if chat.stream:
            body = sse_stream(
                stream,
                request_id,
                created,
                chat.model,
                chat.include_usage,
                lambda: self.engine.cancel(request_id),
            )
            return StreamingResponse(body, media_type="text/event-stream", headers=headers)
        result = await self._unless_disconnected(
            request, collect(stream, request_id, created, chat.model, chat.logprobs)
        )
        if result is None:
            self.engine.cancel(request_id)
            return Response(status_code=499)
        return JSONResponse(result, headers=headers)

    async def models(self, request: Request) -> Response:
        self._authorize(request, self.server.api_key)
        card: dict[str, Any] = {
            "id": self.engine_config.served_model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "vision-gateway",
            "root": self.engine_config.model,
        }
        if self.notice:
            card["notice"] = self.notice
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, _: Request) -> Response:
        ready = self.prompts is not None and not self.draining and self.engine.alive
        body = {
            "status": "ok" if ready else "unavailable",
            "model": self.engine_config.served_model_name,
            "running": self.engine.running,
            "waiting": self.engine.waiting,
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics_endpoint(self, request: Request) -> Response:
        self._authorize(request, self.server.metrics_api_key or self.server.api_key)
        text = self.metrics.render() + await self._engine_call(self.engine.metrics_text)
        return Response(text, media_type="text/plain; version=0.0.4")

    async def cache_stats(self, request: Request) -> Response:
        self._authorize(request, self.server.api_key)
        return JSONResponse(await self._engine_call(self.engine.cache_stats))

    async def cache_clear(self, request: Request) -> Response:
        self._authorize(request, self.server.api_key)
        await self._engine_call(self.engine.clear_caches)
        return JSONResponse({"cleared": True, **await self._engine_call(self.engine.cache_stats)})


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(
    server: ServerConfig,
    engine: EngineConfig,
    media: MediaConfig,
    loader: Callable[[], VisionLanguageModel] | None = None,
    notice: str | None = None,
) -> Starlette:
    gateway = Gateway(server, engine, media, loader, notice)
    routes = [
        Route("/v1/chat/completions", gateway.chat_completions, methods=["POST"]),
        Route("/v1/models", gateway.models, methods=["GET"]),
        Route("/health", gateway.health, methods=["GET"]),
        Route("/metrics", gateway.metrics_endpoint, methods=["GET"]),
        Route("/v1/cache/stats", gateway.cache_stats, methods=["GET"]),
        Route("/v1/cache/clear", gateway.cache_clear, methods=["POST"]),
        *web_routes(gateway),  # the playground, the dashboard and their JSON endpoints
    ]
    app = Starlette(
        routes=routes,
        lifespan=gateway.lifespan,
        exception_handlers={
            APIError: api_error,
            HTTPException: http_error,
            Exception: server_error,
        },
    )
    app.state.gateway = gateway
    return app
