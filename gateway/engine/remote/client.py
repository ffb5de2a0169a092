"""The engine in its own process, behind the same interface as `Engine`.

Why: on a GPU the decode step is bound by the Python that builds and launches it (raw mlx-lm
needs ~7.5-8.8 ms of CPU per step for a 7B model at 1-16 rows, while the GPU needs ~3-4 ms),
and one process has one GIL. Every SSE chunk the HTTP edge writes (~100-200 us of Python:
JSON, Starlette, uvicorn, the socket) was GIL time taken out of the engine's step: 16 streams
ran at 0.62x of raw on an H200. vLLM split its API server from its engine core for the same
reason. Here `vision-gateway serve` stays one command: the HTTP process spawns one engine
process and talks to it over two pipes.

Wire protocol (`gateway.engine.wire`'s frozen dataclasses, pickled over `multiprocessing`
connections):
    HTTP -> engine   Submit(request) | Cancel(request_id) | Stop() | Invoke(call_id, Call)
    engine -> HTTP   Ready(on_gpu, prompt, device_memory) | LoadFailed(message)
                     | Events(((id, Event), ...)) | Reply(call_id, ok, value) | Stopped()
Events are shipped once per engine step, as one message, by the engine thread.

In the engine process (`gateway.engine.remote.main`) a small pool prepares image pixels
(preprocessing, numpy and Pillow, mostly outside the GIL) for images the caches do not cover,
so neither the HTTP process nor the engine thread does it and no 25 MB float array crosses
the pipe.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from gateway.config import EngineConfig
from gateway.engine.client import EngineBusy, EngineUnavailable
from gateway.engine.embed.request import Embed, EmbedResult, settle
from gateway.engine.image_store import ImageStore
from gateway.engine.remote.spare import SpareEngines, spawn_engine
from gateway.engine.request import (
    AdmittedEvent,
    EngineRequest,
    ErrorEvent,
    ErrorKind,
    Event,
    Sink,
    ends_request,
)
from gateway.engine.wire import (
    CacheEntries,
    CacheStats,
    Call,
    Cancel,
    ClearCaches,
    Command,
    Events,
    Invoke,
    MetricsText,
    Ready,
    Reply,
    ResetCaches,
    Stop,
    Stopped,
    Submit,
)

log = logging.getLogger(__name__)
# An embedding call waits in the engine's queue behind the batches before it (each up to
# --max-batch inputs per forward), so it may take far longer than a cache stats call.
EMBED_TIMEOUT_S = 600.0


class RemoteEngine:
    """An `EngineClient` over an engine process. Thread-safe; sinks are called on this
    object's reader thread and must not block."""

    def __init__(
        self, config: EngineConfig, log_level: str = "info", spares: SpareEngines | None = None
    ) -> None:
        """`spares`: take a spare engine process (imports done) instead of spawning one."""
        self.config = config
        self._spares = spares
        self.on_gpu = False  # the engine computes on a GPU (known once started)
        self.device_memory: int | None = None  # bytes its device may use (known once started)
        self._log_level = log_level
        self.model: Any = None  # the prompt side (a PromptProcessor: no MLX here)
        self._sinks: dict[str, Sink] = {}
        self._admitted: set[str] = set()
        self._rows: dict[str, int] = {}  # rows each request in flight takes (its n choices)
        self._lock = threading.Lock()  # sinks, counts, calls, the command pipe
        self._calls: dict[int, tuple[threading.Event, list[Reply]]] = {}
        self._futures: dict[int, Future[Any]] = {}  # embedding calls, answered by the reader
        self._call_ids = itertools.count()
        self._alive = False
        self._stopping = False  # stop() was called: a start under way gives up (under _lock)
        self._stopped = threading.Event()
        self._images = ImageStore(keep_images=False)  # what the engine process holds

    # ----- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Start the engine process (or take a spare: `spares`), wait until the model is
        loaded there (re-raises a load failure as RuntimeError) and take its prompt side
        (`wire.Ready.prompt`: no MLX here)."""
        if self._spares is not None:
            started = self._spares.take(self.config)
        else:
            started = spawn_engine(self.config, self._log_level)
        with self._lock:  # stop() sees the process, or this sees that stop() came first
            self._process = started.process
            self._commands, self._events = started.commands, started.events
            stopping = self._stopping
        try:
            if stopping:
                raise RuntimeError("the engine was stopped while it started")
            if not self._events.poll(timeout):
                raise TimeoutError("the engine process did not load the model in time")
            first = self._events.recv()
            if not isinstance(first, Ready):
                raise RuntimeError(f"model failed to load: {first.message}")
            self.on_gpu, self.device_memory = first.on_gpu, first.device_memory
            if first.prompt is None:  # every family ships one (prompt_split, tested)
                raise RuntimeError("the engine process sent no prompt side for the model")
            self.model = first.prompt
        except BaseException:
            self._kill()
            raise
        self._alive = True
        threading.Thread(target=self._read, name="engine-events", daemon=True).start()
        log.info("engine process %d ready", self._process.pid)

    @property
    def alive(self) -> bool:
        """The engine process is serving."""
        return self._alive

    def _kill(self) -> None:
        """Close our end of the pipes and make sure the engine process is gone (it ignores
        SIGTERM, so multiprocessing's exit hook alone would wait for it forever)."""
        for connection in (self._commands, self._events):
            connection.close()
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the engine to stop (in-flight requests get SHUTTING_DOWN errors), wait for it.
        Called while `start` is loading the model (another thread), it kills the process at
        once (a loading engine holds nothing to finish) and `start` raises."""
        with self._lock:
            self._stopping = True
            process = getattr(self, "_process", None)
        if self._alive:
            self._send(Stop())
            self._stopped.wait(timeout)
        elif process is not None and process.is_alive():
            process.kill()
        if process is not None:
            process.join(timeout)
            if process.is_alive():
                log.warning("engine process did not exit; killing it")
                process.kill()

    # ----- requests -----------------------------------------------------------------------------

    def submit(self, request: EngineRequest, sink: Sink) -> None:
        """Queue a request. Raises EngineBusy at capacity, EngineUnavailable if the engine
        process is gone."""
        with self._lock:
            if not self._alive:
                raise EngineUnavailable("the engine process is not running")
            capacity = self.config.max_waiting + self.config.max_batch
            rows = request.sampling.n
            if sum(self._rows.values()) + rows > capacity:
                raise EngineBusy(min(self.running, self.config.max_batch), self.waiting, capacity)
            try:
                self._commands.send(Submit(self._images.outgoing(request)))
            except (OSError, ValueError):
                self._alive = False
                raise EngineUnavailable("the engine process is not running") from None
            self._sinks[request.request_id] = sink
            self._rows[request.request_id] = rows

    def cancel(self, request_id: str) -> None:
        if self._alive:
            self._send(Cancel(request_id))

    @property
    def running(self) -> int:
        return len(self._admitted)

    @property
    def waiting(self) -> int:
        return len(self._sinks) - len(self._admitted)

    @property
    def idle(self) -> bool:
        return not self._sinks

    def cache_stats(self) -> dict[str, Any]:
        return self._call(CacheStats())

    def cache_entries(
        self, limit: int = 10, kind: str | None = None, tenant: str | None = None
    ) -> dict[str, Any]:
        """`caches.entries.entries_report`, computed in the engine process (check the
        arguments first with `caches.entries.check_query`: a failure there is a RuntimeError)."""
        return self._call(CacheEntries(limit, kind, tenant))

    def clear_caches(self) -> None:
        self._call(ClearCaches())

    def reset_caches(self) -> None:
        self._call(ResetCaches())

    def metrics_text(self) -> bytes:
        return self._call(MetricsText())

    def embed(self, call: Embed) -> EmbedResult:
        """An embedding model's `EmbedEngine.embed`, run in the engine process (blocks: call
        it off the event loop). Raises `EmbedRefused` for an input the model cannot take,
        EngineUnavailable when the engine is gone or silent past `EMBED_TIMEOUT_S`."""
        try:
            return self.embed_future(call).result(EMBED_TIMEOUT_S)
        except TimeoutError:
            raise EngineUnavailable("the engine process did not answer Embed") from None

    def embed_future(self, call: Embed) -> Future[EmbedResult]:
        """`call` sent to the engine process; the future resolves (on the reader thread) to
        its `EmbedResult`, or fails with `EmbedRefused`, or EngineUnavailable when the engine
        is gone. Holds no thread while the engine works (an event loop awaits it with
        `asyncio.wrap_future`)."""
        future: Future[EmbedResult] = Future()
        with self._lock:
            if not self._alive:
                raise EngineUnavailable("the engine process is not running")
            call_id = next(self._call_ids)
            self._futures[call_id] = future
            try:
                self._commands.send(Invoke(call_id, call))
            except (OSError, ValueError):
                self._futures.pop(call_id, None)
                raise EngineUnavailable("the engine process is not running") from None
        return future

    # ----- plumbing -----------------------------------------------------------------------------

    def _send(self, message: Command) -> None:
        with self._lock:
            try:
                self._commands.send(message)
            except (OSError, ValueError):
                self._alive = False

    def _call(self, call: Call, timeout: float = 30.0) -> Any:
        """`call` answered by the engine process (blocks; timeout in seconds). Raises
        EngineUnavailable if it is gone or silent, RuntimeError if the call failed there."""
        done, box = threading.Event(), []
        with self._lock:
            if not self._alive:
                raise EngineUnavailable("the engine process is not running")
            call_id = next(self._call_ids)
            self._calls[call_id] = (done, box)
            self._commands.send(Invoke(call_id, call))
        name = type(call).__name__
        if not done.wait(timeout) or not box:
            raise EngineUnavailable(f"the engine process did not answer {name}")
        (reply,) = box
        if not reply.ok:
            raise RuntimeError(f"{name} failed in the engine process: {reply.value}")
        return reply.value

    def _read(self) -> None:
        """Reader thread: dispatch event batches and call replies until the pipe closes."""
        try:
            while True:
                message = self._events.recv()
                if isinstance(message, Events):
                    self._dispatch(message.batch)
                elif isinstance(message, Reply):
                    with self._lock:
                        done, box = self._calls.pop(message.call_id, (None, None))
                        future = self._futures.pop(message.call_id, None)
                    if future is not None:
                        _settle(future, message)
                    if done is not None:
                        box.append(message)
                        done.set()
                elif isinstance(message, Stopped):
                    break
        except (EOFError, OSError):
            log.error("the engine process exited unexpectedly")
        finally:
            self._fail_all()

    def _dispatch(self, batch: Sequence[tuple[str, Event]]) -> None:
        for request_id, event in batch:
            with self._lock:
                sink = self._sinks.get(request_id)
                if isinstance(event, AdmittedEvent):
                    self._admitted.add(request_id)
                elif ends_request(event):
                    self._sinks.pop(request_id, None)
                    self._rows.pop(request_id, None)
                    self._admitted.discard(request_id)
            if sink is not None:
                sink(event)

    def _fail_all(self) -> None:
        with self._lock:
            self._alive = False
            sinks, self._sinks = self._sinks, {}
            self._rows.clear()
            self._admitted.clear()
            calls, self._calls = self._calls, {}
            futures, self._futures = self._futures, {}
        for future in futures.values():
            settle(future, EngineUnavailable("the engine stopped"))
        for sink in sinks.values():
            sink(ErrorEvent(ErrorKind.SHUTTING_DOWN, "the engine stopped"))
        for done, _ in calls.values():
            done.set()
        self._stopped.set()


def _settle(future: Future[Any], reply: Reply) -> None:
    """An embedding call's future from its reply: the value, or the exception it carries
    (an `EmbedRefused` crosses the pipe whole), or a failure's repr as a RuntimeError."""
    if not reply.ok:
        settle(future, RuntimeError(f"Embed failed in the engine process: {reply.value}"))
    else:
        settle(future, reply.value)
