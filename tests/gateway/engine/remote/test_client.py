"""The engine in its own process (`RemoteEngine`), on the tiny model (CPU).

Pinned: a request through the engine process gives the tokens and logprobs the in-process
engine gives (events cross the pipe intact, images preprocessed in the engine process); cache
stats and metrics come back over the pipe, and the device's memory with `Ready`; if the
engine process dies, requests in flight get an error event and new ones are refused with
EngineUnavailable instead of hanging; a stop during the start kills the loading process.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from support import EngineHarness, Run, chat_body, decoded, noise_image, tiny_model

from gateway.api.openai.parse import parse_chat_request
from gateway.config import CacheConfig, EngineConfig
from gateway.engine.client import EngineUnavailable
from gateway.engine.device_memory import device_memory
from gateway.engine.remote.client import RemoteEngine
from gateway.engine.request import ErrorEvent, FinishEvent
from gateway.frontend.prompt import PromptBuilder


@pytest.fixture(scope="module")
def remote():
    engine = RemoteEngine(EngineConfig(model=str(tiny_model()), served_model_name="test"))
    engine.start(timeout=300)
    yield engine
    engine.stop()


def _submit(engine: RemoteEngine, body: dict, images=(), rid: str = "r") -> Run:  # noqa: ANN001
    prompts = PromptBuilder(engine.model, 8192, 16)
    request = prompts.build(parse_chat_request(body), [decoded(i) for i in images], rid, 0.0)
    run = Run()
    engine.submit(request, run.sink)
    return run


def test_remote_output_equals_in_process_output(remote: RemoteEngine) -> None:
    """Invariant: the process boundary changes nothing a client sees (greedy tokens and
    logprobs, text and image requests)."""
    local = EngineHarness("qwen2_vl")
    try:
        cases = [
            (chat_body("hello there", max_tokens=8), []),
            (chat_body("what is this?", images=1, max_tokens=8), [noise_image(5, 84, 56)]),
        ]
        for k, (body, images) in enumerate(cases):
            here = local.run(body, images)
            there = _submit(remote, body, images, f"eq-{k}").wait()
            assert isinstance(there.finish, FinishEvent)
            assert there.token_ids == here.token_ids
            assert there.logprobs == pytest.approx(here.logprobs, abs=1e-5)
    finally:
        local.close()
    # the same image again crosses the pipe without its pixels (the engine holds them)
    body, images = cases[1]
    again = _submit(remote, {**body, "max_tokens": 3}, images, "again").wait()
    assert isinstance(again.finish, FinishEvent) and again.token_ids == here.token_ids[:3]
    stats = remote.cache_stats()
    assert stats["vision"]["misses"] >= 1
    assert b"vision_gateway_generation_tokens_total" in remote.metrics_text()
    assert remote.running == 0 and remote.waiting == 0


def test_the_engine_process_reports_its_devices_memory(remote: RemoteEngine) -> None:
    """Invariant: the HTTP side knows the engine's device memory from `wire.Ready` (what
    `device_memory` gives there: the RAM on this CPU), without asking MLX itself."""
    assert remote.device_memory == device_memory(remote.on_gpu) > 0


def test_a_dead_engine_process_fails_requests_instead_of_hanging() -> None:
    """Invariant: when the engine process dies, in-flight requests end with an ErrorEvent and
    later submits raise EngineUnavailable."""
    engine = RemoteEngine(EngineConfig(model=str(tiny_model()), served_model_name="test"))
    engine.start(timeout=300)
    try:
        run = _submit(engine, chat_body("count for a long time", max_tokens=2000), rid="long")
        run.wait_tokens(1)
        os.kill(engine._process.pid, signal.SIGKILL)
        assert isinstance(run.wait(30).finish, ErrorEvent)
        with pytest.raises(EngineUnavailable):
            _submit(engine, chat_body("anyone there?"), rid="late")
        assert not engine.alive  # /health reports the server unavailable
    finally:
        engine.stop(timeout=5)


def test_stop_during_start_kills_the_loading_process_at_once() -> None:
    """Invariant: `stop` from another thread while `start` waits for the model kills the
    engine process at once and `start` raises (a server shutting down mid-load leaves no
    engine process behind, and does not wait for the load)."""
    engine = RemoteEngine(EngineConfig(model=str(tiny_model()), served_model_name="test"))
    failure: list[BaseException] = []

    def start() -> None:
        try:
            engine.start(timeout=300)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            failure.append(exc)

    starter = threading.Thread(target=start)
    starter.start()
    while getattr(engine, "_process", None) is None:
        time.sleep(0.01)
    began = time.monotonic()
    engine.stop()
    starter.join(30)
    assert not starter.is_alive() and len(failure) == 1
    assert not engine._process.is_alive() and not engine.alive
    assert time.monotonic() - began < 5  # killed, not joined for stop's 10 s


def test_a_refused_model_says_why_once() -> None:
    """Invariant: a model the engine refuses at load (here: --kv-bits with a head width the
    group size does not divide) fails `start` with the refusal's own sentence, said once."""
    cache = CacheConfig(kv_bits=8, kv_group_size=64)  # the tiny model's heads are 16 wide
    config = EngineConfig(model=str(tiny_model()), served_model_name="test", cache=cache)
    engine = RemoteEngine(config)
    with pytest.raises(RuntimeError) as failed:
        engine.start(timeout=300)
    message = str(failed.value)
    assert message.startswith("model failed to load: --kv-bits 8 --kv-group-size 64")
    assert message.count("failed to load") == 1
    assert not engine.alive


def test_a_cancel_while_the_image_is_prepared_is_not_lost(remote: RemoteEngine) -> None:
    """Invariant: a request cancelled while the engine process still preprocesses its image
    (or a text request queued behind it) ends as cancelled instead of running to max_tokens."""
    image = noise_image(71, 1024, 1024)  # seconds of preprocessing on this CPU: cancel lands
    first = _submit(remote, chat_body("describe", images=1, max_tokens=300), [image], "c-img")
    second = _submit(remote, chat_body("and a text one", max_tokens=300), rid="c-text")
    remote.cancel("c-img")
    remote.cancel("c-text")
    for run in (first.wait(60), second.wait(60)):
        assert isinstance(run.finish, FinishEvent) and run.finish.finish_reason == "cancelled"
        assert len(run.token_ids) < 300
    assert remote.running == 0 and remote.waiting == 0
