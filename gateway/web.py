"""The browser side of the gateway: the playground (`GET /`), the cache dashboard
(`GET /dashboard`), their static files (`/static/...`, shipped in the package) and the two JSON
endpoints the dashboard reads (`GET /v1/cache/entries`, `GET /v1/dashboard`).

The pages are plain HTML/CSS/JS with nothing to build and nothing fetched from elsewhere; they
talk to the gateway's own OpenAI endpoints exactly as any client would. They carry no data, so
they are served without a key; every JSON endpoint they call checks the key (gateway/api/
keys.py: `/v1/dashboard` is the admin's, `/v1/cache/entries` shows a tenant its own entries),
and the pages ask for the key (kept in the tab's sessionStorage) when the server answers 401.

`web_routes(gateway)` is all `create_app` needs. Handlers run on the event loop; calls into
the engine go through `gateway._engine_call` (off the loop, 503 if the engine is gone).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from caches.entries import MAX_LIMIT, check_query
from gateway.api.keys import Keyring
from gateway.config import EngineConfig, ServerConfig
from gateway.dashboard import LiveStats, Sample, parse_engine_metrics
from gateway.engine.client import EngineClient
from gateway.errors import invalid

STATIC = Path(__file__).parent / "static"
# The pages load only their own scripts and styles; images and videos may come from anywhere
# the user points the playground at (the thumbnail of a URL), and from pasted/dropped files.
PAGE_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data: blob: http: https:; "
        "media-src 'self' data: blob: http: https:; "
        "object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


class _Gateway(Protocol):
    """What the web routes use of `gateway.app.Gateway`."""

    server: ServerConfig
    engine_config: EngineConfig
    keys: Keyring

    def engine_for(self, request: Request) -> EngineClient: ...

    async def _engine_call(self, method: Any) -> Any: ...


class Web:
    """Page and dashboard handlers over one gateway; one `LiveStats` history per model."""

    def __init__(self, gateway: _Gateway) -> None:
        self.gateway = gateway
        self.live: dict[str, LiveStats] = {}  # per served model
        self._sampling: asyncio.Lock | None = None  # created on the loop that uses it

    async def playground(self, _: Request) -> Response:
        return FileResponse(STATIC / "playground.html", headers=PAGE_HEADERS)

    async def dashboard(self, _: Request) -> Response:
        return FileResponse(STATIC / "dashboard.html", headers=PAGE_HEADERS)

    async def cache_entries(self, request: Request) -> Response:
        """`?limit=N` (1..100, default 10), `?kind=vision|prefix` (default both) and
        `?tenant=NAME`: the caller's own entries (its tenant's); every entry, or the named
        tenant's, for the admin (403 for anyone else naming another tenant)."""
        g = self.gateway
        caller = g.keys.authorize(request, "read")
        tenant = request.query_params.get("tenant")
        if tenant is not None and tenant != caller.tenant:
            caller = g.keys.authorize(request, "admin")
        if tenant is None and not caller.admin:
            tenant = caller.tenant
        raw = request.query_params.get("limit", "10")
        kind = request.query_params.get("kind") or None
        limit = int(raw) if raw.isdigit() else 0
        try:
            check_query(limit, kind)
        except ValueError as exc:
            param = "kind" if raw.isdigit() and 1 <= limit <= MAX_LIMIT else "limit"
            raise invalid(str(exc), param) from None
        engine = g.engine_for(request)  # `?model=`: that model's caches (default: the first)
        report = await g._engine_call(lambda: engine.cache_entries(limit, kind, tenant))
        return JSONResponse(report)

    async def dashboard_data(self, request: Request) -> Response:
        """The dashboard's numbers for the model `?model=` names (default: the first):
        samples its engine at most once per ~second, then reports over that model's history
        (see `gateway.dashboard.LiveStats`). The admin's: they are every tenant's traffic
        together."""
        g = self.gateway
        g.keys.authorize(request, "admin")
        engine = g.engine_for(request)
        name = engine.config.served_model_name
        live = self.live.setdefault(name, LiveStats())
        if self._sampling is None:
            self._sampling = asyncio.Lock()
        async with self._sampling:  # concurrent viewers share one sample
            if live.due():
                live.add(await g._engine_call(lambda: self._sample(engine, live)))
        body = live.report()
        body["model"] = name
        return JSONResponse(body)

    @staticmethod
    def _sample(engine: EngineClient, live: LiveStats) -> Sample:
        """Read the engine's counters (a pipe round trip per call when it has its own process;
        runs off the event loop)."""
        caches = engine.cache_stats()
        generated, ttft = parse_engine_metrics(engine.metrics_text())
        return Sample(live.clock(), caches, engine.running, engine.waiting, generated, ttft)


def web_routes(gateway: _Gateway) -> list[BaseRoute]:
    """The pages, their static files and the dashboard's JSON endpoints."""
    web = Web(gateway)
    return [
        Route("/", web.playground, methods=["GET"]),
        Route("/dashboard", web.dashboard, methods=["GET"]),
        Route("/v1/cache/entries", web.cache_entries, methods=["GET"]),
        Route("/v1/dashboard", web.dashboard_data, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
