"""One engine replica as a Ray Serve deployment: an `Engine` (or a `RemoteEngine`, its own
process, as `serve` runs it) inside the replica actor, its events streamed back to the ingress.

Each replica slot is its own Serve application with `num_replicas=1`, so the ingress's router
(`gateway.cluster.router`) picks the slot and Serve only keeps it alive: when the actor dies
(killed, out of memory, its node gone) Serve starts a new one, which loads the model and warms
up before it answers. Requests the dead actor was serving fail at the ingress with a clean
error; the ingress routes around the slot until `info` answers again.

Protocol with the ingress (`gateway.engine.wire`'s types): `submit(request)` starts a request
(an exception, e.g. the engine is busy, means nothing started, so the ingress can send it
elsewhere); `events()` is one long-lived stream of every request's events on this replica, as
`Events` batches of (request_id, event) pairs, one batch per wake-up (about one per engine
step, whatever the number of requests: a Ray message costs ~1 ms of CPU, so one per request
per token would cap a replica at a few hundred tokens per second). Each request's events end
with its FinishEvent or ErrorEvent. Cancellation: `cancel(request_id)` (also before `submit`
arrives: remembered briefly), or the ingress closing `events` (every request it was reading
is cancelled). `call(Call)` answers one engine call (stats, entries, clearing, metrics);
`info()` a `ReplicaInfo`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from gateway.config import EngineConfig
from gateway.engine.client import EngineClient
from gateway.engine.request import EngineRequest, Event, FinishEvent, ends_request
from gateway.engine.wire import Call, Events, ReplicaInfo, answer
from gateway.frontend.context import context_window
from gateway.frontend.prompt import PromptBuilder
from gateway.frontend.streams import EventStream, LoopDelivery

log = logging.getLogger(__name__)
EARLY_CANCELS = 1024  # cancels that arrived before their request, remembered


class EngineReplica:
    """The body of one replica actor. Serve constructs it (model load and warm-up included:
    the replica is not ready before) and calls its methods on the actor's event loop."""

    def __init__(
        self, slot: int, config: EngineConfig, engine_process: bool, log_level: str
    ) -> None:
        from gateway.engine.core import Engine
        from gateway.engine.remote.client import RemoteEngine
        from gateway.metrics import Metrics

        logging.basicConfig(
            level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        self.slot = slot
        self.started = time.time()
        if config.step_trace is not None:  # one trace per replica, never interleaved
            trace = config.step_trace
            name = f"{trace.stem}.replica{slot}{trace.suffix}"
            config = dataclasses.replace(config, step_trace=trace.with_name(name))
        self.engine: EngineClient = (
            RemoteEngine(config, log_level) if engine_process else Engine(config, Metrics())
        )
        self.engine.start()
        if config.warmup:
            from gateway.warmup import Warmup

            prompts = PromptBuilder(
                self.engine.model,
                context_window(self.engine.model, config, self.engine.device_memory).tokens,
                config.default_max_tokens,
                config.tool_call_parser,
            )
            seconds = Warmup(self.engine, prompts).run(config.warmup_image_sizes)
            log.info("replica %d: warm-up done in %.1f s", slot, seconds)
        self._live: set[str] = set()  # submitted, not finished (engine thread and loop)
        self._live_lock = threading.Lock()
        self._events: EventStream | None = None
        self._early_cancels: OrderedDict[str, None] = OrderedDict()
        log.info("replica %d ready (pid %d, %s)", slot, os.getpid(), config.model)

    def _outbox(self) -> EventStream:
        """The one queue of (request_id, event) pairs of every request here, created on the
        actor's event loop (where every async method runs)."""
        if self._events is None:
            self._events = EventStream(LoopDelivery(asyncio.get_running_loop()))
        return self._events

    async def submit(self, request: EngineRequest) -> None:
        """Start `request`; its events go out on `events`. Raises EngineBusy /
        EngineUnavailable (nothing started: the ingress may send it elsewhere)."""
        outbox, request_id = self._outbox(), request.request_id
        if request_id in self._early_cancels:  # cancelled before it arrived
            del self._early_cancels[request_id]
            outbox.sink((request_id, FinishEvent.cancelled(len(request.prompt_ids))))
            return

        def sink(event: Event) -> None:  # the engine's thread
            if ends_request(event):
                with self._live_lock:
                    self._live.discard(request_id)
            outbox.sink((request_id, event))

        with self._live_lock:
            self._live.add(request_id)
        try:
            self.engine.submit(request, sink)
        except BaseException:
            with self._live_lock:
                self._live.discard(request_id)
            raise

    async def events(self) -> AsyncIterator[Events]:
        """Every request's events, as (request_id, event) pairs, in batches of what was ready
        at once (about one batch per engine step). One subscriber (the ingress); when it goes
        away, the requests it was reading are cancelled."""
        outbox = self._outbox()
        try:
            while True:
                yield Events(tuple(await outbox.get_ready()))  # type: ignore[arg-type]
        finally:
            with self._live_lock:
                orphans = list(self._live)
            for request_id in orphans:
                self.engine.cancel(request_id)

    async def cancel(self, request_id: str) -> None:
        """Cancel a request here (it then finishes with `cancelled`)."""
        with self._live_lock:
            live = request_id in self._live
        if live:
            self.engine.cancel(request_id)
            return
        self._early_cancels[request_id] = None
        while len(self._early_cancels) > EARLY_CANCELS:
            self._early_cancels.popitem(last=False)

    async def info(self) -> ReplicaInfo:
        """Who and how busy this replica is (also the ingress's readiness probe)."""
        return ReplicaInfo(
            slot=self.slot,
            pid=os.getpid(),
            host=socket.gethostname(),
            alive=self.engine.alive,
            on_gpu=self.engine.on_gpu,
            running=self.engine.running,
            waiting=self.engine.waiting,
            uptime_s=round(time.time() - self.started, 1),
            device_memory=self.engine.device_memory,
        )

    async def prompt_side(self) -> Any:
        """The model's prompt side for the ingress (a `PromptProcessor`, which pickles
        without MLX)."""
        model = self.engine.model
        shipped = getattr(model, "shipped_prompt", None)  # the in-process engine's family
        return shipped() if shipped is not None else model

    async def call(self, call: Call) -> Any:
        """One engine call (`gateway.engine.wire.answer`), off the actor's event loop (it may
        be a pipe round trip to the engine process)."""
        return await asyncio.to_thread(answer, self.engine, call)

    def check_health(self) -> None:
        """Serve's periodic probe: a replica whose engine stopped is replaced."""
        if not self.engine.alive:
            raise RuntimeError(f"replica {self.slot}: the engine is not running")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None and engine.alive:
            engine.stop()
