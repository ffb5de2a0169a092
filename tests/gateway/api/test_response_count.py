"""Counting responses by route and status (gateway.api.response_count), no server.

Pinned: each response is counted once under its route's path template (an id in the path is
not a label), a path no route serves as `other`, and an unhandled error, which Starlette
answers outside this middleware, as a 500 of its route.
"""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client import CollectorRegistry, Counter
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway.api.response_count import ResponseCounter


async def _ok(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def _boom(request: Request) -> PlainTextResponse:
    raise RuntimeError("boom")


async def _requests(app: Starlette) -> int:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for path in ("/items/1", "/items/2", "/nowhere", "/boom"):
            await client.get(path)
        return (await client.post("/items/3")).status_code


def test_responses_are_counted_by_route_template_and_status() -> None:
    counter = Counter("r", "r", ["route", "status"], registry=CollectorRegistry())
    routes = [Route("/items/{item_id}", _ok), Route("/boom", _boom)]
    counted = Middleware(ResponseCounter, counter=counter, routes=routes)
    assert asyncio.run(_requests(Starlette(routes=routes, middleware=[counted]))) == 405

    def count(route: str, status: str) -> float:
        return counter.labels(route, status)._value.get()

    assert count("/items/{item_id}", "200") == 2 and count("/items/{item_id}", "405") == 1
    assert count("other", "404") == 1 and count("/boom", "500") == 1
