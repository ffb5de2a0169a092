"""The models behind one endpoint: each request names one (`model`, or an alias); a model not
loaded is loaded on demand, once however many requests wait for it; loading past
`--max-loaded-models` or `--models-memory-gb` first unloads the least recently used idle,
unpinned model; an idle model unloads after its keep-alive.

Each loaded model is one engine client (by default an engine process of its own, so that
unloading returns all of its memory: the process exits). A load that fails or does not finish
in time is a 503 naming the model, with Retry-After, for the requests that waited on it; the
other models keep serving.

Event loop only (the engine calls run in worker threads); a request's end may be reported on
an engine client's thread (`ModelSlot.release`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence

from gateway.errors import APIError
from gateway.metrics import PoolMetrics
from gateway.pool.slot import ModelSlot, SlotState
from gateway.pool_config import PoolConfig

log = logging.getLogger(__name__)

# What becomes of a model once its engine has started: its prompt builder (and warm-up),
# built in a worker thread. Raises to fail the load.
Prepare = Callable[[ModelSlot], None]
REAP_INTERVAL_S = 0.25
ROOM_POLL_S = 0.05


class ModelPool:
    """The served models (`slots`, the first is the default) under `config`'s limits."""

    def __init__(
        self,
        config: PoolConfig,
        slots: Sequence[ModelSlot],
        prepare: Prepare,
        metrics: PoolMetrics,
    ) -> None:
        if not slots:
            raise ValueError("a pool needs at least one model")
        self.config = config
        self.slots = list(slots)
        self._prepare = prepare
        self._metrics = metrics
        self._names: dict[str, ModelSlot] = {}
        for slot in self.slots:
            for name in (slot.name, *slot.spec.aliases):
                self._names[name] = slot
        self._reaper: asyncio.Task[None] | None = None
        self.closed = False

    # ----- names --------------------------------------------------------------------------------

    @property
    def default(self) -> ModelSlot:
        return self.slots[0]

    def find(self, name: str) -> ModelSlot | None:
        """The model served under `name` (its served name or an alias)."""
        return self._names.get(name)

    @property
    def served_names(self) -> list[str]:
        return [slot.name for slot in self.slots]

    def loaded(self) -> list[ModelSlot]:
        return [s for s in self.slots if s.state is SlotState.LOADED]

    # ----- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> bool:
        """Load the default model and the pinned ones (a failure raises ModelLoadFailed: the
        server does not start), then start unloading idle models after their keep-alive.
        False when `stop` came first (a shutdown signal while the models loaded)."""
        first = [self.default, *(s for s in self.slots[1:] if s.spec.pinned)]
        for slot in first:
            await self.load(slot)
            if self.closed:
                return False
            if slot.state is not SlotState.LOADED:
                raise ModelLoadFailed(f"model {slot.name!r} did not load: {slot.last_error}")
        self._reaper = asyncio.get_running_loop().create_task(self._reap())
        return True

    async def stop(self) -> None:
        """Unload every model (requests still running end with a shutting-down error)."""
        self.closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for slot in self.slots:
            if slot.task is not None:
                slot.task.cancel()
                with contextlib.suppress(BaseException):
                    await slot.task
        await asyncio.gather(*(self._stop_engine(s) for s in self.slots))

    # ----- requests -----------------------------------------------------------------------------

    async def acquire(self, slot: ModelSlot) -> ModelSlot:
        """`slot` loaded and held by the caller (who must `release` it, or hand the hold to
        its request's sink: `ModelSlot.releasing`). Loads it if needed, waiting at most
        --model-load-timeout; APIError 503 naming the model when it cannot be loaded."""
        slot.waiting += 1
        try:
            return await self._acquire(slot, time.monotonic() + self.config.load_timeout_s)
        finally:
            slot.waiting -= 1

    async def _acquire(self, slot: ModelSlot, deadline: float) -> ModelSlot:
        while True:
            if self.closed:
                raise _unavailable(slot, "the server is shutting down")
            if slot.state is SlotState.LOADED and slot.task is None:
                if self._crashed(slot):  # its engine died: load it again (nothing holds it)
                    log.warning("model %r: its engine is gone; loading it again", slot.name)
                    await self._unload(slot, "crashed")
                    continue
                slot.hold()  # (no await since the check: an eviction cannot come between)
                return slot
            if slot.task is None:  # unloaded: load it (one load for every waiting request)
                self._run(slot, "load", self._load(slot, deadline))
            task, kind = slot.task, slot.task_kind
            assert task is not None
            try:
                await asyncio.wait_for(asyncio.shield(task), max(deadline - time.monotonic(), 0))
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # this request was cancelled (its client left)
                continue  # the load was (the pool stops): the loop says so with a 503
            except TimeoutError:
                waiting = kind == "load" and slot.state is SlotState.UNLOADED  # for room
                why = self._no_room(slot) if waiting else "it did not load in time"
                raise _unavailable(slot, f"{why} (--model-load-timeout)") from None
            if kind == "load" and slot.last_error is not None:
                raise _unavailable(slot, slot.last_error)

    @staticmethod
    def _crashed(slot: ModelSlot) -> bool:
        """Its engine is gone (a crashed engine process) and no request holds it: requests
        that did get an error; the next one reloads the model instead of a 503."""
        engine = slot.engine
        return engine is not None and not engine.alive and slot.holders == 0

    async def load(self, slot: ModelSlot) -> None:
        """Load `slot` now (admin endpoint, start-up); returns once it is loaded or failed
        (then `slot.last_error` says why)."""
        with contextlib.suppress(APIError):
            self.release_now(await self.acquire(slot))

    @staticmethod
    def release_now(slot: ModelSlot) -> None:
        """Release a hold taken by `acquire` without a request (keeps the model's keep-alive)."""
        slot.release()

    async def unload(self, slot: ModelSlot, reason: str = "admin") -> bool:
        """Unload `slot` once its requests are done; False when it is not loaded."""
        while slot.task is not None:
            await asyncio.shield(slot.task)
        if slot.state is not SlotState.LOADED:
            return False
        while not slot.idle or slot.task is not None:
            await asyncio.sleep(ROOM_POLL_S)
            if slot.state is not SlotState.LOADED:
                return False
        await self._unload(slot, reason)
        return True

    def _run(self, slot: ModelSlot, kind: str, work: Awaitable[None]) -> asyncio.Task[None]:
        """Run `work` as `slot`'s one task under way (a load or an unload)."""

        async def run() -> None:
            try:
                await work
            finally:
                slot.task, slot.task_kind = None, None

        slot.task_kind = kind
        slot.task = asyncio.get_running_loop().create_task(run())
        return slot.task

    # ----- loading ------------------------------------------------------------------------------

    async def _load(self, slot: ModelSlot, deadline: float) -> None:
        """Make room, start the engine, prepare the prompt side; on failure record why and
        leave the model unloaded (its engine stopped)."""
        abandoned = threading.Event()
        try:
            await self._make_room(slot, deadline)
            slot.state = SlotState.LOADING
            slot.last_error = None
            started = time.perf_counter()
            log.info("loading model %r (%s)", slot.name, slot.config.model)
            await asyncio.to_thread(self._start_engine, slot, deadline, abandoned)
            seconds = time.perf_counter() - started
            slot.state = SlotState.LOADED
            self._metrics.loaded(slot.name, seconds)
            log.info("model %r loaded in %.1f s", slot.name, seconds)
        except asyncio.CancelledError:  # the pool stops: the worker thread may still load
            abandoned.set()
            await self._stop_engine(slot)
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of a load is that model's 503
            slot.last_error = str(exc) or type(exc).__name__
            self._metrics.load_failed(slot.name)
            log.error("model %r failed to load: %s", slot.name, slot.last_error)
            await self._stop_engine(slot)

    def _start_engine(self, slot: ModelSlot, deadline: float, abandoned: threading.Event) -> None:
        """Worker thread: start the engine (the model loads there), then its prompt side.

        `abandoned` is set when the load's task was cancelled (the pool stops) while this
        thread, which cannot be interrupted, went on: the engine it started is then stopped
        here, since the task's own clean-up may have run before the engine existed."""
        engine = slot.make_engine(slot.config)
        if abandoned.is_set():
            return
        slot.engine = engine
        try:
            engine.start(max(deadline - time.monotonic(), 1.0))
        finally:
            if abandoned.is_set():
                log.info("model %r: the pool stopped while it loaded; stopping it", slot.name)
                engine.stop()
        if not abandoned.is_set():
            self._prepare(slot)

    async def _make_room(self, slot: ModelSlot, deadline: float) -> None:
        """Unload least recently used idle, unpinned models until `slot` fits the limits;
        waits for one to become idle (until `deadline`) when none is."""
        while True:
            if self._fits(slot):
                return
            victims = [
                s
                for s in self.slots
                if s is not slot
                and s.idle
                and not s.spec.pinned
                and s.task is None
                and not s.waiting
            ]
            if victims:
                victim = min(victims, key=lambda s: s.last_used)
                log.info("evicting model %r to load %r", victim.name, slot.name)
                await self._unload(victim, "evicted")
                continue
            if time.monotonic() >= deadline:
                raise RuntimeError(self._no_room(slot))
            await asyncio.sleep(ROOM_POLL_S)

    def _fits(self, slot: ModelSlot) -> bool:
        """`slot` loaded beside the models that hold memory now stays within the limits."""
        holding = [s for s in self.slots if s is not slot and s.state is not SlotState.UNLOADED]
        cap, budget = self.config.max_loaded, self.config.memory_bytes
        if cap and len(holding) + 1 > cap:
            return False
        return not budget or sum(s.footprint for s in holding) + slot.footprint <= budget

    def _no_room(self, slot: ModelSlot) -> str:
        busy = [s.name for s in self.slots if s.state is not SlotState.UNLOADED and s is not slot]
        return (
            f"no room to load it: the loaded models {busy} are busy or pinned "
            "(--max-loaded-models / --models-memory-gb); retry shortly"
        )

    # ----- unloading ----------------------------------------------------------------------------

    async def _unload(self, slot: ModelSlot, reason: str) -> None:
        """Unload `slot` now (as its task: requests for it wait, then load it again)."""

        async def unload() -> None:
            slot.state = SlotState.UNLOADING
            log.info("unloading model %r (%s)", slot.name, reason)
            await self._stop_engine(slot)
            self._metrics.unloaded(slot.name, reason)

        await asyncio.shield(self._run(slot, "unload", unload()))

    async def _stop_engine(self, slot: ModelSlot) -> None:
        engine, slot.engine, slot.prompts = slot.engine, None, None
        if engine is not None:
            await asyncio.to_thread(engine.stop)
        if slot.state is not SlotState.UNLOADED:
            slot.state = SlotState.UNLOADED
            self._metrics.set_loaded(slot.name, False)

    async def _reap(self) -> None:
        """Unload models idle past their keep-alive, a few times a second."""
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            now = time.monotonic()
            for slot in self.slots:
                if slot.expired(now):
                    await self._unload(slot, "idle")


class ModelLoadFailed(RuntimeError):
    """A model the server must start with did not load; the message says which and why (the
    server logs it as one line: gateway.server)."""


def _unavailable(slot: ModelSlot, why: str) -> APIError:
    """503 naming the model (the other models keep serving), Retry-After a few seconds."""
    return APIError(
        503,
        f"the model `{slot.name}` is not available: {why}",
        "server_error",
        "model",
        "model_unavailable",
        headers={"Retry-After": "5"},
    )
