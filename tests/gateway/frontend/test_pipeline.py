"""The protocol-neutral chat pipeline (gateway.frontend.pipeline), driven without HTTP: a
parsed `ChatRequest` in, an `Admission` or an `APIError` out.

Pinned: a request is refused (503) before it is read while the pipeline is closed or draining;
a wrong model is a 404 before any media is loaded; an admitted request carries the engine's
admission event, the affinity key, Timings from the caller's marks and the max_tokens the
prompt builder granted (a capped one named in a header); a full engine queue is
`Overloaded` (429 + Retry-After), a gone engine a 503, an engine error before admission its
APIError; a client that leaves before admission cancels the request in the engine
(`ClientGone`); `interrupt_all` ends every admitted stream with a shutting-down error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.config import EngineConfig, MediaConfig
from gateway.engine.client import EngineBusy, EngineUnavailable
from gateway.engine.request import (
    AdmittedEvent,
    EngineRequest,
    ErrorEvent,
    ErrorKind,
    Event,
    SamplingParams,
)
from gateway.errors import APIError
from gateway.frontend.admission import Admission
from gateway.frontend.chat import ChatMessage, ChatRequest, TextPart
from gateway.frontend.errors import ClientGone, Overloaded
from gateway.frontend.pipeline import ChatPipeline
from gateway.frontend.streams import LoopDelivery
from gateway.media import MediaLoader
from gateway.metrics import EdgeMetrics, PoolMetrics
from gateway.pool.pool import ModelPool
from gateway.pool.slot import ModelSlot
from gateway.pool_config import ModelSpec, PoolConfig

ADMITTED = AdmittedEvent(prompt_tokens=5, cached_tokens=0, vision_hits=0, vision_misses=0)


class FakeEngine:
    """Answers each submit with `reply` (an event posted to the sink, or an exception)."""

    def __init__(self, reply: Event | Exception | None = ADMITTED) -> None:
        self.reply = reply
        self.config = SimpleNamespace(max_batch=4)
        self.submitted: list[EngineRequest] = []
        self.cancelled: list[str] = []

    def submit(self, request: EngineRequest, sink: Callable[[Event], None]) -> None:
        if isinstance(self.reply, Exception):
            raise self.reply
        self.submitted.append(request)
        if self.reply is not None:
            sink(self.reply)

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    def start(self, timeout: float | None = None) -> None:
        pass

    def stop(self, timeout: float = 10.0) -> None:
        pass

    idle = alive = True


class FakePrompts:
    """A prompt builder of one token per character of text."""

    def build(self, chat: ChatRequest, media: list[Any], request_id: str, arrival: float):  # noqa: ANN201
        text = "".join(p.text for m in chat.messages for p in m.parts if isinstance(p, TextPart))
        return EngineRequest(
            request_id, tuple(map(ord, text)), (), SamplingParams(max_tokens=4), arrival
        )

    def count(self, chat: ChatRequest, media: list[Any]) -> int:
        return len(self.build(chat, media, "", 0.0).prompt_ids)


def _chat(model: str = "test", text: str = "hello") -> ChatRequest:
    return ChatRequest.greedy(model, (ChatMessage("user", (TextPart(text),)),), 4)


def _run(
    engine: FakeEngine,
    work: Callable[[ChatPipeline], Awaitable[Any]],
    opened: bool = True,
) -> Any:
    async def main() -> Any:
        media = MediaLoader(MediaConfig())
        pool = _pool(engine)
        pipeline = ChatPipeline(pool, media, EdgeMetrics())
        if opened:
            await pool.start()
            pipeline.open(LoopDelivery(asyncio.get_running_loop()))
        try:
            return await work(pipeline)
        finally:
            await pool.stop()
            await media.aclose()

    return asyncio.run(main())


def _pool(engine: FakeEngine) -> ModelPool:
    """A pool of one model, "test", served by `engine` with `FakePrompts`."""
    spec = ModelSpec("test", "/nowhere", pinned=True)
    slot = ModelSlot(spec, EngineConfig("/nowhere", "test", max_batch=4), -1, 0, lambda _: engine)  # type: ignore[arg-type, return-value]

    def prepare(slot: ModelSlot) -> None:
        slot.prompts = FakePrompts()  # type: ignore[assignment]

    return ModelPool(PoolConfig(), [slot], prepare, PoolMetrics(CollectorRegistry()))


async def _admit(pipeline: ChatPipeline, chat: ChatRequest | None = None, **kw: Any) -> Admission:
    return await pipeline.admit(chat or _chat(), "req-", arrival=1.0, read=2.0, **kw)


def test_admits_a_request_with_its_event_affinity_and_timings() -> None:
    engine = FakeEngine()
    admission = _run(engine, _admit)
    assert admission.event == ADMITTED and admission.request_id.startswith("req-")
    (sent,) = engine.submitted
    assert sent.request_id == admission.request_id and sent.prompt_ids == tuple(map(ord, "hello"))
    assert sent.affinity_key.startswith("text:")
    t = admission.timings
    assert (t.arrival, t.read) == (1.0, 2.0) and t.read <= t.media <= t.prompt <= t.admit
    assert admission.headers()["x-request-id"] == admission.request_id


def test_a_capped_max_tokens_is_named_in_a_header() -> None:
    """Invariant: an admission whose prompt builder granted fewer tokens than the request's
    max_tokens says so in `x-max-tokens-capped` (asked, granted, the prompt, the context
    they make); one granted what it asked has no such header."""
    admission = _run(FakeEngine(), lambda p: _admit(p, replace(_chat(), max_tokens=32_000)))
    assert admission.max_tokens == 4  # what the prompt builder granted
    assert admission.headers()["x-max-tokens-capped"] == (
        "requested=32000; capped=4; prompt-tokens=5; context=9"
    )
    admission = _run(FakeEngine(), _admit)  # asks 4, granted 4
    assert "x-max-tokens-capped" not in admission.headers()


def test_more_choices_than_rows_is_a_400_before_the_engine() -> None:
    """Invariant: `n` above the engine's rows (max_batch 4 here) is a 400 naming `n`, and
    nothing reaches the engine; `n` up to the rows is admitted."""
    engine = FakeEngine()
    with pytest.raises(APIError) as info:
        _run(engine, lambda p: p.admit(replace(_chat(), n=5), "x-", arrival=0.0, read=0.0))
    assert info.value.status == 400 and info.value.param == "n"
    assert engine.submitted == []
    _run(engine, lambda p: p.admit(replace(_chat(), n=4), "x-", arrival=0.0, read=0.0))
    assert len(engine.submitted) == 1


def test_counts_tokens_without_the_engine() -> None:
    engine = FakeEngine()
    assert _run(engine, lambda p: p.count_tokens(_chat(text="four"))) == 4
    assert engine.submitted == []


@pytest.mark.parametrize("draining", [False, True])
def test_refuses_before_reading_when_not_open_or_draining(draining: bool) -> None:
    async def accept(pipeline: ChatPipeline) -> None:
        if draining:
            pipeline.close()
        pipeline.accept()

    with pytest.raises(APIError) as info:
        _run(FakeEngine(), accept, opened=draining)
    assert info.value.status == 503 and info.value.code == "unavailable"


def test_a_wrong_model_is_404_and_never_submitted() -> None:
    engine = FakeEngine()
    with pytest.raises(APIError) as info:
        _run(engine, lambda p: _admit(p, _chat(model="gpt-4o")))
    assert (info.value.status, info.value.code, info.value.param) == (
        404,
        "model_not_found",
        "model",
    )
    assert engine.submitted == []


@pytest.mark.parametrize(
    ("reply", "status", "kind"),
    [
        (EngineBusy(1, 1), 429, Overloaded),
        (EngineUnavailable("gone"), 503, APIError),
        (ErrorEvent(ErrorKind.SHUTTING_DOWN, "stopping"), 503, APIError),
        (ErrorEvent(ErrorKind.INTERNAL, "boom"), 500, APIError),
    ],
)
def test_engine_failures_are_api_errors(reply: Any, status: int, kind: type) -> None:
    with pytest.raises(kind) as info:
        _run(FakeEngine(reply), _admit)
    assert info.value.status == status
    if status == 429:
        assert info.value.headers == {"Retry-After": "1"}


def test_a_client_gone_before_admission_cancels_the_request() -> None:
    engine = FakeEngine(reply=None)  # never admitted

    async def gone(work: Awaitable[Event]) -> None:
        work.close()  # type: ignore[attr-defined]  # the watcher drops the wait

    with pytest.raises(ClientGone):
        _run(engine, lambda p: _admit(p, watch=gone))
    assert engine.cancelled == [engine.submitted[0].request_id]


def test_interrupt_all_ends_admitted_streams_with_a_shutdown_error() -> None:
    engine = FakeEngine()

    async def work(pipeline: ChatPipeline) -> tuple[int, Event]:
        admission = await _admit(pipeline)
        count = pipeline.interrupt_all("bye")
        return count, await admission.stream.get()

    count, event = _run(engine, work)
    assert count == 1 and event == ErrorEvent(ErrorKind.SHUTTING_DOWN, "bye")
    assert len(engine.cancelled) == 1
