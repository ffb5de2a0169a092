"""Structured output inside the engine's shared batch (tiny models, CPU).

Pinned here: constrained completions parse and validate against their schema for many
random-weight completions, greedy and sampled, text and image prompts; constrained and free
rows decoding together give each the tokens and logprobs it gets alone (greedy and seeded);
max_tokens inside a value ends with "length"; a schema the grammar engine gives up on while
decoding is the request's error (the same for every request, a free row beside it unharmed);
a repeat extraction over the same image reuses
the image's KV and the compiled grammar and gives the uncached tokens.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from support import LEXER_BOMB, EngineHarness, chat_body, noise_image

from gateway.config import CacheConfig
from gateway.engine.request import ErrorEvent, ErrorKind, FinishEvent

RECEIPT = {
    "type": "object",
    "properties": {
        "merchant": {"type": "string", "maxLength": 16},
        "total": {"type": "number", "minimum": 0, "maximum": 10000, "multipleOf": 0.25},
        "currency": {"enum": ["EUR", "USD", "GBP"]},
        "items": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 10},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                },
                "required": ["name", "qty"],
            },
        },
        "paid": {"type": "boolean"},
    },
    "required": ["merchant", "total", "currency", "items", "paid"],
}
JSON_SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "r", "schema": RECEIPT, "strict": True},
}
NO_CACHE = CacheConfig(vision_enabled=False, prefix_enabled=False)


@pytest.fixture(scope="module")
def harness():
    h = EngineHarness("qwen2_5_vl", cache=NO_CACHE, max_batch=8, prefill_chunk_tokens=16)
    yield h
    h.close()


def _constrained(question: str, images: int = 0, **extra: object) -> dict:
    extra.setdefault("response_format", JSON_SCHEMA)
    return chat_body(question, images=images, max_tokens=200, **extra)


def test_completions_parse_and_validate(harness: EngineHarness) -> None:
    """Invariant: every completion under a bounded schema (greedy and sampled, text and image
    prompts) is JSON that validates, and ends with "stop"."""
    runs = []
    for i in range(6):
        body = _constrained(f"receipt number {i}?", temperature=1.0, seed=i)
        runs.append((harness.submit(body), RECEIPT))
    runs.append((harness.submit(_constrained("the receipt", images=1), [noise_image(5)]), RECEIPT))
    runs.append((harness.submit(_constrained("greedy receipt")), RECEIPT))
    texts = set()
    for run, schema in runs:
        run.wait()
        assert isinstance(run.finish, FinishEvent) and run.finish.finish_reason == "stop", run.text
        jsonschema.validate(json.loads(run.text), schema)
        texts.add(run.text)
    assert len(texts) > 5  # the model really chose: not one forced string


def test_json_object_completions_are_objects(harness: EngineHarness) -> None:
    """Invariant: under json_object a completion that ends is one JSON object; one cut by
    max_tokens is the start of one (random weights ramble inside unbounded keys, so only
    some end: the ones that do must parse)."""
    runs = [
        harness.submit(
            chat_body(
                f"any object {i}",
                max_tokens=120,
                response_format={"type": "json_object"},
                temperature=t,
                seed=i,
            )
        )
        for i in range(6)
        for t in (0.0, 0.5)
    ]
    ended = 0
    for run in runs:
        run.wait()
        assert run.text.startswith("{")
        if run.finish.finish_reason == "stop":
            assert isinstance(json.loads(run.text), dict)
            ended += 1
        else:
            assert run.finish.usage.completion_tokens == 120
    assert ended >= 1


def test_constrained_and_free_rows_decode_together_as_alone(harness: EngineHarness) -> None:
    """Invariant: a constrained row's tokens and logprobs do not depend on free rows sharing
    its batch (and the free rows' do not depend on it), greedy and seeded, with rows joining
    mid-flight and rows joining in the same step."""
    requests = [
        (_constrained("first receipt"), []),
        (chat_body("a free question", max_tokens=30), []),
        (_constrained("seeded receipt", temperature=1.0, seed=7), []),
        (chat_body("free and seeded", max_tokens=25, temperature=1.0, seed=3), []),
        (_constrained("receipt in a picture", images=1), [noise_image(2)]),
    ]
    alone = [harness.run(body, images) for body, images in requests]
    for run in alone:
        assert run.finish.usage.completion_tokens > 3
    first = harness.submit(*requests[0])
    first.wait_tokens(3)  # the others join a batch that is already decoding
    with harness.arriving_together():
        rest = [harness.submit(body, images) for body, images in requests[1:]]
    together = [first.wait()] + [r.wait() for r in rest]
    for single, batched in zip(alone, together, strict=True):
        assert batched.token_ids == single.token_ids
        assert batched.logprobs == pytest.approx(single.logprobs, abs=1e-4)


def test_max_tokens_inside_a_value_ends_with_length(harness: EngineHarness) -> None:
    """Invariant: a budget that runs out inside the JSON ends with finish_reason "length" and
    the (incomplete) output is a prefix of the unconstrained-budget answer."""
    full = harness.run(_constrained("short budget"))
    cut = harness.run({**_constrained("short budget"), "max_tokens": 6})
    assert cut.finish.finish_reason == "length"
    assert cut.finish.usage.completion_tokens == 6
    assert full.text.startswith(cut.text)
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.text)


def test_a_schema_the_lexer_gives_up_on_is_the_requests_error_every_time(
    harness: EngineHarness,
) -> None:
    """Invariant: a schema llguidance accepts but whose lexer gives up while decoding (a
    nested bounded repetition) ends its request with a GRAMMAR_LIMIT error (the HTTP edge's
    400), the same on a repeat (the broken compiled grammar is not reused: it would end the
    repeat at once with an empty "stop"), and a free row decoding beside it is unaffected."""
    schema = {"name": "b", "schema": LEXER_BOMB, "strict": True}
    body = _constrained("bomb", response_format={"type": "json_schema", "json_schema": schema})
    free = chat_body("free row", max_tokens=24)
    alone = harness.run(free)
    for _ in range(2):
        with harness.arriving_together():
            bad, beside = harness.submit(body), harness.submit(free)
        bad.wait(), beside.wait()
        assert isinstance(bad.finish, ErrorEvent), bad.finish
        assert bad.finish.kind is ErrorKind.GRAMMAR_LIMIT and "lexer" in bad.finish.message
        assert (beside.token_ids, beside.logprobs) == (alone.token_ids, alone.logprobs)


def test_a_repeat_extraction_reuses_the_image_kv_and_the_grammar() -> None:
    """Invariant: the same image and schema asked twice reuses the image's KV (cached tokens)
    and the compiled grammar (a hit), and both answers equal the uncached one."""
    image = noise_image(9, 84, 56)
    body = _constrained("extract the receipt", images=1)
    # 8-token exact-reuse blocks on both sides: this prompt is 25 tokens, hits whole blocks.
    off = CacheConfig(vision_enabled=False, prefix_enabled=False, kv_block_tokens=8)
    cold = EngineHarness("qwen2_vl", cache=off, max_batch=4, prefill_chunk_tokens=32)
    try:
        reference = cold.run(body, [image])
    finally:
        cold.close()
    on = CacheConfig(kv_block_tokens=8)
    warm = EngineHarness("qwen2_vl", cache=on, max_batch=4, prefill_chunk_tokens=32)
    try:
        first = warm.run(body, [image])
        second = warm.run(body, [image])
        stats = warm.engine.cache_stats()["grammar"]
    finally:
        warm.close()
    assert second.finish.usage.cached_tokens > 0
    assert (stats["hits"], stats["misses"]) == (1, 1)
    for run in (first, second):
        assert run.token_ids == reference.token_ids
        assert run.logprobs == pytest.approx(reference.logprobs, abs=1e-4)
    jsonschema.validate(json.loads(reference.text), RECEIPT)
