"""The table benches' client against a server that is not ours.

Invariants: a server that refuses an optional field (here vLLM's `ignore_eos`) with a 400
gets the request again without it, and the field stays off; with no usage chunk the tokens are
counted by content chunks (and the client says so); TTFT is the first content chunk, not the
role chunk; a failing request comes back as an error, never an exception.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from support import wait_until

from bench.sse import ChatClient

seen: list[dict] = []


async def chat(request: Request):
    body = await request.json()
    seen.append(body)
    if "ignore_eos" in body:
        return JSONResponse({"error": {"message": "unknown field: ignore_eos"}}, 400)
    if body["messages"][0]["content"] == "fail":
        return JSONResponse({"error": {"message": "boom"}}, 500)

    async def events():
        yield 'data: {"choices": [{"delta": {"role": "assistant"}}]}\n\n'
        await asyncio.sleep(0.05)  # the role chunk is not the first token
        for word in ["a", "b", "c"]:
            chunk = {"choices": [{"delta": {"content": word}, "finish_reason": None}]}
            yield f"data: {json.dumps(chunk)}\n\n"
            await asyncio.sleep(0.01)
        yield 'data: {"choices": [{"delta": {}, "finish_reason": "length"}]}\n\n'
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def _serve() -> tuple[uvicorn.Server, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    wait_until(lambda: server.started, 10, interval=0.02, message="the peer server did not start")
    return server, f"http://127.0.0.1:{port}"


def test_refused_field_dropped_and_tokens_counted_by_chunks() -> None:
    server, url = _serve()
    try:

        async def go():
            client = ChatClient.open(url + "/v1", "peer-model")
            try:
                first = await client.chat([{"role": "user", "content": "hi"}], 3)
                second = await client.chat([{"role": "user", "content": "again"}], 3)
                failed = await client.chat([{"role": "user", "content": "fail"}], 3)
            finally:
                await client.aclose()
            return client, first, second, failed

        client, first, second, failed = asyncio.run(go())
    finally:
        server.should_exit = True
    assert client.dropped == {"ignore_eos"} and client.counted_by_chunks
    assert [("ignore_eos" in b) for b in seen] == [True, False, False, False]  # asked once
    assert seen[0]["model"] == "peer-model" and seen[0]["stream"] is True
    for reply in (first, second):
        assert reply.error is None and reply.text == "abc" and reply.completion_tokens == 3
        assert reply.ttft_ms >= 50 and reply.role_ms < reply.ttft_ms
        assert reply.finish_reason == "length" and reply.tok_s > 0
    assert failed.error.startswith("HTTP 500") and failed.first is None
