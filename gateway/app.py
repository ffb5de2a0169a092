"""The Starlette application factory: the served models (a `ModelPool`: one engine each,
loaded on demand), one media loader, one chat pipeline (the front end, gateway.frontend), its
HTTP intake, and the routes mounted over them.

`create_app` builds a `Gateway` (the models' lifecycle and the server's own endpoints: models,
health, metrics, caches) and mounts the three APIs' chat routes from `gateway.api`. The
lifespan loads the default model (and the pinned ones) and unloads every model after uvicorn
has drained requests. Routes that are not chat (a playground, dashboards) are added here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.api import rerank as rerank_api
from gateway.api.anthropic import routes as anthropic_api
from gateway.api.anthropic.render import render_error as render_anthropic_error
from gateway.api.http import internal_error, log_refusal
from gateway.api.intake import Intake
from gateway.api.keys import Caller, Keyring
from gateway.api.openai import embeddings as embeddings_api
from gateway.api.openai import routes as openai_api
from gateway.api.openai.render import render_error
from gateway.api.response_count import ResponseCounter
from gateway.api.responses import routes as responses_api
from gateway.config import EngineConfig, MediaConfig, ServerConfig
from gateway.engine.client import EngineClient, EngineUnavailable
from gateway.engine.embed.request import EmbedCard
from gateway.engine.remote.client import RemoteEngine
from gateway.engine.remote.spare import SpareEngines
from gateway.errors import APIError
from gateway.frontend.context import context_window
from gateway.frontend.embed import EmbedPipeline
from gateway.frontend.errors import engine_unavailable, model_not_found
from gateway.frontend.pipeline import ChatPipeline
from gateway.frontend.prompt import PromptBuilder
from gateway.frontend.streams import LoopDelivery
from gateway.heap import freeze_startup_objects
from gateway.media import MediaLoader
from gateway.metrics import EdgeMetrics, Metrics
from gateway.metrics_merge import merge_metrics
from gateway.pool.build import capabilities, model_slots
from gateway.pool.pool import ModelPool
from gateway.pool.slot import EngineFactory, ModelSlot, SlotState
from gateway.pool_config import PoolConfig
from gateway.processors.checkpoint import serving_task
from gateway.warmup import Warmup
from gateway.web import web_routes

if TYPE_CHECKING:  # MLX: only the in-process engine loads it
    from gateway.engine.families.family import ModelFamily

log = logging.getLogger(__name__)
T = TypeVar("T")


class Gateway:
    """The models' lifecycle and the non-chat endpoints. Lives on the event loop thread."""

    def __init__(
        self,
        server: ServerConfig,
        engine_config: EngineConfig,
        media: MediaConfig,
        loader: Callable[[], ModelFamily] | None = None,
        notice: str | None = None,
        engine: EngineClient | None = None,
        pool: PoolConfig | None = None,
        make_engine: EngineFactory | None = None,
    ) -> None:
        self.server = server
        self.engine_config = engine_config
        self.metrics = EdgeMetrics()
        pool = pool or PoolConfig()
        # Several models in engine processes: loads on demand take a spare process whose
        # imports are done (gateway.engine.remote.spare).
        default_engines = make_engine is None and engine is None and loader is None
        several = len(pool.specs) > 1 and pool.spare_engine
        self.spares = (
            SpareEngines(server.log_level)
            if default_engines and several and server.engine_process
            else None
        )
        make_engine = make_engine or self._engine_factory(server, loader, engine, self.spares)
        self.pool = ModelPool(
            pool, model_slots(pool, engine_config, make_engine), self._prepare, self.metrics.pool
        )
        self.media = MediaLoader(media)
        self.pipeline = ChatPipeline(self.pool, self.media, self.metrics)
        self.embeddings = EmbedPipeline(self.pipeline)
        self.keys = Keyring(server)
        self.intake = Intake(server, self.pipeline, self.metrics, self.keys)
        self.notice = notice
        self.created = int(time.time())
        self.created_at = (
            datetime.fromtimestamp(self.created, UTC).isoformat().replace("+00:00", "Z")
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutdown_begun = False

    @staticmethod
    def _engine_factory(
        server: ServerConfig,
        loader: Callable[[], ModelFamily] | None,
        engine: EngineClient | None,
        spares: SpareEngines | None,
    ) -> EngineFactory:
        """How each model's engine client is made: `engine` as given (the cluster's
        `RoutedEngine`), an engine process (the default), or the engine in this process
        (tests inject model loaders; debugging: MLX in this process)."""
        if engine is not None:
            return lambda _config: engine
        if loader is None and server.engine_process:
            return lambda config: RemoteEngine(config, server.log_level, spares)

        def in_process(config: EngineConfig) -> EngineClient:
            from gateway.engine.core import Engine

            if loader is None and serving_task(config.model, config.task) != "chat":
                from gateway.engine.embed.engine import EmbedEngine

                return EmbedEngine(config)  # type: ignore[return-value]
            return Engine(config, Metrics(), loader)

        return in_process

    def _prepare(self, slot: ModelSlot) -> None:
        """A model's engine has started (worker thread): its prompt builder, its context
        and card, and the engine warm-up (--no-warmup skips it)."""
        engine, config = slot.engine, slot.config
        assert engine is not None and engine.model is not None
        model = engine.model
        if isinstance(model, EmbedCard):  # an embedding model: no prompt builder, no warm-up
            slot.card = model.describe()
            slot.context_length = model.max_tokens
            return
        window = context_window(model, config, engine.device_memory).tokens
        prompts = PromptBuilder(model, window, config.default_max_tokens, config.tool_call_parser)
        if config.warmup:  # (a text model takes no images: its warm-up is text only)
            sizes = config.warmup_image_sizes if "image" in model.media else ()
            log.info(
                "warming up %r (text, image sizes %s); --no-warmup skips this", slot.name, sizes
            )
            seconds = Warmup(engine, prompts).run(sizes)
            log.info("warm-up of %r done in %.1f s", slot.name, seconds)
        slot.card = {**model.describe(), **capabilities(model, prompts)}
        slot.context_length = window
        slot.prompts = prompts

    @property
    def engine(self) -> EngineClient:
        """The default model's engine (503 while it is not loaded)."""
        engine = self.pool.default.engine
        if engine is None:
            raise engine_unavailable()
        return engine

    def engine_for(self, request: Request) -> EngineClient:
        """The engine of the model `?model=` names (default: the default model): 404 for a
        name not served, 409 for a model not loaded (its caches went with it)."""
        name = request.query_params.get("model")
        slot = self.pool.default if name is None else self.pool.find(name)
        if slot is None:
            raise model_not_found(str(name), self.pool.served_names)
        if slot.engine is None or slot.state is not SlotState.LOADED:
            raise APIError(
                409,
                f"the model `{slot.name}` is not loaded (it is {slot.shown_state}); its caches "
                f"are in memory only while it is: POST /v1/models/{slot.name}/load",
                param="model",
                code="model_not_loaded",
            )
        return slot.engine

    # ----- lifecycle --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # The engine thread releases the GIL while MLX computes and must get it back at once
        # when a step is done; with CPython's default 5 ms switch interval a busy event loop
        # (SSE chunks of many streams) could hold it for half a decode step.
        sys.setswitchinterval(0.0005)
        self._loop = asyncio.get_running_loop()
        delivery = LoopDelivery(self._loop)
        try:
            if await self.pool.start():
                await self._ready(app, delivery)
            else:  # uvicorn, told of the signal too, shuts down without serving
                log.info("a shutdown signal came while the models loaded: not serving")
            yield
        finally:  # also when start-up fails after an engine started: never leave one running
            self.pipeline.close()
            await self.pool.stop()
            if self.spares is not None:
                await asyncio.to_thread(self.spares.close)
            await self.media.aclose()

    async def _ready(self, app: Starlette, delivery: LoopDelivery) -> None:
        """The models are loaded: open the pipeline (from here on /health says ready) and
        warm the HTTP path, unless a shutdown signal has come meanwhile."""
        if self.spares is not None:  # the next load's process, imports done meanwhile
            self.spares.prepare()
        self.pipeline.open(delivery)
        if self.engine_config.warmup and not self._shutdown_begun:
            await self._warm_http(app)
        freeze_startup_objects("HTTP process, ready")
        names = ", ".join(f"{s.name!r} ({s.config.model})" for s in self.pool.slots)
        log.info("serving %s", names)

    async def _warm_http(self, app: Starlette) -> None:
        """One streamed and one plain chat request through the app itself (in-process, before
        the port opens): the first request through Starlette, the SSE writer and the JSON
        paths cost tens of ms once, which would otherwise land on a user's first request."""
        if self.pool.default.kind != "chat":  # an embedding model: no chat route to warm
            return
        key = self.keys.warmup_key
        headers = {"authorization": f"Bearer {key}"} if key else {}
        body = {
            "model": self.pool.default.name,
            "messages": [{"role": "user", "content": "warm-up"}],
            "max_tokens": 2,
            "temperature": 0,
        }
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://warm-up") as client:
            for stream in (True, False):
                if self._shutdown_begun:  # a signal meanwhile: a 503 would only be noise
                    return
                response = await client.post(
                    "/v1/chat/completions", json={**body, "stream": stream}, headers=headers
                )
                if response.status_code != 200:
                    log.warning("HTTP warm-up got %d: %s", response.status_code, response.text)
        self.metrics.http_responses.clear()  # the warm-up's responses are not the users'
        self.engine.reset_caches()

    def begin_shutdown(self) -> None:
        """SIGTERM/SIGINT arrived (called from the signal handler; thread-safe). New requests
        get 503 from now on; shortly before --shutdown-grace ends, requests still running end
        with an error event of their API (instead of uvicorn cutting their connection)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        if self._shutdown_begun:  # a second signal: uvicorn exits at once, end streams now
            self._interrupt(forced=True)
            return
        self._shutdown_begun = True
        if not self.pipeline.ready:  # still starting: stop loading (the engine process too)
            self._loop.create_task(self.pool.stop())  # type: ignore[union-attr]
        self.pipeline.close()
        grace = self.server.shutdown_grace_s
        assert self._loop is not None
        # Leave the streams time to deliver the error event and close before uvicorn's own
        # deadline cancels their tasks.
        self._loop.call_later(max(0.0, grace - min(1.0, grace / 2)), self._interrupt)

    def _interrupt(self, forced: bool = False) -> None:
        """End the running requests with an error that says why: the grace period is over, or
        a second signal forced the shutdown (a client told 'the grace is over' a second after
        Ctrl-C would look for a timeout that never was)."""
        if forced:
            why = "the server's shutdown was forced (a second Ctrl-C or signal while it drained)"
        else:
            grace = self.server.shutdown_grace_s
            why = f"the server is shutting down and its --shutdown-grace of {grace:g} s is over"
        count = self.pipeline.interrupt_all(f"{why}; the answer is incomplete")
        if count:
            how = "shutdown forced" if forced else "shutdown"
            log.warning("%s: ended %d running request(s) with an error event", how, count)

    # ----- helpers ----------------------------------------------------------------------------

    @staticmethod
    async def _engine_call(method: Callable[[], T]) -> T:
        """A call into the engine (a pipe round trip when it runs in its own process), off the
        event loop so streams keep flowing; 503 if the engine is gone."""
        try:
            return await asyncio.to_thread(method)
        except EngineUnavailable:
            raise engine_unavailable() from None

    # ----- routes -----------------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        """Every served model with its state (loaded, loading, unloading, unloaded), its
        capabilities and context once known. `root` is its id too: the model's path or hub
        name stays on the server (a local path would tell clients its file system)."""
        self.keys.authorize(request, "read")
        cards = [self._card(slot) for slot in self.pool.slots]
        # One body for both SDKs: OpenAI's list, and Anthropic's page fields beside it.
        page = {"has_more": False, "first_id": cards[0]["id"], "last_id": cards[-1]["id"]}
        return JSONResponse({"object": "list", "data": cards, **page})

    async def model(self, request: Request) -> Response:
        """One served model's card, as `models` lists it (OpenAI's `GET /v1/models/{model}`;
        an alias names its model): 404 naming the served ones for another name, 405 for a
        GET of the admin load / unload endpoints."""
        self.keys.authorize(request, "read")
        name = request.path_params["model"]
        head, _, action = name.rpartition("/")
        if self.pool.find(name) is None and action in ("load", "unload") and self.pool.find(head):
            raise APIError(
                405,
                f"POST /v1/models/{head}/{action} {action}s the model; GET is not allowed",
                headers={"Allow": "POST"},
            )
        return JSONResponse(self._card(self._slot(request)))

    def _card(self, slot: ModelSlot) -> dict[str, Any]:
        card: dict[str, Any] = {
            "id": slot.name,
            "object": "model",
            "created": self.created,
            "owned_by": "vision-gateway",
            # Anthropic's model fields, so `anthropic`'s models.list / retrieve read it too
            "type": "model",
            "display_name": slot.name,
            "created_at": self.created_at,
            "root": slot.name,
            "state": slot.shown_state,
            "pinned": slot.spec.pinned,
        }
        if slot.spec.aliases:
            card["aliases"] = list(slot.spec.aliases)
        card.update(slot.card)  # the family, its media, caches and capabilities (once loaded)
        if slot.context_length is not None:  # prompt + answer (vLLM's and OpenRouter's names)
            card.update(max_model_len=slot.context_length, context_length=slot.context_length)
        if slot.last_error is not None and slot.state is SlotState.UNLOADED:
            card["error"] = slot.last_error
        if self.notice:
            card["notice"] = self.notice
        return card

    async def load_model(self, request: Request) -> Response:
        """Admin: load the model now (evicting as a request would); 503 when it fails."""
        self.keys.authorize(request, "admin")
        slot = self._slot(request)
        held = await self.pool.acquire(slot)
        self.pool.release_now(held)
        return JSONResponse(self._card(slot))

    async def unload_model(self, request: Request) -> Response:
        """Admin: unload the model once its running requests are done."""
        self.keys.authorize(request, "admin")
        slot = self._slot(request)
        unloaded = await self.pool.unload(slot)
        return JSONResponse({**self._card(slot), "unloaded": unloaded})

    def _slot(self, request: Request) -> ModelSlot:
        name = request.path_params["model"]
        slot = self.pool.find(name)
        if slot is None:
            raise model_not_found(name, self.pool.served_names)
        return slot

    async def health(self, _: Request) -> Response:
        loaded = self.pool.loaded()
        engines = [s.engine for s in loaded if s.engine is not None]
        ready = self.pipeline.ready and all(e.alive for e in engines)
        body: dict[str, Any] = {
            "status": "ok" if ready else "unavailable",
            "model": self.pool.default.name,
            "running": sum(e.running for e in engines),
            "waiting": sum(e.waiting for e in engines),
        }
        if len(self.pool.slots) > 1:
            body["models"] = {s.name: s.shown_state for s in self.pool.slots}
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics_endpoint(self, request: Request) -> Response:
        """The edge's metrics, then the engines': with several models each series summed
        over the loaded ones, and again per model with a `model` label."""
        self.keys.authorize(request, "admin")
        single = self.pool.default.engine if len(self.pool.slots) == 1 else None
        if single is not None:  # one model: its engine's series as they are
            engines = await self._engine_call(single.metrics_text)
        else:
            parts = []
            for slot in self.pool.loaded():
                if slot.engine is not None:
                    parts.append((slot.name, await self._engine_call(slot.engine.metrics_text)))
            engines = merge_metrics(parts, label="model")
        text = self.metrics.render() + engines
        return Response(text, media_type="text/plain; version=0.0.4")

    async def cache_stats(self, request: Request) -> Response:
        """The caches of the model `?model=` names (default: the default model). Every key
        sees the caches' totals; the `tenants` section holds every tenant's numbers for the
        admin, only the caller's own otherwise."""
        caller = self.keys.authorize(request, "read")
        stats = await self._engine_call(self.engine_for(request).cache_stats)
        return JSONResponse(own_tenant(stats, caller))

    async def cache_clear(self, request: Request) -> Response:
        self.keys.authorize(request, "admin")
        engine = self.engine_for(request)
        await self._engine_call(engine.clear_caches)
        return JSONResponse({"cleared": True, **await self._engine_call(engine.cache_stats)})

    def reload_keys(self) -> None:
        """SIGHUP: reread --api-keys-file (thread-safe: applied on the event loop)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.keys.reload)


def own_tenant(stats: dict[str, Any], caller: Caller) -> dict[str, Any]:
    """`stats` with its `tenants` section cut to the caller's own tenant unless it is the
    admin (a non-admin learns nothing of other tenants' use of the caches)."""
    if caller.admin or "tenants" not in stats:
        return stats
    mine = {t: row for t, row in stats["tenants"].items() if t == caller.tenant}
    return {**stats, "tenants": mine}


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    log_refusal(request, exc)
    return render_error(exc)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 / 405, in the error shape of the API the path belongs to."""
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    error = APIError(exc.status_code, str(exc.detail), kind, headers=exc.headers)
    log_refusal(request, error)
    if request.url.path.startswith("/v1/messages"):
        return render_anthropic_error(error)
    return render_error(error)


async def server_error(_: Request, exc: Exception) -> Response:
    log.exception("unhandled error", exc_info=exc)
    return render_error(internal_error(exc))


def create_app(
    server: ServerConfig,
    engine: EngineConfig,
    media: MediaConfig,
    loader: Callable[[], ModelFamily] | None = None,
    notice: str | None = None,
    engine_client: EngineClient | None = None,
    pool: PoolConfig | None = None,
    make_engine: EngineFactory | None = None,
) -> Starlette:
    """The app over the models `pool` names (default: `engine.model` alone), each on an
    `Engine` (with `loader`, or `--in-process-engine`), a `RemoteEngine` (the default),
    `engine_client` (any other `EngineClient`, for the one model), or what `make_engine`
    makes of each model's config (the cluster's `RoutedEngine`s)."""
    gateway = Gateway(server, engine, media, loader, notice, engine_client, pool, make_engine)
    routes = [
        *openai_api.routes(gateway.intake),
        *embeddings_api.routes(gateway.intake, gateway.embeddings),
        *rerank_api.routes(gateway.intake, gateway.embeddings),
        *anthropic_api.routes(gateway.intake),
        *responses_api.routes(gateway.intake, server, engine.cache),  # /v1/responses, state
        Route("/v1/models", gateway.models, methods=["GET"]),
        Route("/v1/models/{model:path}/load", gateway.load_model, methods=["POST"]),
        Route("/v1/models/{model:path}/unload", gateway.unload_model, methods=["POST"]),
        Route("/v1/models/{model:path}", gateway.model, methods=["GET"]),
        Route("/health", gateway.health, methods=["GET"]),
        Route("/metrics", gateway.metrics_endpoint, methods=["GET"]),
        Route("/v1/cache/stats", gateway.cache_stats, methods=["GET"]),
        Route("/v1/cache/clear", gateway.cache_clear, methods=["POST"]),
        *web_routes(gateway),  # the playground, the dashboard and their JSON endpoints
    ]
    # Errors outside the chat routes (unknown paths, the endpoints above) are OpenAI-shaped,
    # Starlette's own 404/405 under /v1/messages Anthropic-shaped (`http_error`); each chat
    # route renders its own API's errors (gateway.api.http.with_errors).
    counted = Middleware(ResponseCounter, counter=gateway.metrics.http_responses, routes=routes)
    app = Starlette(
        routes=routes,
        middleware=[counted],
        lifespan=gateway.lifespan,
        exception_handlers={
            APIError: api_error,
            HTTPException: http_error,
            Exception: server_error,
        },
    )
    app.state.gateway = gateway
    return app
