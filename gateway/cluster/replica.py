"""One engine replica as a Ray Serve deployment: an `Engine` (or a `RemoteEngine`, its own
process, as `serve` runs it) inside the replica actor, its events streamed back to the ingress.

Each replica slot is its own Serve application with `num_replicas=1`, so the ingress's router
(`gateway.cluster.router`) picks the slot and Serve only keeps it alive: when the actor dies
(killed, out of memory, its node gone) Serve starts a new one, which loads the model and warms
up before it answers. Requests the dead actor was serving fail at the ingress with a clean
error; the ingress routes around the slot until `info` answers again.

Stream protocol of `generate(request)`: lists of engine events (`gateway.engine.request`), as
many as were ready at once (one Ray message per batch, not per token), ending with the list
that holds the request's FinishEvent or ErrorEvent. An exception (the engine is busy or gone)
reaches the ingress before any event, so the ingress can send the request elsewhere.
Cancellation: `cancel(request_id)` (also before `generate` arrives: remembered briefly), or
the ingress closing the stream (the generator's `finally` cancels in the engine).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from gateway.api.prompt import PromptBuilder
from gateway.api.streams import EventStream, LoopDelivery
from gateway.config import EngineConfig
from gateway.engine.request import EngineRequest, ErrorEvent, Event, FinishEvent, Usage

log = logging.getLogger(__name__)
EARLY_CANCELS = 1024  # cancels that arrived before their request, remembered


class EngineReplica:
    """The body of one replica actor. Serve constructs it (model load and warm-up included:
    the replica is not ready before) and calls its methods on the actor's event loop."""

    def __init__(
        self, slot: int, config: EngineConfig, engine_process: bool, log_level: str
    ) -> None:
        from gateway.engine.core import Engine
        from gateway.engine.process import RemoteEngine
        from gateway.metrics import Metrics

        logging.basicConfig(
            level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        self.slot = slot
        self.started = time.time()
        self.engine: Any = (
            RemoteEngine(config, log_level) if engine_process else Engine(config, Metrics())
        )
        self.engine.start()
        if config.warmup:
            from gateway.warmup import Warmup

            prompts = PromptBuilder(
                self.engine.model,
                self.engine.needs_pixels,
                config.max_context_tokens,
                config.default_max_tokens,
            )
            seconds = Warmup(self.engine, prompts).run(config.warmup_image_sizes)
            log.info("replica %d: warm-up done in %.1f s", slot, seconds)
        self._live: set[str] = set()
        self._early_cancels: OrderedDict[str, None] = OrderedDict()
        log.info("replica %d ready (pid %d, %s)", slot, os.getpid(), config.model)

    async def generate(self, request: EngineRequest) -> AsyncIterator[list[Event]]:
        """Run `request`; yields batches of its events (see the module docstring)."""
        request_id = request.request_id
        if request_id in self._early_cancels:  # cancelled before it arrived
            del self._early_cancels[request_id]
            yield [FinishEvent("cancelled", Usage(len(request.prompt_ids), 0, 0))]
            return
        stream = EventStream(LoopDelivery(asyncio.get_running_loop()))
        self.engine.submit(request, stream.sink)  # EngineBusy / EngineUnavailable: raised
        self._live.add(request_id)
        ended = False
        try:
            while not ended:
                batch: list[Any] = await stream.get_ready()
                ended = any(isinstance(e, (FinishEvent, ErrorEvent)) for e in batch)
                yield batch
        finally:
            self._live.discard(request_id)
            if not ended:  # the ingress closed the stream (its client left, or it died)
                self.engine.cancel(request_id)

    async def cancel(self, request_id: str) -> None:
        """Cancel a request here (its stream then ends with a `cancelled` finish)."""
        if request_id in self._live:
            self.engine.cancel(request_id)
            return
        self._early_cancels[request_id] = None
        while len(self._early_cancels) > EARLY_CANCELS:
            self._early_cancels.popitem(last=False)

    async def info(self) -> dict[str, Any]:
        """Who and how busy this replica is (also the ingress's readiness probe)."""
        return {
            "slot": self.slot,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "alive": self.engine.alive,
            "running": self.engine.running,
            "waiting": self.engine.waiting,
            "uptime_s": round(time.time() - self.started, 1),
        }

    async def call(self, method: str, *args: Any) -> Any:
        """One of the engine's cache/metrics methods, off the actor's event loop."""
        if method == "cache_entries" and not hasattr(self.engine, "cache_entries"):
            from caches.entries import entries_report

            engine = self.engine
            return await asyncio.to_thread(
                entries_report, engine.vision_cache, engine.prefix_cache, *args
            )
        if method not in ("cache_stats", "clear_caches", "reset_caches", "metrics_text"):
            raise ValueError(f"not a replica call: {method}")
        return await asyncio.to_thread(getattr(self.engine, method), *args)

    def check_health(self) -> None:
        """Serve's periodic probe: a replica whose engine stopped is replaced."""
        if not self.engine.alive:
            raise RuntimeError(f"replica {self.slot}: the engine is not running")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None and engine.alive:
            engine.stop()
