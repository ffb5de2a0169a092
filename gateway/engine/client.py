"""The engine's client contract: what the HTTP side (app, pipeline, warm-up, web pages) may
use of an engine, and the two exceptions it must expect.

Three classes conform (checked structurally by tests/gateway/engine/test_client.py):

- `gateway.engine.core.Engine`: the engine thread in this process;
- `gateway.engine.remote.client.RemoteEngine`: a proxy of an engine in its own process;
- `gateway.cluster.routed_engine.RoutedEngine`: a router over Ray Serve engine replicas.

Code that takes an engine should annotate it `EngineClient` and use nothing else of it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from gateway.config import EngineConfig
from gateway.engine.request import EngineRequest, Sink
from gateway.processors.processor import PromptSide


class EngineBusy(Exception):
    """`submit` refuses a request: every row and queue slot is taken (nothing was started).
    Retry shortly; the HTTP edge answers 429 (OpenAI) or 529 (Anthropic)."""

    def __init__(self, running: int, waiting: int, limit: int | None = None) -> None:
        held = f"{running} running, {waiting} queued"
        if limit is not None:  # the queue counts requests about to take a free row too
            held += f": it holds at most {limit} requests (--max-batch + --max-waiting)"
        super().__init__(f"the server is at capacity ({held})")
        self.running = running
        self.waiting = waiting


class EngineUnavailable(Exception):
    """The engine is gone (its process crashed or stopped, no replica is up, or a call got
    no answer in time); the server cannot serve. The HTTP edge answers 503."""


@runtime_checkable
class EngineClient(Protocol):
    """An engine as the HTTP side sees it.

    Thread safety: every member may be used from any thread. Sinks passed to `submit` are
    called on a thread of the engine client (the engine thread, or a reader thread of the
    proxy) and must never block.

    Calls that may cross a process (`cache_stats`, `cache_entries`, `clear_caches`,
    `reset_caches`, `metrics_text`) block for a round trip; call them off the event loop.
    They raise EngineUnavailable when the engine is gone or does not answer, and RuntimeError
    when the engine answered with a failure.
    """

    config: EngineConfig
    """The settings the engine runs with (capacity: `max_batch + max_waiting`)."""

    @property
    def model(self) -> PromptSide | None:
        """The model's prompt side (template, tokenizer, grids and layouts) once started,
        else None. The in-process engine gives its loaded family; proxies hold a
        `PromptProcessor` (no MLX) or, for a family not split yet, the family with its weights
        unread: use it to build prompts, never to compute."""
        ...

    @property
    def on_gpu(self) -> bool:
        """The model computes on a GPU (known once started; False before)."""
        ...

    @property
    def device_memory(self) -> int | None:
        """Bytes the model's device may use (its GPU's, else the engine machine's RAM), as the
        engine reports it once started (`engine/device_memory.py`); None before, or when the
        device does not say. The served context is bounded by it (`frontend/context.py`)."""
        ...

    def start(self, timeout: float | None = None) -> None:
        """Load the model and start serving; blocks until ready (timeout in seconds, None:
        no limit). Raises TimeoutError, or RuntimeError naming why the model did not load."""
        ...

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (blocks at most about `timeout` seconds per stage). Requests in flight
        end with an ErrorEvent of kind SHUTTING_DOWN. Safe to call twice or before start."""
        ...

    def submit(self, request: EngineRequest, sink: Sink) -> None:
        """Queue `request`; its events go to `sink`: one AdmittedEvent (unless it fails first),
        TokenEvents, then exactly one FinishEvent or ErrorEvent. Raises EngineBusy at
        capacity and EngineUnavailable when the engine is gone (in both, nothing started and
        `sink` is never called)."""
        ...

    def cancel(self, request_id: str) -> None:
        """Stop a request wherever it is; it then ends with a `cancelled` FinishEvent (unless
        it ended already). Idempotent; an unknown id, or a gone engine, is ignored. Never
        raises."""
        ...

    @property
    def running(self) -> int:
        """Requests holding a row (admitted, not finished)."""
        ...

    @property
    def waiting(self) -> int:
        """Requests submitted and not yet admitted."""
        ...

    @property
    def idle(self) -> bool:
        """Nothing submitted is unfinished."""
        ...

    @property
    def alive(self) -> bool:
        """Serving: started, model loaded, not stopped (what /health reports)."""
        ...

    def cache_stats(self) -> dict[str, Any]:
        """The caches' counters as JSON-able dicts, one per cache (vision, prefix, and once
        loaded grammar and disk). Sizes in bytes."""
        ...

    def cache_entries(
        self, limit: int = 10, kind: str | None = None, tenant: str | None = None
    ) -> dict[str, Any]:
        """`caches.entries.entries_report`: the `limit` largest and most-hit entries of the
        `kind` cache ("vision" or "prefix"; None: both), of `tenant`'s scope only unless it is
        None. Validate the arguments first with `caches.entries.check_query`."""
        ...

    def clear_caches(self) -> None:
        """Empty every cache, the disk tier included (the next request is answered cold)."""
        ...

    def reset_caches(self) -> None:
        """Replace the caches by empty ones with zeroed counters (after the warm-up); applied
        in order with the submits before it."""
        ...

    def metrics_text(self) -> bytes:
        """The engine's Prometheus metrics, text exposition format (UTF-8)."""
        ...
