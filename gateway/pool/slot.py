"""One configured model in the pool: its settings, its state (unloaded, loading, loaded,
unloading), and while loaded its engine client and prompt builder; how many requests hold
it and when it was last used.

Threads: the pool changes `state`, `engine`, `prompts` and `task` on the event loop only.
`hold` runs on the event loop; `release` may run on an engine client's thread (a request
ends in its sink), so the counters are guarded by a lock.
"""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.config import EngineConfig
from gateway.engine.client import EngineClient
from gateway.engine.request import Event, Sink, ends_request
from gateway.pool_config import ModelSpec

if TYPE_CHECKING:
    from gateway.frontend.prompt import PromptBuilder

# Builds (does not start) the engine client of one model's settings.
EngineFactory = Callable[[EngineConfig], EngineClient]


class SlotState(enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"


class ModelSlot:
    """A model the server offers (`spec`), served with `config`. See the module doc.

    `footprint` (bytes) is what it takes loaded as the memory rule counts it: its weights
    plus its cache budgets. `kind`: what the model does, read from its checkpoint without
    loading it ("chat", or "embed": /v1/embeddings only), so a request to the wrong route is
    answered before anything loads."""

    def __init__(
        self,
        spec: ModelSpec,
        config: EngineConfig,
        keep_alive_s: float,
        footprint: int,
        make_engine: EngineFactory,
        kind: str = "chat",
    ) -> None:
        self.spec = spec
        self.kind = kind  # "chat" or "embed" (an embedding model), known before it loads
        self.name = spec.name
        self.config = config
        self.footprint = footprint
        self.make_engine = make_engine
        self.default_keep_alive_s = keep_alive_s
        self.state = SlotState.UNLOADED
        self.engine: EngineClient | None = None
        self.prompts: PromptBuilder | None = None
        self.task: asyncio.Task[None] | None = None  # the load or unload under way
        self.task_kind: str | None = None  # "load" or "unload"
        # Requests inside `ModelPool.acquire` (waiting for a load): never evicted nor
        # reaped from under them between the load's end and their hold (event loop only).
        self.waiting = 0
        self.last_error: str | None = None  # why the last load failed
        self.context_length: int | None = None  # known once loaded
        self.card: dict[str, object] = {}  # the family's card (`PromptSide.describe`)
        self._lock = threading.Lock()
        self._holders = 0
        self._last_used = time.monotonic()
        self._keep_alive_s = keep_alive_s  # of the request that ended last (or the default)

    # ----- use (any thread) ----------------------------------------------------------------------

    def hold(self) -> None:
        """A request uses the model from now until `release` (it is then never evicted)."""
        with self._lock:
            self._holders += 1
            self._last_used = time.monotonic()

    def release(self, keep_alive_s: float | None = None) -> None:
        """A request is done with the model; `keep_alive_s` (the request's own, None: the
        model's) is how long the model then stays loaded once idle."""
        with self._lock:
            self._holders = max(0, self._holders - 1)
            self._last_used = time.monotonic()
            self._keep_alive_s = self.default_keep_alive_s if keep_alive_s is None else keep_alive_s

    def releasing(self, sink: Sink, keep_alive_s: float | None) -> Sink:
        """`sink` that releases the model once when the request's last event passes."""
        done = threading.Event()

        def forward(event: Event) -> None:
            if ends_request(event) and not done.is_set():
                done.set()
                self.release(keep_alive_s)
            sink(event)

        return forward

    @property
    def holders(self) -> int:
        with self._lock:
            return self._holders

    @property
    def last_used(self) -> float:
        """time.monotonic() of the last hold or release."""
        with self._lock:
            return self._last_used

    @property
    def idle(self) -> bool:
        """Loaded, and no request holds it or runs in its engine."""
        engine = self.engine
        return (
            self.state is SlotState.LOADED and self.holders == 0 and (engine is None or engine.idle)
        )

    def expired(self, now: float) -> bool:
        """Idle past its keep-alive (never for a pinned model or a keep-alive of -1)."""
        with self._lock:
            keep, last = self._keep_alive_s, self._last_used
        if self.spec.pinned or keep < 0 or self.task is not None or self.waiting:
            return False
        return self.idle and now - last >= keep

    @property
    def shown_state(self) -> str:
        """The state /v1/models shows: a load waiting for room is already `loading`."""
        if self.state is SlotState.UNLOADED and self.task is not None:
            return SlotState.LOADING.value
        return self.state.value
