"""The embeddings path below the wire format (gateway.frontend.embed), over a fake embedding
engine: no MLX, no processes.

Pinned: a model takes at most --max-batch + --max-waiting embedding requests at once; one
more is a 429 (Overloaded, Retry-After) that leaves the model's hold count as it was; the
calls are handed to the engine from a worker thread (their images are pickled there, never
on the event loop); the requests in flight answer once their futures resolve; a request
cancelled while it waits cancels its call in the engine.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from gateway.config import EngineConfig, MediaConfig
from gateway.engine.embed.request import Embed, EmbedCard, EmbedResult
from gateway.frontend.embed import EmbedPipeline
from gateway.frontend.embed_request import EmbedInput, EmbedRequest
from gateway.frontend.errors import Overloaded
from gateway.frontend.pipeline import ChatPipeline
from gateway.media import MediaLoader
from gateway.metrics import EdgeMetrics, PoolMetrics
from gateway.pool.pool import ModelPool
from gateway.pool.slot import ModelSlot
from gateway.pool_config import ModelSpec, PoolConfig

CARD = EmbedCard("text_embedding", "qwen3", frozenset(), 4, 64, False, True)


class FakeEmbedder:
    """Holds every call's future until `answer_all`; records the sending thread."""

    def __init__(self) -> None:
        self.model = CARD
        self.idle = self.alive = True
        self.pending: list[Future[EmbedResult]] = []
        self.calls: list[Embed] = []
        self.cancelled: list[str] = []
        self.threads: set[str] = set()

    def start(self, timeout: float | None = None) -> None:
        pass

    def stop(self, timeout: float = 10.0) -> None:
        pass

    def embed(self, call: Embed) -> EmbedResult:
        raise NotImplementedError

    def embed_future(self, call: Embed) -> Future[EmbedResult]:
        self.threads.add(threading.current_thread().name)
        future: Future[EmbedResult] = Future()
        self.pending.append(future)
        self.calls.append(call)
        return future

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    def answer_all(self) -> None:
        for future in self.pending:
            future.set_result(EmbedResult(np.ones((1, 4), np.float32), (3,)))


def test_a_model_takes_its_capacity_and_a_429_beyond() -> None:
    engine = FakeEmbedder()
    config = EngineConfig("/nowhere", "emb", max_batch=1, max_waiting=1)  # capacity 2
    spec = ModelSpec("emb", "/nowhere", pinned=True)
    slot = ModelSlot(spec, config, -1, 0, lambda _: engine, "embed")  # type: ignore[arg-type, return-value]

    async def work() -> tuple[Overloaded, list[EmbedResult], int]:
        pool = ModelPool(PoolConfig(), [slot], lambda s: None, PoolMetrics(CollectorRegistry()))
        await pool.start()
        media = MediaLoader(MediaConfig())
        embeds = EmbedPipeline(ChatPipeline(pool, media, EdgeMetrics()))
        request = EmbedRequest("emb", (EmbedInput("input", text="hello"),))
        running = [asyncio.ensure_future(embeds.embed(request)) for _ in range(2)]
        while len(engine.pending) < 2:
            await asyncio.sleep(0.01)
        with pytest.raises(Overloaded) as busy:
            await asyncio.wait_for(embeds.embed(request), 10)  # (never hangs the test)
        held = slot.holders
        engine.answer_all()
        results = await asyncio.gather(*running)
        await pool.stop()
        await media.aclose()
        return busy.value, results, held

    busy, results, held = asyncio.run(work())
    assert busy.status == 429 and busy.headers == {"Retry-After": "1"}
    assert "at most 2 requests" in busy.message
    assert held == 2  # the refused request's hold was released
    assert [r.tokens for r in results] == [(3,), (3,)]
    assert slot.holders == 0
    assert engine.threads and "MainThread" not in engine.threads  # sent from a worker thread


def test_a_request_whose_client_left_cancels_its_call() -> None:
    """Invariant: an embedding request cancelled while its call waits (the route cancels it
    when the client disconnects) cancels that call in the engine by its own id."""
    engine = FakeEmbedder()
    config = EngineConfig("/nowhere", "emb", max_batch=4, max_waiting=4)
    spec = ModelSpec("emb", "/nowhere", pinned=True)
    slot = ModelSlot(spec, config, -1, 0, lambda _: engine, "embed")  # type: ignore[arg-type, return-value]

    async def work() -> None:
        pool = ModelPool(PoolConfig(), [slot], lambda s: None, PoolMetrics(CollectorRegistry()))
        await pool.start()
        media = MediaLoader(MediaConfig())
        embeds = EmbedPipeline(ChatPipeline(pool, media, EdgeMetrics()))
        request = EmbedRequest("emb", (EmbedInput("input", text="hello"),))
        waiting = asyncio.ensure_future(embeds.embed(request))
        while not engine.pending:
            await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await pool.stop()
        await media.aclose()

    asyncio.run(work())
    (call,) = engine.calls
    assert call.request_id.startswith("embd-") and engine.cancelled == [call.request_id]
    assert slot.holders == 0
