"""The model pool (gateway.pool.pool) over fake engines: no MLX, no processes.

Pinned: a burst of requests for an unloaded model loads it once; loading past
--max-loaded-models (or --models-memory-gb) evicts the least recently used idle model and
never one a request holds or a pinned one; with no room the request gets a 503 naming its
model (Retry-After) once the load timeout passes; a model whose load fails gives a 503 naming
it and the reason while the others serve, and is tried again on the next request; keep-alive
(the model's, the server's, a request's) unloads an idle model, -1 never; aliases reach their
model; a model whose engine died loads again for the next request; the metrics count
loads, failures and unloads; a shutdown during a load leaves no engine running.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.config import EngineConfig
from gateway.errors import APIError
from gateway.metrics import PoolMetrics
from gateway.pool.pool import ModelPool
from gateway.pool.slot import ModelSlot, SlotState
from gateway.pool_config import ModelSpec, PoolConfig


class FakeEngine:
    """An engine client whose start takes `load_s` (or raises `fails`); counts the engines
    alive at once across a test (`Lab`)."""

    def __init__(self, lab: Lab, config: EngineConfig) -> None:
        self.lab, self.config = lab, config
        self.model = object()
        self.idle, self.alive = True, False

    def start(self, timeout: float | None = None) -> None:
        name = self.config.served_model_name
        with self.lab.lock:
            self.lab.starts[name] = self.lab.starts.get(name, 0) + 1
        time.sleep(self.lab.load_s.get(name, 0.0))
        if name in self.lab.fails:
            raise RuntimeError(f"model failed to load: {self.lab.fails[name]}")
        with self.lab.lock:
            self.alive = True
            self.lab.alive += 1
            self.lab.most_alive = max(self.lab.most_alive, self.lab.alive)

    def stop(self, timeout: float = 10.0) -> None:
        with self.lab.lock:
            if self.alive:
                self.lab.alive -= 1
                self.lab.stopped.append(self.config.served_model_name)
            self.alive = False


class Lab:
    """What the fake engines of one test share."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: dict[str, int] = {}
        self.load_s: dict[str, float] = {}
        self.fails: dict[str, str] = {}
        self.alive = 0
        self.most_alive = 0
        self.stopped: list[str] = []  # engines stopped while alive, in order
        self.registry = CollectorRegistry()

    def pool(self, specs: list[ModelSpec], **limits: Any) -> ModelPool:
        config = PoolConfig(**{"load_timeout_s": 5.0, **limits})
        slots = [
            ModelSlot(
                spec,
                EngineConfig(spec.path, spec.name),
                config.keep_alive_of(spec),
                int(spec.path.rsplit("-", 1)[-1]) if spec.path[-1].isdigit() else 0,
                lambda c: FakeEngine(self, c),  # type: ignore[arg-type, return-value]
            )
            for spec in specs
        ]
        return ModelPool(config, slots, _prepare, PoolMetrics(self.registry))

    def metric(self, text: str) -> float:
        for line in generate_latest(self.registry).decode().splitlines():
            if line.startswith(text + " "):
                return float(line.split()[-1])
        return 0.0


def _prepare(slot: ModelSlot) -> None:
    slot.prompts = object()  # type: ignore[assignment]


def _run(work: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(work())


def _specs(*names: str, **fields: Any) -> list[ModelSpec]:
    return [ModelSpec(n, f"/models/{n}", **fields) for n in names]


def test_a_burst_for_an_unloaded_model_loads_it_once() -> None:
    lab = Lab()
    lab.load_s["b"] = 0.3
    pool = lab.pool(_specs("a", "b"))

    async def work() -> list[ModelSlot]:
        await pool.start()
        b = pool.find("b")
        assert b is not None and b.state is SlotState.UNLOADED
        held = await asyncio.gather(*(pool.acquire(b) for _ in range(8)))
        assert b.holders == 8 and b.state is SlotState.LOADED
        await pool.stop()
        return held

    held = _run(work)
    assert len({id(s) for s in held}) == 1
    assert lab.starts == {"a": 1, "b": 1}
    assert lab.metric('vision_gateway_model_loads_total{model="b"}') == 1


def test_loading_past_the_limit_evicts_the_least_recently_used_idle_model() -> None:
    lab = Lab()
    pool = lab.pool(_specs("a", "b", "c"), max_loaded=2)

    async def work() -> None:
        await pool.start()  # a
        a, b, c = (pool.find(n) for n in "abc")
        assert a is not None and b is not None and c is not None
        for slot in (b, a):  # b loads; a is used after b: b is the least recently used
            slot.release() if await pool.acquire(slot) else None
        await pool.acquire(c)
        assert (a.state, b.state, c.state) == (
            SlotState.LOADED,
            SlotState.UNLOADED,
            SlotState.LOADED,
        )
        await pool.stop()

    _run(work)
    assert lab.most_alive == 2 and lab.alive == 0
    assert lab.metric('vision_gateway_model_unloads_total{model="b",reason="evicted"}') == 1


def test_a_held_or_pinned_model_is_never_evicted_and_no_room_is_a_503() -> None:
    lab = Lab()
    specs = [*_specs("a", pinned=True), *_specs("b", "c")]
    pool = lab.pool(specs, max_loaded=2, load_timeout_s=0.5)

    async def work() -> APIError:
        await pool.start()
        b, c = pool.find("b"), pool.find("c")
        assert b is not None and c is not None
        await pool.acquire(b)  # held: a request is running on it
        with pytest.raises(APIError) as refused:
            await pool.acquire(c)
        assert b.state is SlotState.LOADED and pool.default.state is SlotState.LOADED
        b.release()  # the request ends: now c can load, evicting b
        await pool.acquire(c)
        assert b.state is SlotState.UNLOADED
        await pool.stop()
        return refused.value

    error = _run(work)
    assert error.status == 503 and error.code == "model_unavailable" and error.param == "model"
    assert "`c`" in error.message and "--max-loaded-models" in error.message
    assert error.headers == {"Retry-After": "5"}


def test_the_memory_budget_counts_each_models_footprint() -> None:
    """Footprints 6, 5 and 4 bytes (the fake paths' suffixes) under a 10-byte budget: a and c
    fit together, b evicts whichever is idle and least recent."""
    lab = Lab()
    specs = [ModelSpec(n, f"/models/{n}-{size}") for n, size in (("a", 6), ("b", 5), ("c", 4))]
    pool = lab.pool(specs)
    pool.config = PoolConfig(memory_gb=10 / 2**30, load_timeout_s=5.0)

    async def work() -> None:
        await pool.start()
        a, b, c = (pool.find(n) for n in "abc")
        assert a is not None and b is not None and c is not None
        (await pool.acquire(c)).release()
        assert a.state is SlotState.LOADED and c.state is SlotState.LOADED
        (await pool.acquire(b)).release()  # 6 + 4 + 5 > 10: a (least recent) goes
        assert a.state is SlotState.UNLOADED and c.state is SlotState.LOADED
        await pool.stop()

    _run(work)


def test_a_failed_load_is_a_503_naming_it_while_the_others_serve() -> None:
    lab = Lab()
    lab.fails["broken"] = "no weights here"
    pool = lab.pool(_specs("a", "broken"))

    async def work() -> APIError:
        await pool.start()
        broken = pool.find("broken")
        assert broken is not None
        with pytest.raises(APIError) as refused:
            await pool.acquire(broken)
        (await pool.acquire(pool.default)).release()  # the other model still serves
        del lab.fails["broken"]  # fixed: the next request tries again
        await pool.acquire(broken)
        await pool.stop()
        return refused.value

    error = _run(work)
    assert error.status == 503 and "`broken`" in error.message
    assert "no weights here" in error.message
    assert lab.starts["broken"] == 2
    assert lab.metric('vision_gateway_model_load_failures_total{model="broken"}') == 1


def test_a_slow_load_times_out_with_a_503() -> None:
    lab = Lab()
    lab.load_s["slow"] = 1.0
    pool = lab.pool(_specs("a", "slow"), load_timeout_s=0.2)

    async def work() -> APIError:
        await pool.start()
        slow = pool.find("slow")
        assert slow is not None
        with pytest.raises(APIError) as refused:
            await pool.acquire(slow)
        await pool.stop()
        return refused.value

    assert "did not load in time" in _run(work).message


def test_an_engine_that_finishes_loading_after_the_pool_stopped_is_stopped() -> None:
    """Invariant: a shutdown during a model's load leaves no engine running: the load's
    worker thread cannot be interrupted, so the engine it starts late is stopped (a real
    engine is a process that would outlive the server)."""
    lab = Lab()
    lab.load_s["slow"] = 0.5
    pool = lab.pool(_specs("a", "slow"))

    async def work() -> None:
        await pool.start()
        slow = pool.find("slow")
        assert slow is not None
        loading = asyncio.ensure_future(pool.acquire(slow))
        while lab.starts.get("slow") != 1:
            await asyncio.sleep(0.01)
        await pool.stop()
        with pytest.raises(APIError):
            await loading

    _run(work)  # (asyncio.run returns once the worker threads are done)
    assert lab.starts == {"a": 1, "slow": 1}
    assert lab.alive == 0 and lab.stopped == ["a", "slow"]  # slow: once its start ended


def test_keep_alive_unloads_idle_models_and_minus_one_keeps_them() -> None:
    lab = Lab()
    specs = [
        ModelSpec("a", "/models/a"),  # the server's --keep-alive (-1): kept
        ModelSpec("gone", "/models/gone", keep_alive_s=0),
        ModelSpec("brief", "/models/brief"),
    ]
    pool = lab.pool(specs)

    async def work() -> None:
        await pool.start()
        gone, brief = pool.find("gone"), pool.find("brief")
        assert gone is not None and brief is not None
        (await pool.acquire(gone)).release()
        (await pool.acquire(brief)).release(keep_alive_s=0.0)  # a request's keep_alive: 0
        held = await pool.acquire(pool.default)
        await asyncio.sleep(0.8)
        assert gone.state is SlotState.UNLOADED and brief.state is SlotState.UNLOADED
        held.release()
        await asyncio.sleep(0.6)
        assert pool.default.state is SlotState.LOADED
        await pool.stop()

    _run(work)
    assert lab.metric('vision_gateway_model_unloads_total{model="gone",reason="idle"}') == 1


def test_an_alias_reaches_its_model() -> None:
    pool = Lab().pool([ModelSpec("qwen", "/models/qwen", aliases=("vision", "gpt-4o"))])
    assert pool.find("vision") is pool.find("gpt-4o") is pool.find("qwen") is pool.default
    assert pool.find("other") is None and pool.served_names == ["qwen"]


def test_unload_waits_for_running_requests() -> None:
    lab = Lab()
    pool = lab.pool(_specs("a", "b"))

    async def work() -> None:
        await pool.start()
        b = pool.find("b")
        assert b is not None
        held = await pool.acquire(b)
        unloading = asyncio.ensure_future(pool.unload(b))
        await asyncio.sleep(0.2)
        assert not unloading.done() and b.state is SlotState.LOADED
        held.release()
        assert await unloading and b.state is SlotState.UNLOADED
        assert not await pool.unload(b)  # not loaded: nothing to do
        await pool.stop()

    _run(work)


def test_a_model_whose_engine_died_is_loaded_again_by_the_next_request() -> None:
    lab = Lab()
    pool = lab.pool(_specs("a"))

    async def work() -> None:
        await pool.start()
        engine = pool.default.engine
        assert isinstance(engine, FakeEngine)
        engine.stop()  # the engine process died
        held = await pool.acquire(pool.default)
        assert held.engine is not engine and held.engine is not None and held.engine.alive
        await pool.stop()

    _run(work)
    assert lab.starts == {"a": 2}
    assert lab.metric('vision_gateway_model_unloads_total{model="a",reason="crashed"}') == 1
