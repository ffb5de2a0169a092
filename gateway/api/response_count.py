"""Every HTTP response counted by route and status code, for `/metrics`.

The engine counts the requests it finished; everything the edge turns away before that (a bad
image, a missing key, a full queue, an unknown path) never reaches it. An operator alerting on
overload (429/529) or on clients sending broken images (400) needs those too, so this pure
ASGI middleware (no buffering: streams pass through untouched) counts the status of each
response as it starts, labelled with the route's path template (`/v1/responses/{response_id}`,
not the id: the label set stays bounded) or `other` for a path no route serves.

Event loop only; the counter is prometheus-client's (thread-safe).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Counter
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class ResponseCounter:
    """ASGI middleware: `counter.labels(route, status).inc()` once per HTTP response."""

    def __init__(self, app: ASGIApp, counter: Counter, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self._counter = counter
        self._routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self._route(scope)
        started = False

        async def counting(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self._counter.labels(route, str(message["status"])).inc()
            await send(message)

        try:
            await self.app(scope, receive, counting)
        except Exception:
            # An unhandled error is answered by Starlette's outermost middleware, outside
            # this one: count its 500 here.
            if not started:
                self._counter.labels(route, "500").inc()
            raise

    def _route(self, scope: Scope) -> str:
        """The path template of the route serving `scope` (any method), else "other"."""
        for route in self._routes:
            match, _ = route.matches(scope)
            if match is not Match.NONE:
                return getattr(route, "path", "other") or "other"
        return "other"
