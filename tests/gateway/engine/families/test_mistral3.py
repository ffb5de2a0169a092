"""Mistral 3 (Pixtral vision) through the engine (families/mistral3.py), at tolerance zero.

Pinned, on the tiny mistral3 checkpoint (mlx-vlm's own classes, Mistral Small 3.1's
template): the greedy answer through the engine equals mlx-vlm's own generate on the same
checkpoint, images and question (prompt ids, token ids and logprobs), in float32 and bfloat16,
with one image, two images in one turn and a wide one; cached == uncached (vision cache, KV
blocks, a prefix hit that ends inside an image span, a follow-up turn; the disk tier after a
restart: test_families_disk.py); batched == alone; a one-pixel change misses both caches and
answers as the reference does for the changed image.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image
from reference import reference_generate
from support import EngineHarness, Run, chat_body, tiny_model

from gateway.config import CacheConfig
from gateway.engine.families.mistral3 import Mistral3
from tests.gateway.engine.families.common import (
    assert_batched_equals_alone,
    assert_cached_equals_uncached,
    assert_one_pixel_misses,
    assert_reference_answer,
    conversation,
    engine_request,
    one_pixel_changed,
)

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures"
SHAPES = Image.open(FIXTURES / "shapes.png").convert("RGB")  # 448 x 448: 8 x 8 cells
SMALL = Image.open(FIXTURES / "shapes-56.png").convert("RGB")  # 56 x 56: 2 x 2 cells
WIDE = SHAPES.resize((640, 360))  # -> 224 x 126 px -> 8 x 5 cells
QUESTION = "What is in this picture?"
# An explicit system message: without one the template writes today's date, whose tokens
# (and so where the 32-token blocks fall) change from day to day.
SYSTEM = "You describe pictures briefly."


def _messages(question: str, images: int, system: bool = True) -> list[dict]:
    parts = [{"type": "image"}] * images + [{"type": "text", "text": question}]
    # (Mistral Small 3.1's template reads a first system message as a list of parts.)
    head = [{"role": "system", "content": [{"type": "text", "text": SYSTEM}]}] if system else []
    return [*head, {"role": "user", "content": parts}]


def _body(question: str, images: int, max_tokens: int = 12, system: bool = True) -> dict:
    body = chat_body(question, images=images, max_tokens=max_tokens)
    if system:
        body["messages"] = [{"role": "system", "content": SYSTEM}, *body["messages"]]
    return body


@pytest.fixture(scope="module")
def harness():
    h = EngineHarness("mistral3", max_batch=4)
    yield h
    h.close()


CASES = {"one": [SHAPES], "two": [SHAPES, SMALL], "wide-and-small": [WIDE, SMALL]}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("system", [True, False], ids=["system", "default-system"])
def test_greedy_answer_equals_mlx_vlm_generate(
    harness: EngineHarness, case: str, system: bool
) -> None:
    """Invariant: engine (exact-reuse blocks, stepwise tower, batched decode) == mlx-vlm's
    generate on its single-BOS prompt: prompt ids, token ids and logprobs."""
    images = CASES[case]
    body = _body(QUESTION, len(images), system=system)
    messages = _messages(QUESTION, len(images), system)
    run = assert_reference_answer(harness, tiny_model("mistral3"), body, images, messages)
    assert len(set(run.token_ids)) > 1  # not a collapsed answer: the comparison means something


@pytest.mark.parametrize("weights", ["bfloat16", "q4", "q8"])
def test_other_weights_answer_as_mlx_vlm_generate(weights: str) -> None:
    """Invariant: the same in bfloat16 (features, embeddings and KV in the checkpoint's
    dtype) and for 4- and 8-bit quantized checkpoints (mlx-vlm's converter)."""
    path = tiny_model("mistral3", weights)
    h = EngineHarness(path=path, max_batch=2)
    try:
        images = [SHAPES, SMALL]
        ref = reference_generate(path, _messages(QUESTION, 2), images, max_tokens=10)
        run = h.run(_body(QUESTION, 2, max_tokens=10), images)
        assert run.token_ids == list(ref.token_ids)
        assert run.logprobs == list(ref.logprobs)
    finally:
        h.close()


def _span(h: EngineHarness, body: dict, images: list[Image.Image]) -> tuple[int, int]:
    layout = engine_request(h, body, images).images[0].layout
    return layout.start, layout.end


FRESH = "A different question about it"


def _conversation(h: EngineHarness) -> list[Run]:
    """Three turns about SHAPES, each resending the history, then a new question about it
    (this module's fixed system message in each)."""
    first = (_body(QUESTION, 1, max_tokens=8), [SHAPES])
    then = [(_body(FRESH, 1, max_tokens=8), [SHAPES])]
    return conversation(h, first, 3, lambda t: f"Tell me more, part {t}.", then)


def test_cached_equals_uncached() -> None:
    """Invariant: a conversation about one image answers the same, token ids and logprobs,
    with both caches on as with both off; the follow-up turns and the fresh question hit the
    prefix cache, and the fresh question's hit ends inside the image span (the rest of the
    span comes from the vision cache)."""

    def check(cached: EngineHarness, runs: list[Run]) -> None:
        assert all(r.finish.usage.cached_tokens > 0 for r in runs[1:])
        fresh = runs[-1].finish.usage
        start, end = _span(cached, _body(FRESH, 1), [SHAPES])
        assert start < fresh.cached_tokens < end  # resumed mid-image
        assert fresh.vision_hits == 1 and fresh.vision_misses == 0

    assert_cached_equals_uncached(tiny_model("mistral3"), _conversation, check, max_batch=4)


def test_vision_cache_alone_equals_uncached() -> None:
    """Invariant: features from the vision cache (prefix cache off) give the answer a fresh
    encode gives, for an image seen alone and then next to another one."""
    h = EngineHarness("mistral3", max_batch=2, cache=CacheConfig(prefix_enabled=False))
    try:
        first = h.run(_body(QUESTION, 2), [SHAPES, SMALL])
        again = h.run(_body(QUESTION, 2), [SHAPES, SMALL])
        swapped = h.run(_body(QUESTION, 2), [SMALL, SHAPES])
        assert again.finish.usage.vision_hits == 2
        assert swapped.finish.usage.vision_hits == 2
        assert (again.token_ids, again.logprobs) == (first.token_ids, first.logprobs)
        ref = reference_generate(
            tiny_model("mistral3"), _messages(QUESTION, 2), [SMALL, SHAPES], max_tokens=12
        )
        assert (swapped.token_ids, swapped.logprobs) == (list(ref.token_ids), list(ref.logprobs))
    finally:
        h.close()


def test_batched_equals_alone(harness: EngineHarness) -> None:
    """Invariant: image and text requests decoded together answer as each does alone."""
    requests = [
        (_body(QUESTION, 1), [SHAPES]),
        (_body("Describe both.", 2), [WIDE, SMALL]),
        (_body("No picture today, just say hello.", 0), []),
        (_body("And this one?", 1), [SMALL]),
    ]
    assert_batched_equals_alone(harness, requests, clear_caches=True)


def test_one_pixel_change_misses_both_caches(harness: EngineHarness) -> None:
    """Invariant: an image one pixel away from a cached one shares no cache entry: its
    prefix hit stops before the image, the tower runs again, and the answer is the
    reference's for the changed image."""
    _, run = assert_one_pixel_misses(harness, _body(QUESTION, 1), SHAPES, (200, 200))
    changed = one_pixel_changed(SHAPES, (200, 200))
    ref = reference_generate(
        tiny_model("mistral3"), _messages(QUESTION, 1), [changed], max_tokens=12
    )
    assert (run.token_ids, run.logprobs) == (list(ref.token_ids), list(ref.logprobs))


def test_describe_says_every_cache_is_on(harness: EngineHarness) -> None:
    """Invariant: full-attention KV in every layer: no cache is turned off for mistral3."""
    family = harness.engine.cache_stats()["family"]
    assert isinstance(harness.engine.model, Mistral3)
    assert family == {
        "family": "mistral3",
        "model_type": "mistral3",
        "media": ["image"],
        "prefix_cache": "on",
        "vision_cache": "on",
        "vision_groups": True,  # grouped tower calls keep each image's bits on this CPU
    }


def test_tower_steps_and_span_embeddings_are_mlx_vlms() -> None:
    """Invariant: the stepwise tower (one unit per step: the patch convolution, then each
    encoder layer, per image) gives, stepwise or in one graph, each image's span rows of the
    input embeddings mlx-vlm builds for the two images together (features, [IMG_BREAK] and
    [IMG_END] rows), bit for bit."""
    import mlx.core as mx
    import numpy as np
    from mlx_vlm.utils import prepare_inputs

    family = Mistral3(str(tiny_model("mistral3")))  # MLX on this thread
    images = [SHAPES, SMALL]
    inputs = [family.preprocess(i) for i in images]

    def run(stepwise: bool) -> tuple[int, list]:
        steps, units = family.encode_steps_many(inputs, lambda: stepwise), 0
        while True:
            try:
                next(steps)
                units += 1
            except StopIteration as done:
                return units, done.value

    units, encoded = run(True)
    layers = len(family.model.vision_tower.vision_model.transformer.layers)
    assert units == len(images) * (1 + layers)
    assert run(False)[0] == 0
    prompt = family.render(_messages(QUESTION, 2))
    prepared = prepare_inputs(family.processor, images=images, prompts=prompt)
    embeds = family.model.get_input_embeddings(
        prepared["input_ids"], prepared["pixel_values"], image_sizes=prepared["image_sizes"]
    ).inputs_embeds[0]
    ids, layouts = family.layout_prompt(family.tokenize(prompt), [g for _, g in inputs])
    for layout, image, alone in zip(layouts, encoded, run(False)[1], strict=True):
        want = np.asarray(embeds[layout.start + 1 : layout.end + 1])  # + 1: the extra BOS
        assert np.array_equal(np.asarray(image.features), want)
        assert mx.array_equal(image.features, alone.features).item()


def test_without_the_exact_rule_answers_still_equal_mlx_vlm() -> None:
    """Invariant: with --no-exact-cache (the image part in budget-sized chunks, the text part
    through `text_core`) the greedy answer is still mlx-vlm's, cached or not."""
    h = EngineHarness("mistral3", max_batch=2, cache=CacheConfig(exact_reuse=False))
    try:
        body = _body(QUESTION, 1)
        first, second = h.run(body, [SHAPES]), h.run(body, [SHAPES])
        ref = reference_generate(
            tiny_model("mistral3"), _messages(QUESTION, 1), [SHAPES], max_tokens=12
        )
        assert first.token_ids == list(ref.token_ids) == second.token_ids
        assert second.finish.usage.cached_tokens > 0
    finally:
        h.close()


def test_the_registry_serves_mistral3_with_this_family() -> None:
    from gateway.engine.families import load_model
    from gateway.engine.families.registry import family_for, supported_families

    assert family_for({"model_type": "mistral3", "vision_config": {}}) is Mistral3
    assert "mistral3" in supported_families()
    assert isinstance(load_model(str(tiny_model("mistral3")), lazy=True), Mistral3)
