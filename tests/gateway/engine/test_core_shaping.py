"""Penalties, logit_bias and min_tokens inside the engine's shared batch (tiny model, CPU).

Pinned here: each field changes what a row generates as documented (a +100 bias takes the
greedy token, penalties stop the random-weight model's repeats, min_tokens holds back the
end token); a shaped row draws the same tokens and logprobs alone and batched beside
unshaped, other shaped, sampled and image rows, which themselves are unchanged; cached ==
uncached with shaping present; the batch shapes all rows in one call per step.
"""

from __future__ import annotations

import pytest
from support import EngineHarness, chat_body, noise_image

from gateway.config import CacheConfig
from gateway.engine.request import FinishEvent

NO_CACHE = CacheConfig(vision_enabled=False, prefix_enabled=False)
STORY = "tell me a story"


@pytest.fixture(scope="module")
def harness():
    h = EngineHarness("qwen2_vl", cache=NO_CACHE, max_batch=8, prefill_chunk_tokens=16)
    yield h
    h.close()


def _body(max_tokens: int = 24, **extra: object) -> dict:
    return chat_body(STORY, max_tokens=max_tokens, **extra)


def test_logit_bias_takes_and_bans_the_greedy_token(harness: EngineHarness) -> None:
    """Invariant: +100 on a token makes greedy pick it every step; -100 on the greedy first
    token makes greedy pick another."""
    base = harness.run(_body(6))
    target = (base.token_ids[0] + 7) % 1000
    forced = harness.run(_body(6, logit_bias={str(target): 100}))
    assert forced.token_ids == [target] * 6
    banned = harness.run(_body(6, logit_bias={str(base.token_ids[0]): -100}))
    assert banned.token_ids[0] != base.token_ids[0]


def test_penalties_stop_repeats(harness: EngineHarness) -> None:
    """Invariant: the random-weight greedy answer repeats tokens; each penalty at its
    maximum yields an answer without repeats (and a different one from the plain answer)."""
    base = harness.run(_body(40))
    assert len(set(base.token_ids)) < 40
    for field, value in (
        ("frequency_penalty", 2.0),
        ("presence_penalty", 2.0),
        ("repetition_penalty", 2.0),
    ):
        run = harness.run(_body(40, **{field: value}))
        assert len(set(run.token_ids)) == 40, field
        assert run.token_ids != base.token_ids


def test_min_tokens_holds_back_the_end_token(harness: EngineHarness) -> None:
    """Invariant: with the end token pushed to the top (+100), the answer ends at its first
    token; with min_tokens=5 it ends right after 5 other tokens (vLLM's rule)."""
    eos = min(harness.engine.model.eos_token_ids)
    bias = {str(eos): 100}
    run = harness.run(_body(20, logit_bias=bias))
    assert run.finish.finish_reason == "stop" and len(run.token_ids) == 1
    held = harness.run(_body(20, logit_bias=bias, min_tokens=5))
    assert held.finish.finish_reason == "stop"
    assert len(held.token_ids) == 6 and held.token_ids[-1] == eos
    assert eos not in held.token_ids[:-1]


def _mixed() -> list[tuple[dict, list]]:
    return [
        (_body(14, frequency_penalty=1.5, logit_bias={"17": 2.5}), []),
        (_body(12), []),
        (_body(12, presence_penalty=-1.0, repetition_penalty=1.3, min_tokens=4), []),
        (_body(10, temperature=0.9, seed=3, frequency_penalty=0.8), []),
        (chat_body("what is it?", images=1, max_tokens=9, presence_penalty=2.0),
         [noise_image(5)]),
        (chat_body("an unshaped image row", images=1, max_tokens=9), [noise_image(6)]),
    ]  # fmt: skip


def test_shaped_rows_batched_equal_each_alone(
    harness: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: shaped, unshaped, sampled and image rows decoding together (some joining
    mid-flight) each get the tokens and logprobs they get alone; the shaper runs once per
    decode step, not once per row."""
    from gateway.engine.tokens import penalties

    requests = _mixed()
    alone = [harness.run(body, images) for body, images in requests]
    rows_per_call: list[int] = []
    original = penalties.shape

    def counted(*args):  # noqa: ANN002, ANN202
        rows_per_call.append(args[1].shape[0])  # (terms, logits, ...)
        return original(*args)

    monkeypatch.setattr(penalties, "shape", counted)
    first = harness.submit(*requests[0])
    first.wait_tokens(2)
    rest = [harness.submit(body, images) for body, images in requests[1:]]
    together = [first.wait()] + [r.wait() for r in rest]
    for i, (single, batched) in enumerate(zip(alone, together, strict=True)):
        assert isinstance(batched.finish, FinishEvent)
        assert batched.token_ids == single.token_ids, i
        assert batched.logprobs == pytest.approx(single.logprobs, abs=1e-4), i
    shaped_tokens = sum(len(together[i].token_ids) for i in (0, 2, 3, 4))
    assert max(rows_per_call) == 4  # all shaped rows in one call
    assert len(rows_per_call) < shaped_tokens - 10


def test_shaped_answers_are_the_same_cached_and_uncached() -> None:
    """Invariant: with the prefix cache on, a repeated shaped request (its prompt's KV from
    the cache) gives the uncached tokens and logprobs."""
    h = EngineHarness("qwen2_vl", max_batch=4, prefill_chunk_tokens=16)
    try:
        body = chat_body(
            " ".join(f"word{i}" for i in range(40)),  # a few 32-token cache blocks
            max_tokens=12,
            repetition_penalty=1.7,
            logit_bias={"33": 3.0},
        )
        cold = h.run(body)
        warm = h.run(body)
        assert warm.finish.usage.cached_tokens > 0
        assert warm.token_ids == cold.token_ids
        assert warm.logprobs == pytest.approx(cold.logprobs, abs=1e-5)
    finally:
        h.close()
