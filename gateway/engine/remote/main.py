"""The engine process's side of `gateway.engine.remote.client`: run an `Engine`, serve the command
pipe, ship events once per step (the `Engine` prepares image pixels itself:
`gateway.engine.pixels`).

See `gateway.engine.remote.client` for the wire protocol. Everything here runs in the spawned
engine process.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from gateway.config import EngineConfig
from gateway.engine.client import EngineBusy, EngineClient
from gateway.engine.embed.request import Embed
from gateway.engine.image_store import ImageStore
from gateway.engine.request import (
    EngineRequest,
    ErrorEvent,
    ErrorKind,
    Event,
    Sink,
)
from gateway.engine.wire import (
    Call,
    Cancel,
    Command,
    Configure,
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

if TYPE_CHECKING:  # MLX: imported in the engine process only
    from gateway.engine.core import Engine
    from gateway.engine.embed.engine import EmbedEngine

log = logging.getLogger(__name__)


def engine_process_main(
    config: EngineConfig | None, log_level: str, commands: Connection, events: Connection
) -> None:
    """Entry point of the engine process: run an Engine, serve the command pipe. `config`
    None: a spare (`gateway.engine.remote.spare`): import what an engine needs, then wait
    for the model to serve (`Configure`; a `Stop` or a closed pipe ends it)."""
    # (SIGINT and SIGTERM are ignored already: `process_entry`, this process's target.)
    from gateway.engine.core import Engine
    from gateway.engine.embed.engine import EmbedEngine
    from gateway.metrics import Metrics

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if config is None:
        config = _await_model(commands)
        if config is None:
            return
    outbox = _Outbox(events)
    engine: Engine | EmbedEngine
    if _embeds(config):
        engine = EmbedEngine(config)
    else:
        engine = Engine(config, Metrics())
        engine.on_events = outbox.flush
    try:
        engine.start()
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        # the cause's words: the client says "model failed to load" itself
        outbox.send(LoadFailed(str(exc.__cause__ or exc)))
        outbox.close()
        return
    model = engine.model
    if isinstance(engine, EmbedEngine):
        prompt: Any = model
    else:
        prompt = None if model is None else model.shipped_prompt()
    outbox.send(Ready(engine.on_gpu, prompt, engine.device_memory))
    images = ImageStore(keep_images=True)
    while True:
        try:
            message: Command = commands.recv()
        except (EOFError, OSError):  # the HTTP process is gone
            message = Stop()
        match message:
            case Submit(request):
                request = images.incoming(request)
                _submit(engine, request, outbox.sink(request.request_id), outbox.flush)
            case Cancel(request_id):
                engine.cancel(request_id)
            case Invoke(call_id, Embed() as call) if isinstance(engine, EmbedEngine):
                _embed(engine, call_id, call, outbox)
            case Invoke(call_id, call):
                outbox.send(_reply(engine, call_id, call))
            case Stop():
                engine.stop()
                outbox.flush()
                outbox.send(Stopped())
                outbox.close()
                return


def _embeds(config: EngineConfig) -> bool:
    """The model embeds or reranks (`EmbedEngine`), read without MLX."""
    from gateway.processors.checkpoint import serving_task

    try:
        return serving_task(config.model, config.task) != "chat"
    except ValueError:  # (the HTTP process refused it before starting this one)
        return False


def _embed(engine: EmbedEngine, call_id: int, call: Embed, outbox: _Outbox) -> None:
    """Queue an embedding call; its Reply (the result, or the exception to raise there) is
    sent from the engine thread when its batch is done, so calls batch together."""

    def done(outcome: object) -> None:
        outbox.send(Reply(call_id, True, outcome))

    try:
        engine.embed_async(call, done)
    except Exception as exc:  # noqa: BLE001 - reported to the caller
        outbox.send(Reply(call_id, True, exc))

def _await_model(commands: Connection) -> EngineConfig | None:
    """A spare's wait: the model loaders imported now (what a load spends most of its first
    second on), then the `Configure` naming the model; None when told to stop instead."""
    import mlx_vlm  # noqa: F401

    import gateway.engine.families.registry  # noqa: F401 - mlx, mlx-lm, mlx-vlm, the families

    try:
        message = commands.recv()
    except (EOFError, OSError):  # the HTTP process is gone
        return None
    return message.config if isinstance(message, Configure) else None


def _submit(
    engine: EngineClient, request: EngineRequest, sink: Sink, flush: Callable[[], None]
) -> None:
    """Hand `request` to the engine (which prepares its pixels); a refusal is the request's
    error (the HTTP process checks capacity and `n` first, so this is rare)."""
    try:
        engine.submit(request, sink)
    except (EngineBusy, ValueError) as refused:
        sink(ErrorEvent(ErrorKind.INTERNAL, f"{refused}"))
        flush()


def _reply(engine: EngineClient, call_id: int, call: Call) -> Reply:
    """The answer to one call; a failure is the caller's (its repr), never the loop's."""
    try:
        return Reply(call_id, True, answer(engine, call))
    except Exception as exc:  # noqa: BLE001 - reported to the caller
        return Reply(call_id, False, repr(exc))


class _Outbox:
    """Events of the engine process, buffered per step and shipped as one message.

    Shipping is a sender thread's: the engine thread's `flush` only hands the step's batch
    over (pickling it and writing the pipe took ~0.35 ms of a one-row step's ~10 ms there,
    measured on the CPU machine: issue 41), and the sender does it while the engine thread
    runs the next step (MLX releases the GIL while it computes). Every message leaves in the
    order it was handed over; `close` returns once all have left."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        self._pending: list[tuple[str, Event]] = []
        self._queue: queue.SimpleQueue[Notice | None] = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_all, name="engine-outbox", daemon=True)
        self._sender.start()

    def sink(self, request_id: str) -> Sink:
        def put(event: Event) -> None:
            with self._lock:
                self._pending.append((request_id, event))

        return put

    def flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
            if batch:
                self._queue.put(Events(tuple(batch)))

    def send(self, message: Notice) -> None:
        with self._lock:  # after the events flushed before it
            self._queue.put(message)

    def close(self) -> None:
        """Ship what is queued, then stop the sender (the last call on this outbox)."""
        self._queue.put(None)
        self._sender.join()

    def _send_all(self) -> None:
        while (message := self._queue.get()) is not None:
            try:
                self._connection.send(message)
            except (OSError, ValueError):
                pass  # the HTTP process is gone; the command loop sees EOF and stops
