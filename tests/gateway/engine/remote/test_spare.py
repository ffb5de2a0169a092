"""Spare engine processes (gateway.engine.remote.spare): a process started with no model, its
imports done, that a `RemoteEngine` takes and tells which model to serve.

Pinned: the engine that takes a prepared spare runs in that very process and answers as an
engine spawned for its model does (token ids); a new spare is ready after the take; a spare
told to stop exits, and `close` leaves no spare process behind.
"""

from __future__ import annotations

import time

from support import tiny_model

from gateway.config import EngineConfig
from gateway.engine.remote.client import RemoteEngine
from gateway.engine.remote.spare import SpareEngines, spawn_engine
from gateway.engine.request import FinishEvent, TokenEvent
from gateway.engine.wire import Stop
from gateway.frontend.chat import ChatMessage, ChatRequest, TextPart
from gateway.frontend.prompt import PromptBuilder


def _answer(engine: RemoteEngine) -> list[int]:
    assert engine.model is not None
    prompts = PromptBuilder(engine.model, 4096, 8)
    chat = ChatRequest.greedy("test", (ChatMessage("user", (TextPart("Say hello."),)),), 6)
    request = prompts.build(chat, [], "spare-1", time.perf_counter())
    tokens: list[int] = []
    done: list[FinishEvent] = []

    def sink(event: object) -> None:
        if isinstance(event, TokenEvent):
            tokens.extend(event.token_ids)
        elif isinstance(event, FinishEvent) and event.final:
            done.append(event)

    engine.submit(request, sink)
    deadline = time.monotonic() + 120
    while not done and time.monotonic() < deadline:
        time.sleep(0.02)
    assert done
    return tokens


def test_a_remote_engine_takes_the_spare_and_answers_as_a_fresh_one() -> None:
    config = EngineConfig(str(tiny_model("qwen3")), "test", warmup=False)
    fresh = RemoteEngine(config)
    fresh.start(timeout=300)
    try:
        expected = _answer(fresh)
    finally:
        fresh.stop()
    spares = SpareEngines("warning")
    spares.prepare()
    spare = spares._spare
    assert spare is not None
    engine = RemoteEngine(config, "warning", spares)
    engine.start(timeout=300)
    try:
        assert engine._process is spare.process  # the spare serves the model
        assert spares._spare is not None and spares._spare is not spare  # the next one
        assert _answer(engine) == expected
    finally:
        engine.stop()
        spares.close()
    assert spares._spare is None and not spare.process.is_alive()


def test_a_spare_told_to_stop_exits() -> None:
    spare = spawn_engine(None, "warning")
    spare.commands.send(Stop())
    spare.process.join(60)
    assert spare.process.exitcode == 0
