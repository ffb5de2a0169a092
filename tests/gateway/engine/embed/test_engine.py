"""The embedding engine (engine/embed/engine.py, batch.py) on the tiny Qwen3-VL-Embedding
checkpoint, in this process.

Pinned: the engine's vectors equal the embedder's alone whether a call's inputs share a
forward, several calls share a batch, or the answer comes from the cache; an identical
input is answered by the embedding cache (its stats count the hit, no forward runs); a
repeated image, in another input and another call, costs no tower pass (the vision cache's
hit; the tower-pass counter does not move); a different `dimensions` or scope is another
entry; a refused input fails its call alone, naming its index; the stats and metrics name
both caches; a cancelled call is dropped before it runs, and a run takes at most one
forward's worth of calls.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from support import noise_image, tiny_model

from gateway.config import CacheConfig, EngineConfig
from gateway.engine.embed.engine import EmbedEngine
from gateway.engine.embed.request import (
    Embed,
    EmbedCancelled,
    EmbedItem,
    EmbedRefused,
    EmbedResult,
)
from tests.gateway.engine.embed.common import embed_image, vectors


@functools.cache
def _path() -> str:
    return str(tiny_model("qwen3_vl_embedding"))


@pytest.fixture
def engine() -> Iterator[EmbedEngine]:
    config = EngineConfig(model=_path(), served_model_name="emb", max_batch=4)
    engine = EmbedEngine(config)
    engine.start(120)
    yield engine
    engine.stop()


def _tower_passes(engine: EmbedEngine) -> float:
    return engine.metrics.tower_passes._value.get()  # noqa: SLF001 - prometheus' counter


def test_vectors_equal_the_embedder_alone(engine: EmbedEngine) -> None:
    image = embed_image(noise_image(5, 64, 48))
    items = (EmbedItem(text="hello"), EmbedItem(parts=(image,)), EmbedItem(text="a" * 40))
    result = engine.embed(Embed(items))
    assert engine.embedder is not None
    for i, item in enumerate(items):
        np.testing.assert_array_equal(result.vectors[i], vectors(engine.embedder, [item])[0])
    assert result.tokens[1] > result.tokens[0] and result.cached == 0


def test_identical_input_is_served_by_the_embedding_cache(engine: EmbedEngine) -> None:
    first = engine.embed(Embed((EmbedItem(text="same words"),)))
    forwards = engine.metrics.forwards._value.get()  # noqa: SLF001
    second = engine.embed(Embed((EmbedItem(text="same words"),)))
    np.testing.assert_array_equal(first.vectors, second.vectors)
    assert second.cached == 1 and second.tokens == first.tokens
    assert engine.metrics.forwards._value.get() == forwards  # noqa: SLF001 - no forward ran
    stats = engine.cache_stats()["embedding"]
    assert stats["hits"] == 1 and stats["entries"] == 1
    # Another `dimensions` or another scope is another entry.
    engine.embed(Embed((EmbedItem(text="same words"),), dimensions=8))
    engine.embed(Embed((EmbedItem(text="same words"),), scope="tenant-a"))
    assert engine.cache_stats()["embedding"]["entries"] == 3


def test_repeated_image_costs_no_tower_pass(engine: EmbedEngine) -> None:
    image = embed_image(noise_image(6))
    engine.embed(Embed((EmbedItem(parts=(image,)),)))
    assert _tower_passes(engine) == 1
    # The same pixels in another input (with text: no embedding-cache hit) and another call.
    result = engine.embed(Embed((EmbedItem(parts=("caption", image)),)))
    assert _tower_passes(engine) == 1 and result.cached == 0
    vision = engine.cache_stats()["vision"]
    assert vision["hits"] == 1 and vision["misses"] == 1
    assert engine.embedder is not None
    alone = vectors(engine.embedder, [EmbedItem(parts=("caption", image))])[0]
    np.testing.assert_array_equal(result.vectors[0], alone)


def test_concurrent_calls_batch_and_match(engine: EmbedEngine) -> None:
    texts = [f"text number {i} " * (i + 1) for i in range(10)]
    results: dict[int, EmbedResult] = {}

    def call(i: int) -> None:
        results[i] = engine.embed(Embed((EmbedItem(text=texts[i]),)))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert engine.embedder is not None
    for i, text in enumerate(texts):
        np.testing.assert_array_equal(
            results[i].vectors[0], vectors(engine.embedder, [EmbedItem(text=text)])[0]
        )


def test_a_refused_input_fails_its_call_naming_it(engine: EmbedEngine) -> None:
    with pytest.raises(EmbedRefused) as refused:
        engine.embed(Embed((EmbedItem(text="fine"), EmbedItem(text=""))))
    assert refused.value.index == 1 and refused.value.field == "input"
    with pytest.raises(EmbedRefused) as bad:
        engine.embed(Embed((EmbedItem(text="fine"),), dimensions=10**6))
    assert bad.value.field == "dimensions"
    assert engine.embed(Embed((EmbedItem(text="fine"),))).vectors.shape == (1, 64)


def test_metrics_name_both_caches(engine: EmbedEngine) -> None:
    engine.embed(Embed((EmbedItem(parts=(embed_image(noise_image(8)),)),)))
    text = engine.metrics_text().decode()
    for line in (
        'vision_gateway_cache_entries{cache="embedding"} 1.0',
        'vision_gateway_cache_entries{cache="vision"} 1.0',
        "vision_gateway_embedding_tower_passes_total 1.0",
        "vision_gateway_embedding_cache_queries_total 1.0",
    ):
        assert line in text


def test_no_embedding_cache_when_its_budget_is_zero() -> None:
    cache = CacheConfig(embedding_cache_mb=0)
    config = EngineConfig(model=_path(), served_model_name="emb", cache=cache)
    engine = EmbedEngine(config)
    engine.start(120)
    try:
        engine.embed(Embed((EmbedItem(text="again"),)))
        assert engine.embed(Embed((EmbedItem(text="again"),))).cached == 0
    finally:
        engine.stop()


def test_a_chat_request_is_refused_by_submit(engine: EmbedEngine) -> None:
    """The front end answers 400 first; an engine that is handed one anyway refuses it as
    the engine process turns into the request's error event."""
    with pytest.raises(ValueError, match="does not chat"):
        engine.submit(None, lambda _event: None)  # type: ignore[arg-type]


def test_futures_resolve_without_a_waiting_thread(engine: EmbedEngine) -> None:
    futures = [engine.embed_future(Embed((EmbedItem(text=f"f{i}"),))) for i in range(5)]
    results = [f.result(60) for f in futures]
    assert all(r.vectors.shape == (1, 64) for r in results)
    refused = engine.embed_future(Embed((EmbedItem(text=""),)))
    assert isinstance(refused.exception(60), EmbedRefused)


def test_a_fault_preparing_one_call_fails_it_alone(engine: EmbedEngine) -> None:
    """A non-refusal fault while preparing an input (here the embedder's `prepare` raising)
    fails that call; the engine thread lives on and answers the next."""
    embedder = engine.embedder
    assert embedder is not None
    real = embedder.prepare

    def broken(item: EmbedItem) -> object:
        if item.text == "boom":
            raise RuntimeError("boom")
        return real(item)

    embedder.prepare = broken  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError, match="boom"):
            engine.embed(Embed((EmbedItem(text="boom"),)))
        assert engine.embed(Embed((EmbedItem(text="after"),))).vectors.shape == (1, 64)
    finally:
        embedder.prepare = real  # type: ignore[method-assign]


def test_a_cancelled_call_is_dropped_before_it_runs(engine: EmbedEngine) -> None:
    """Invariant: a call cancelled while it waits (its client left) is answered
    `EmbedCancelled` and never computed; the calls around it are answered; a cancel for an
    answered or unknown call is a no-op that leaves nothing behind."""
    embedder = engine.embedder
    assert embedder is not None
    real, gate, seen = embedder.prepare, threading.Event(), []

    def gated(item: EmbedItem) -> object:
        seen.append(item.text)
        if item.text == "hold":
            assert gate.wait(60)
        return real(item)

    embedder.prepare = gated  # type: ignore[method-assign]
    try:
        held = engine.embed_future(Embed((EmbedItem(text="hold"),), request_id="h"))
        while "hold" not in seen:  # the engine thread is in its run
            threading.Event().wait(0.01)
        dropped = engine.embed_future(Embed((EmbedItem(text="drop"),), request_id="a"))
        kept = engine.embed_future(Embed((EmbedItem(text="keep"),), request_id="b"))
        engine.cancel("a")
        gate.set()
        assert held.result(60).vectors.shape == (1, 64)
        assert kept.result(60).vectors.shape == (1, 64)
        assert isinstance(dropped.exception(60), EmbedCancelled)
        assert "drop" not in seen
        engine.cancel("b")  # answered already
        engine.cancel("nobody")
        assert engine._cancelled == set() and engine.waiting == 0  # noqa: SLF001
    finally:
        embedder.prepare = real  # type: ignore[method-assign]


def test_a_run_takes_one_forward_of_calls_at_a_time(engine: EmbedEngine) -> None:
    """Invariant: the engine runs at most --max-batch inputs of queued calls at once (one
    call larger than that alone), so later calls stay cancellable while earlier ones run."""
    runner_calls: list[int] = []
    real_next = engine._next_calls  # noqa: SLF001

    def counted() -> list:
        calls = real_next()
        if calls:
            runner_calls.append(sum(len(j.call.items) for j in calls))
        return calls

    engine._next_calls = counted  # type: ignore[method-assign]  # noqa: SLF001
    futures = [
        engine.embed_future(Embed(tuple(EmbedItem(text=f"t{i}-{k}") for k in range(3))))
        for i in range(4)
    ]
    big = engine.embed_future(Embed(tuple(EmbedItem(text=f"big{k}") for k in range(6))))
    assert all(f.result(60).vectors.shape == (3, 64) for f in futures)
    assert big.result(60).vectors.shape == (6, 64)
    assert runner_calls and all(n <= 4 or n == 6 for n in runner_calls), runner_calls
