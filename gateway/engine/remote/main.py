"""The engine process's side of `gateway.engine.remote.client`: run an `Engine`, serve the command
pipe, ship events once per step, prepare image pixels off the engine thread.

See `gateway.engine.remote.client` for the wire protocol. Everything here runs in the spawned
engine process.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from caches.prefix import ImageSpan
from gateway.config import EngineConfig
from gateway.engine.client import EngineBusy, EngineClient
from gateway.engine.image_store import ImageStore
from gateway.engine.request import (
    EngineRequest,
    ErrorEvent,
    ErrorKind,
    Event,
    FinishEvent,
    Sink,
)
from gateway.engine.wire import (
    Call,
    Cancel,
    Command,
    Events,
    Invoke,
    LoadFailed,
    Notice,
    Ready,
    Reply,
    Stop,
    Stopped,
    Submit,
    answer,
)

log = logging.getLogger(__name__)


def engine_process_main(
    config: EngineConfig, log_level: str, commands: Connection, events: Connection
) -> None:
    """Entry point of the engine process: run an Engine, serve the command pipe."""
    from gateway.engine.core import Engine
    from gateway.metrics import Metrics

    # Ctrl-C and a service manager's SIGTERM reach the whole process group: the HTTP process
    # decides when to stop (after draining), and stops this one through the pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    outbox = _Outbox(events)
    engine = Engine(config, Metrics())
    engine.on_events = outbox.flush
    try:
        engine.start()
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        outbox.send(LoadFailed(str(exc)))
        return
    outbox.send(Ready(engine.on_gpu))
    pixels = _PixelPreparer(engine, outbox.flush)
    images = ImageStore(keep_images=True)
    while True:
        try:
            message: Command = commands.recv()
        except (EOFError, OSError):  # the HTTP process is gone
            message = Stop()
        match message:
            case Submit(request):
                request = images.incoming(request)
                pixels.submit(request, outbox.sink(request.request_id))
            case Cancel(request_id):
                pixels.cancel(request_id)
            case Invoke(call_id, call):
                outbox.send(_reply(engine, call_id, call))
            case Stop():
                pixels.close()
                engine.stop()
                outbox.flush()
                outbox.send(Stopped())
                return


def _reply(engine: EngineClient, call_id: int, call: Call) -> Reply:
    """The answer to one call; a failure is the caller's (its repr), never the loop's."""
    try:
        return Reply(call_id, True, answer(engine, call))
    except Exception as exc:  # noqa: BLE001 - reported to the caller
        return Reply(call_id, False, repr(exc))


class _Outbox:
    """Events of the engine process, buffered per step and shipped as one message."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        self._pending: list[tuple[str, Event]] = []

    def sink(self, request_id: str) -> Sink:
        def put(event: Event) -> None:
            with self._lock:
                self._pending.append((request_id, event))

        return put

    def flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
            if batch:
                self._send(Events(tuple(batch)))

    def send(self, message: Notice) -> None:
        with self._lock:
            self._send(message)

    def _send(self, message: Notice) -> None:
        try:
            self._connection.send(message)
        except (OSError, ValueError):
            pass  # the HTTP process is gone; the command loop sees EOF and stops


class _PixelPreparer:
    """Preprocesses the images of incoming requests that the engine will encode, in worker
    threads, then submits them. Requests are submitted in arrival order."""

    def __init__(self, engine: Any, flush: Callable[[], None]) -> None:
        self._engine = engine
        self._flush = flush  # ships events sent outside an engine step
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pixels")
        self._lock = threading.Lock()
        self._preparing: set[str] = set()  # submitted here, not yet handed to the engine
        self._cancelled: set[str] = set()  # cancelled while preparing
        self._previous: Any = None

    def cancel(self, request_id: str) -> None:
        """Cancel a request wherever it is: still being prepared here, or in the engine."""
        with self._lock:
            if request_id in self._preparing:
                self._cancelled.add(request_id)
                return
        self._engine.cancel(request_id)

    def submit(self, request: EngineRequest, sink: Sink) -> None:
        with self._lock:
            self._preparing.add(request.request_id)
        if not request.images:
            self._after_previous(request, sink)
            return
        self._previous = self._pool.submit(self._prepare, request, sink, self._previous)

    def _after_previous(self, request: EngineRequest, sink: Sink) -> None:
        if self._previous is not None and not self._previous.done():
            self._previous = self._pool.submit(self._prepare, request, sink, self._previous)
        else:
            self._submit(request, sink)

    def _prepare(self, request: EngineRequest, sink: Sink, previous: Any) -> None:
        try:
            request = self._with_pixels(request)
        except Exception as exc:  # noqa: BLE001 - the request fails, not the engine
            log.exception("preprocessing the images of %s failed", request.request_id)
            _wait(previous)
            with self._lock:
                self._preparing.discard(request.request_id)
                self._cancelled.discard(request.request_id)
            sink(ErrorEvent(ErrorKind.INTERNAL, f"could not preprocess the image: {exc}"))
            self._flush()
            return
        _wait(previous)  # keep arrival order
        self._submit(request, sink)

    def _with_pixels(self, request: EngineRequest) -> EngineRequest:
        spans = [ImageSpan(i.layout.start, i.layout.end, i.content_hash) for i in request.images]
        needed = self._engine.needs_pixels(request.prompt_ids, spans)
        images = tuple(
            replace(i, pixel_values=self._engine.model.preprocess(i.image)[0])
            if need and i.pixel_values is None and i.image is not None
            else i
            for i, need in zip(request.images, needed, strict=True)
        )
        return replace(request, images=images)

    def _submit(self, request: EngineRequest, sink: Sink) -> None:
        with self._lock:
            self._preparing.discard(request.request_id)
            cancelled = request.request_id in self._cancelled
            self._cancelled.discard(request.request_id)
        if cancelled:
            sink(FinishEvent.cancelled(len(request.prompt_ids)))
            self._flush()
            return
        try:
            self._engine.submit(request, sink)
        except (EngineBusy, ValueError) as refused:  # the edge checks both first
            sink(ErrorEvent(ErrorKind.INTERNAL, f"{refused}"))
            self._flush()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _wait(previous: Any) -> None:
    """Wait for the previous request's preparation (arrival order); its failure is its own."""
    if previous is not None:
        try:
            previous.result()
        except Exception:  # noqa: BLE001 - already logged and answered by its own task
            pass
