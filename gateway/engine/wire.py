"""Every message that crosses a thread or process boundary around an engine, as frozen
dataclasses, and `answer`, which applies a typed call to an engine.

Three boundaries use them:

- the engine thread's inbox (`gateway.engine.core.Engine`), applied on the engine thread in
  arrival order: `Message` = Enqueue | Cancel | Stop | ResetCaches;
- the engine process's pipes (`gateway.engine.remote`), pickled over `multiprocessing`
  connections: HTTP -> engine `Command` = Submit | Cancel | Stop | Invoke(call_id, Call)
  (and a spare engine process's first message, `Configure`);
  engine -> HTTP `Notice` = Ready | LoadFailed | Events | Reply | Stopped. Events are shipped
  once per engine step, as one `Events` message;
- the Ray Serve replicas (`gateway.cluster`): a replica answers a `Call` and its `info`
  (`ReplicaInfo`) and streams `Events` batches.

A `Call` is one engine method by type (never by name): the receiving side dispatches it with
`answer`, so a caller can only reach what is listed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.config import EngineConfig
from gateway.engine.embed.request import Embed, EmbedCard
from gateway.engine.request import EngineRequest, Event, Sink
from gateway.processors.processor import PromptProcessor

if TYPE_CHECKING:
    from gateway.engine.client import EngineClient

# ----- the engine thread's inbox ----------------------------------------------------------------


@dataclass(frozen=True)
class Enqueue:
    """Engine thread: take `request` in; its events go to `sink` (called on that thread)."""

    request: EngineRequest
    sink: Sink


@dataclass(frozen=True)
class Cancel:
    """Drop a request wherever it is (inbox and pipe)."""

    request_id: str


@dataclass(frozen=True)
class Stop:
    """Finish the last step, fail what is in flight, stop (inbox and pipe)."""


@dataclass(frozen=True)
class Configure:
    """The model a spare engine process (started without one, its imports done) is to load
    and serve: the first message it gets (`gateway.engine.remote.spare`)."""

    config: EngineConfig


# ----- calls: one engine method each (pipe and Ray) ---------------------------------------------


@dataclass(frozen=True)
class CacheStats:
    """`EngineClient.cache_stats`; answers the stats dict."""


@dataclass(frozen=True)
class CacheEntries:
    """`EngineClient.cache_entries`; answers the entries report."""

    limit: int = 10
    kind: str | None = None
    tenant: str | None = None  # only this tenant's entries (None: all)


@dataclass(frozen=True)
class ClearCaches:
    """`EngineClient.clear_caches`; answers None."""


@dataclass(frozen=True)
class ResetCaches:
    """`EngineClient.reset_caches`; answers None. Also the engine thread's inbox message that
    applies it (in order with the submits before it)."""


@dataclass(frozen=True)
class MetricsText:
    """`EngineClient.metrics_text`; answers the Prometheus text (bytes)."""


# `Embed` (gateway.engine.embed.request) is a call too: an embedding engine's one job. The
# engine process answers it from the engine thread when its batch is done (Reply's value:
# the EmbedResult, or the EmbedRefused / exception to raise).
Call = CacheStats | CacheEntries | ClearCaches | ResetCaches | MetricsText | Embed
Message = Enqueue | Cancel | Stop | ResetCaches


def answer(engine: EngineClient, call: Call) -> Any:
    """Apply `call` to `engine` on the calling thread; its result, or the engine's exception."""
    match call:
        case CacheStats():
            return engine.cache_stats()
        case CacheEntries(limit, kind, tenant):
            return engine.cache_entries(limit, kind, tenant)
        case ClearCaches():
            return engine.clear_caches()
        case ResetCaches():
            return engine.reset_caches()
        case MetricsText():
            return engine.metrics_text()
        case Embed():
            embed = getattr(engine, "embed", None)  # only an embedding engine has it
            if embed is None:
                raise TypeError("this model is not an embedding model")
            return embed(call)
    raise TypeError(f"not an engine call: {call!r}")


# ----- the engine process's pipes ---------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    """HTTP -> engine: run `request` (its pixels may be left out: see ImageStore); its events
    come back in `Events` under its request_id."""

    request: EngineRequest


@dataclass(frozen=True)
class Invoke:
    """HTTP -> engine: answer `call` with a `Reply` carrying the same `call_id`."""

    call_id: int
    call: Call


Command = Submit | Cancel | Stop | Invoke


@dataclass(frozen=True)
class Ready:
    """Engine -> HTTP, first: the model is loaded (`on_gpu`: it computes on a GPU); `prompt`
    is its prompt side for the HTTP process (`ModelFamily.shipped_prompt`: a
    `PromptProcessor`, no MLX; an embedding model's `EmbedCard`), None for a family not
    split yet; `device_memory`: the bytes
    its device may use (`Engine.device_memory`; None: not reported), so the HTTP process
    bounds the context without asking MLX."""

    on_gpu: bool
    prompt: PromptProcessor | EmbedCard | None = None
    device_memory: int | None = None


@dataclass(frozen=True)
class LoadFailed:
    """Engine -> HTTP, first and last: the model did not load (`message` says why)."""

    message: str


@dataclass(frozen=True)
class Events:
    """Engine -> HTTP (and replica -> ingress): the events ready at once, about one batch per
    engine step, as (request_id, event) pairs in emission order. Pairs, not objects: a batch
    is pickled every step, and one object per token per request would cost CPU there."""

    batch: tuple[tuple[str, Event], ...]


@dataclass(frozen=True)
class Reply:
    """Engine -> HTTP: the answer to `Invoke(call_id, ...)`; `ok` False: `value` is the
    failure's repr (a str)."""

    call_id: int
    ok: bool
    value: Any


@dataclass(frozen=True)
class Stopped:
    """Engine -> HTTP, last: the engine stopped after a `Stop`; every event was sent."""


Notice = Ready | LoadFailed | Events | Reply | Stopped


# ----- the Ray replicas -------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaInfo:
    """A replica's `info`: who and how busy it is (also the ingress's readiness probe)."""

    slot: int
    pid: int
    host: str
    alive: bool
    on_gpu: bool
    running: int
    waiting: int
    uptime_s: float  # seconds since the replica was constructed, 0.1 s resolution
    device_memory: int | None = None  # bytes its engine's device may use (None: not reported)
