"""Engine invariants on the tiny offline models (CPU).

Pinned here: batched == single-request output (greedy token ids and logprobs) for every
architecture, with text and image rows mixed and rows joining a running batch mid-flight;
cancellation frees rows; per-request seeds make sampling independent of the batch.
"""

from __future__ import annotations

import pytest
from support import EngineHarness, chat_body, noise_image, wait_until

from gateway.config import CacheConfig
from gateway.engine.request import FinishEvent

ARCHS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
NO_CACHE = CacheConfig(vision_enabled=False, prefix_enabled=False)


def _requests() -> list[tuple[dict, list]]:
    return [
        (chat_body("what is in this picture?", images=1, max_tokens=10), [noise_image(1)]),
        (chat_body("hello there, how are you?", max_tokens=12), []),
        (
            chat_body("compare the two", images=2, max_tokens=9),
            [noise_image(2), noise_image(3, 84, 56)],
        ),
        (chat_body("a longer text-only prompt about many different things", max_tokens=11), []),
        (chat_body("and this one?", images=1, max_tokens=8), [noise_image(4, 56, 112)]),
    ]


@pytest.fixture(scope="module", params=ARCHS)
def harness(request: pytest.FixtureRequest):
    h = EngineHarness(request.param, cache=NO_CACHE, max_batch=8, prefill_chunk_tokens=16)
    yield h
    h.close()


def test_batched_equals_single_with_mid_flight_joins(harness: EngineHarness) -> None:
    """Invariant: a request's greedy tokens and logprobs do not depend on what else is in the
    batch, including rows (text and image) that join while it is decoding."""
    requests = _requests()
    alone = [harness.run(body, images) for body, images in requests]
    for run in alone:
        assert isinstance(run.finish, FinishEvent)
        assert len(run.token_ids) == run.finish.usage.completion_tokens > 0

    first = harness.submit(*requests[0])
    first.wait_tokens(2)  # the others join a batch that is already decoding
    rest = []
    for body, images in requests[1:]:
        rest.append(harness.submit(body, images))
        rest[-1].wait_tokens(1)
    together = [first.wait()] + [r.wait() for r in rest]

    for single, batched in zip(alone, together, strict=True):
        assert batched.token_ids == single.token_ids
        assert batched.logprobs == pytest.approx(single.logprobs, abs=1e-4)
        assert batched.text == single.text


def test_distinct_outputs_make_the_equivalence_meaningful(harness: EngineHarness) -> None:
    """Guard against a degenerate model: different prompts give different token sequences and
    a single completion is not one token repeated, so the equality above can fail."""
    runs = [harness.run(body, images) for body, images in _requests()[:2]]
    assert runs[0].token_ids != runs[1].token_ids
    assert len(set(runs[0].token_ids)) > 1


def test_cancel_frees_the_row(harness: EngineHarness) -> None:
    """Invariant: a cancelled request stops producing tokens and gives its row back."""
    run = harness.submit(chat_body("count forever", max_tokens=400))
    run.wait_tokens(2)
    harness.engine.cancel(f"req-{harness._ids}")
    run.wait()
    assert run.finish.finish_reason == "cancelled"
    assert len(run.token_ids) < 400
    other = harness.run(chat_body("still serving?", max_tokens=3))
    assert other.finish.finish_reason == "length"
    assert harness.engine.running == 0


def test_seeded_sampling_is_batch_independent(harness: EngineHarness) -> None:
    """Invariant: with a seed, sampled tokens are the same alone and in a batch."""
    body = chat_body("tell me a story", max_tokens=10, temperature=1.0, seed=1234)
    alone = harness.run(body)
    noise = harness.submit(chat_body("background work", max_tokens=30))
    together = harness.run(body)
    noise.wait()
    assert together.token_ids == alone.token_ids
    unseeded = harness.run(chat_body("tell me a story", max_tokens=10, temperature=1.0, seed=99))
    assert unseeded.token_ids != alone.token_ids


def test_many_sampled_rows_draw_together_as_they_would_alone(
    harness: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: sampled rows (temperature, top-k, top-p, each with its own seed) and greedy
    rows decoding in one batch give each request the tokens it gets alone, and the batch draws
    all rows in one sampler call per step (not one call per row)."""
    from gateway.engine.tokens import sampling

    bodies = [
        chat_body("tell me a story", max_tokens=12, temperature=0.7, seed=1),
        chat_body("tell me a story", max_tokens=12, temperature=1.3, seed=2, top_p=0.9),
        chat_body("a greedy row in between", max_tokens=12),
        chat_body("tell me a story", max_tokens=12, temperature=1.0, seed=3, top_k=5),
    ]
    alone = [harness.run(body) for body in bodies]
    calls = {"batch": 0, "row": 0}
    for cls, name in ((sampling.BatchSampler, "batch"), (sampling.RowSampler, "row")):
        original = cls.__call__

        def counted(self, logprobs, _original=original, _name=name):
            calls[_name] += 1
            return _original(self, logprobs)

        monkeypatch.setattr(cls, "__call__", counted)
    runs = [harness.submit(body) for body in bodies]
    together = [run.wait() for run in runs]
    for single, batched in zip(alone, together, strict=True):
        assert batched.token_ids == single.token_ids
    assert len({tuple(run.token_ids) for run in together}) == len(bodies)
    assert calls["batch"] >= 10
    assert calls["row"] <= 2 * 3  # each sampled row: its first token and its first step


def test_capacity_is_rows_plus_queue_even_in_a_burst() -> None:
    """Invariant: at most max_batch + max_waiting requests are held; the rest are refused with
    EngineBusy (the HTTP edge's 429 + Retry-After), however fast they arrive
    (submitted-but-unadmitted requests count)."""
    from gateway.engine.client import EngineBusy
    from gateway.frontend.errors import engine_busy

    h = EngineHarness("qwen2_vl", cache=NO_CACHE, max_batch=1, max_waiting=1)
    try:
        accepted, refused = [], []
        for i in range(5):
            try:
                accepted.append(h.submit(chat_body(f"burst {i}", max_tokens=40)))
            except EngineBusy as exc:
                error = engine_busy(exc)
                assert error.status == 429 and error.headers == {"Retry-After": "1"}
                refused.append(exc)
        assert (len(accepted), len(refused)) == (2, 3)
        for run in accepted:
            assert run.wait().finish.finish_reason == "length"
    finally:
        h.close()


@pytest.fixture(scope="module", params=ARCHS)
def loose_harness(request: pytest.FixtureRequest):
    """Without the exact-reuse rule: the only mode in which the batch prefills bursts."""
    off = CacheConfig(vision_enabled=False, prefix_enabled=False, exact_reuse=False)
    h = EngineHarness(request.param, cache=off, max_batch=8, prefill_chunk_tokens=16)
    yield h
    h.close()


def test_a_burst_prefilled_together_equals_each_alone(loose_harness: EngineHarness) -> None:
    """Invariant (--no-exact-cache): requests arriving together (their prompts prefilled as
    one batch, with right padding) give the tokens and logprobs each gives alone (prefilled by
    the engine, first token from its own prefill logits)."""
    harness = loose_harness
    # short prompts: a burst is only prompts that fit one prefill budget (16 tokens here)
    bodies = [chat_body(text, max_tokens=6) for text in ("hi", "one two", "x y z", "ok", "b c")]
    alone = [harness.run(body) for body in bodies]
    batch = harness.engine.scheduler.batch
    burst_inserts = []
    insert_prompt = batch.insert_prompt
    batch.insert_prompt = lambda job: (burst_inserts.append(job), insert_prompt(job))
    try:
        with harness.arriving_together():
            runs = [harness.submit(body) for body in bodies]
        together = [run.wait() for run in runs]
    finally:
        del batch.insert_prompt
    assert len(burst_inserts) == len(bodies)  # the burst path was taken
    for single, burst in zip(alone, together, strict=True):
        assert burst.token_ids == single.token_ids
        assert burst.logprobs == pytest.approx(single.logprobs, abs=1e-4)


def test_requests_arriving_together_share_every_decode_step() -> None:
    """Invariant: 8 text requests that reach the engine in one step decode in shared steps:
    alongside a running 64-token request they add at most 2 decode steps of their own (the
    step that joins them), whatever the thread timing (pinned here at engine level; the HTTP
    test only checks that concurrent requests all finish)."""
    h = EngineHarness("qwen2_vl", cache=NO_CACHE, max_batch=16)
    try:

        def counter(name: str) -> float:
            return h.metrics.registry.get_sample_value(name) or 0.0

        steps0 = counter("vision_gateway_decode_steps_total")
        tokens0 = counter("vision_gateway_generation_tokens_total")
        with h.arriving_together():  # a 64-token request holds the engine inside a step
            runs = [h.submit(chat_body(f"question number {i}", max_tokens=24)) for i in range(8)]
        for run in runs:
            assert run.wait().finish.usage.completion_tokens == 24
        _wait_until_idle(h)
        steps = counter("vision_gateway_decode_steps_total") - steps0
        tokens = counter("vision_gateway_generation_tokens_total") - tokens0
        assert tokens == 64 + 8 * 24
        assert steps <= 64 + 2, f"{steps} steps for {tokens} tokens"
    finally:
        h.close()


def _wait_until_idle(h: EngineHarness, timeout: float = 60.0) -> None:
    wait_until(
        lambda: not (h.engine.running or h.engine.waiting),
        timeout,
        interval=0.01,
        message=lambda: (
            f"the engine did not go idle ({h.engine.running} running, {h.engine.waiting} waiting)"
        ),
    )
