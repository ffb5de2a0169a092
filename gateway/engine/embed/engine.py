"""`EmbedEngine`: an embedding model served as an `EngineClient` (so the model pool loads,
holds and unloads it like a chat model) plus `embed`, the one thing it does.

One engine thread owns MLX: it loads the embedder, then takes calls off a queue, and each
time it wakes it runs every call waiting as one batch (`batch.BatchRunner`: many inputs, of
one or many requests, in each forward). `embed` blocks the caller; `embed_async` calls back
on the engine thread (the engine process answers the pipe from there).

Chat requests never reach it (the front end answers 400 for an embedding model first);
`submit` answers one anyway with an error event saying so.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from caches.embeddings import EmbeddingCache
from caches.entries import entries_report
from caches.vision import VisionCache
from gateway.config import EngineConfig
from gateway.engine.client import EngineUnavailable
from gateway.engine.device_memory import device_memory
from gateway.engine.embed.batch import BatchRunner, Done, Job
from gateway.engine.embed.embedder import Embedder
from gateway.engine.embed.metrics import EmbedMetrics
from gateway.engine.embed.request import Embed, EmbedCancelled, EmbedCard, EmbedResult, settle
from gateway.engine.request import EngineRequest, Sink

log = logging.getLogger(__name__)
_STOP = object()
_WAKE = object()  # a cancel arrived: look at the backlog again (no work of its own)


class EmbedEngine:
    """An embedding model's engine. Thread-safe; see the module doc. `load` builds the
    embedder on the engine thread (default: `loader.load_embedder(config.model)`)."""

    def __init__(self, config: EngineConfig, load: Callable[[], Embedder] | None = None) -> None:
        self.config = config
        self._load = load
        self.embedder: Embedder | None = None
        cache = config.cache
        share = cache.tenant_cache_share
        self.embedding_cache = EmbeddingCache(cache.embedding_capacity_bytes, share)
        self.vision_cache = VisionCache(cache.vision_capacity_bytes, share)
        self.metrics = EmbedMetrics(self.cache_stats)
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._backlog: deque[Job] = deque()  # calls taken from the inbox, not run yet
        self._cancelled: set[str] = set()  # request ids to drop before they run (under _lock)
        self._queued: set[str] = set()  # request ids of calls not answered yet (under _lock)
        self._ready = threading.Event()
        self._load_error: str | None = None
        self._thread: threading.Thread | None = None
        self._alive = False
        self._pending = 0  # calls queued or running
        self._lock = threading.Lock()
        self.on_gpu = False

    # ----- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Load the embedder on the engine thread; RuntimeError naming why it did not load,
        TimeoutError past `timeout` seconds."""
        self._thread = threading.Thread(target=self._run, name="embed-engine", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the embedding model did not load in time")
        if self._load_error is not None:
            raise RuntimeError(f"model failed to load: {self._load_error}")
        self._alive = True

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the batch running, fail the calls still queued, stop the thread."""
        self._alive = False
        if self._thread is not None:
            self._inbox.put(_STOP)
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def model(self) -> EmbedCard | None:
        """What the HTTP side knows of the model (`EmbedCard`), once loaded."""
        return None if self.embedder is None else self.embedder.card

    @property
    def device_memory(self) -> int | None:
        return device_memory(self.on_gpu) if self._alive else None

    # ----- embeddings ---------------------------------------------------------------------------

    def embed_async(self, call: Embed, done: Done) -> None:
        """Queue `call`; `done` gets its `EmbedResult` or the exception (`EmbedRefused` for an
        input the model cannot take), on the engine thread. EngineUnavailable if stopped."""
        if not self._alive:
            raise EngineUnavailable("the embedding engine is not running")
        with self._lock:
            self._pending += 1
            self._queued.add(call.request_id)

        def finish(outcome: EmbedResult | BaseException) -> None:
            with self._lock:
                self._pending -= 1
                self._queued.discard(call.request_id)
            done(outcome)

        self._inbox.put(Job(call, finish))

    def embed_future(self, call: Embed) -> Future[EmbedResult]:
        """`call` queued; the future resolves to its result or fails as `embed_async` says."""
        future: Future[EmbedResult] = Future()

        self.embed_async(call, lambda outcome: settle(future, outcome))
        return future

    def embed(self, call: Embed, timeout: float | None = None) -> EmbedResult:
        """`call` answered (blocks); raises what `embed_async` hands `done`."""
        try:
            return self.embed_future(call).result(timeout)
        except TimeoutError:
            raise EngineUnavailable("the embedding engine did not answer in time") from None

    # ----- the EngineClient surface ---------------------------------------------------------

    def submit(self, request: EngineRequest, sink: Sink) -> None:
        """Refused: an embedding model does not chat (the front end answers 400 first; the
        engine process turns this into the request's error event)."""
        raise ValueError("this model is an embedding model or reranker: it does not chat")

    def cancel(self, request_id: str) -> None:
        """Drop the call `request_id` (its client left) if it has not started: its `done`
        gets `EmbedCancelled` instead of running. A call already in a batch is answered."""
        with self._lock:
            if not request_id or request_id not in self._queued:
                return  # answered already (or never queued): nothing to drop
            self._cancelled.add(request_id)
        self._inbox.put(_WAKE)

    @property
    def running(self) -> int:
        with self._lock:
            return self._pending

    @property
    def waiting(self) -> int:
        return self._inbox.qsize() + len(self._backlog)

    @property
    def idle(self) -> bool:
        return self.running == 0

    def cache_stats(self) -> dict[str, Any]:
        """The embedding and vision caches' counters (JSON-able), with `tenants`."""
        out: dict[str, Any] = {}
        tenants: dict[str, dict[str, Any]] = {}
        for name, cache in (("embedding", self.embedding_cache), ("vision", self.vision_cache)):
            stats = cache.stats()
            row = dataclasses.asdict(stats)
            row |= {
                "queries": stats.hits + stats.misses,
                "hit_rate": stats.hit_rate,
                "enabled": stats.capacity_bytes > 0,
            }
            out[name] = row
            for tenant, counts in cache.tenant_stats().items():
                tenants.setdefault(tenant, {})[name] = counts
        out["tenants"] = tenants
        return out

    def cache_entries(
        self, limit: int = 10, kind: str | None = None, tenant: str | None = None
    ) -> dict[str, Any]:
        """The vision cache's entries (`caches.entries.entries_report`; no prefix cache)."""
        return entries_report(self.vision_cache, _NoEntries(), limit, kind, tenant)

    def clear_caches(self) -> None:
        self.embedding_cache.clear()
        self.vision_cache.clear()

    def reset_caches(self) -> None:
        share = self.config.cache.tenant_cache_share
        self.embedding_cache = EmbeddingCache(self.config.cache.embedding_capacity_bytes, share)
        self.vision_cache = VisionCache(self.config.cache.vision_capacity_bytes, share)
        if self.embedder is not None:
            self._inbox.put(_Reset())

    def metrics_text(self) -> bytes:
        return self.metrics.render()

    # ----- the engine thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            import mlx.core as mx

            from gateway.engine.embed.loader import load_embedder

            config = self.config
            self.embedder = self._load() if self._load else load_embedder(config.model, config.task)
            self.on_gpu = mx.default_device().type == mx.DeviceType.gpu
        except Exception as exc:  # noqa: BLE001 - reported by start
            log.exception("the embedding model did not load")
            self._load_error = f"{type(exc).__name__}: {exc}"
            self._ready.set()
            return
        self._ready.set()
        # All of the engine's MLX work on a stream of its own, as the chat engine's (mlx-lm's
        # generator stream): with the thread's default stream, MLX's exit after real work
        # aborted the process ("terminate called without an active exception").
        with mx.stream(mx.new_stream(mx.default_device())):
            self._serve()

    def _serve(self) -> None:
        runner = self._runner()
        while True:
            messages, stop = self._take()
            if any(isinstance(m, _Reset) for m in messages):
                runner = self._runner()
            self._backlog.extend(m for m in messages if isinstance(m, Job))
            calls = self._next_calls()
            if calls:
                began = time.perf_counter()
                runner.run(calls)
                self.metrics.batch_seconds.observe(time.perf_counter() - began)
            if stop:
                self._fail_queued()
                return

    def _next_calls(self) -> list[Job]:
        """The calls of the next run, oldest first: at least one, and no more than fill one
        forward (`--max-batch` inputs), so that a call cancelled while others run is dropped
        before it starts, and a run is never all the queue's work at once. Cancelled calls
        are answered `EmbedCancelled` here."""
        with self._lock:
            cancelled, self._cancelled = self._cancelled, set()
        calls: list[Job] = []
        inputs = 0
        kept: deque[Job] = deque()
        while self._backlog:
            job = self._backlog.popleft()
            if job.call.request_id in cancelled:
                job.done(EmbedCancelled(f"call {job.call.request_id} was cancelled"))
                continue
            if calls and inputs + len(job.call.items) > self.config.max_batch:
                kept.append(job)
                continue
            calls.append(job)
            inputs += len(job.call.items)
        self._backlog = kept
        with self._lock:  # a cancelled call still waiting in the inbox is dropped next time
            running = {j.call.request_id for j in calls}
            self._cancelled |= {i for i in cancelled if i in self._queued} - running
        return calls

    def _runner(self) -> BatchRunner:
        assert self.embedder is not None
        return BatchRunner(
            self.embedder,
            self.embedding_cache,
            self.vision_cache,
            self.metrics,
            self.config.max_batch,
        )

    def _take(self) -> tuple[list[Any], bool]:
        """Everything queued (blocking for the first unless calls wait in the backlog), and
        whether a stop came."""
        items = [] if self._backlog else [self._inbox.get()]
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        stop = any(i is _STOP for i in items)
        return [i for i in items if i is not _STOP and i is not _WAKE], stop

    def _fail_queued(self) -> None:
        while self._backlog:
            self._backlog.popleft().done(EngineUnavailable("the embedding engine stopped"))
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Job):
                item.done(EngineUnavailable("the embedding engine stopped"))


class _Reset:
    """Engine thread: rebuild the batch runner over the engine's new caches."""


class _NoEntries:
    def entries(self) -> list[Any]:
        return []
