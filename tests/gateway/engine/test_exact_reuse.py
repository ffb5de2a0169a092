"""Exact KV reuse on bf16 and quantized weights, and the rule that makes it exact.

Pinned: with the exact-reuse rule (the default) greedy output with caches == without caches,
token ids and logprobs with a tolerance of exactly zero, for bfloat16, 4-bit and 8-bit
checkpoints (mlx-vlm's own quantization) of all three architectures, over a 5-turn
conversation and repeated questions about one image (float32: test_cache_ops.py); the rule
itself, which no CPU number can show (CPU kernels happen to be shape-independent): every
prefill forward is one whole block at a block-aligned absolute position, every hit is whole
blocks, and the batch never prefills a prompt; quantized checkpoints keep their image
features in floating point (they were cast to the packed uint32 weight dtype).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from support import (
    EngineHarness,
    block_shaped,
    chat_body,
    conversation,
    noise_image,
    record_prefill_forwards,
    tiny_model,
)

from gateway.config import CacheConfig
from gateway.engine.families.qwen_vl import QwenVL

ARCHS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
VARIANTS = [(arch, w) for w in ("bfloat16", "q4", "q8") for arch in ARCHS]
QUESTIONS = ["What is in this picture?", "What colours?", "How many shapes?"]


def _repeated_questions(h: EngineHarness) -> list:
    """A question about another image first (so the text before the image is cached and a
    hit can end at the image's start), then several questions about one image, the first
    one asked twice."""
    image, other = noise_image(51, 168, 168), noise_image(52, 168, 168)
    runs = [h.run(chat_body("Warm-up question?", images=1, max_tokens=4), [other])]
    for question in [*QUESTIONS, QUESTIONS[0]]:
        runs.append(h.run(chat_body(question, images=1, max_tokens=8), [image]))
    return runs


def _assert_identical(with_cache: list, without: list) -> None:
    for i, (a, b) in enumerate(zip(with_cache, without, strict=True)):
        assert a.token_ids == b.token_ids, f"request {i + 1}"
        assert a.logprobs == b.logprobs, f"request {i + 1}"  # tolerance exactly zero


@pytest.mark.parametrize(("arch", "weights"), VARIANTS, ids=[f"{a}-{w}" for a, w in VARIANTS])
def test_cached_equals_uncached_bit_for_bit(arch: str, weights: str) -> None:
    cached = EngineHarness(arch, weights, max_batch=4, prefill_chunk_tokens=16)
    plain = EngineHarness(
        arch, weights, max_batch=4, cache=CacheConfig(vision_enabled=False, prefix_enabled=False)
    )
    try:
        image = noise_image(11, 168, 168)
        _assert_identical(conversation(cached, image), conversation(plain, image))
        with_cache, without = _repeated_questions(cached), _repeated_questions(plain)
        _assert_identical(with_cache, without)
        assert with_cache[-1].finish.usage.cached_tokens > 0  # the repeat was a hit
    finally:
        cached.close()
        plain.close()


def test_without_the_rule_cpu_reuse_is_still_exact_on_quantized_weights() -> None:
    """--no-exact-cache on CPU: any-prefix reuse is exact too once image features keep
    their dtype (the measured 4-bit/8-bit drift was the uint32 cast, not kernel shapes)."""
    loose = CacheConfig(exact_reuse=False)
    cached = EngineHarness("qwen2_vl", "q4", max_batch=4, cache=loose)
    off = CacheConfig(vision_enabled=False, prefix_enabled=False, exact_reuse=False)
    plain = EngineHarness("qwen2_vl", "q4", max_batch=4, cache=off)
    try:
        with_cache, without = _repeated_questions(cached), _repeated_questions(plain)
        _assert_identical(with_cache, without)
        assert with_cache[1].finish.usage.cached_tokens == 4  # hit ends at the image start
    finally:
        cached.close()
        plain.close()


def test_every_prefill_forward_is_one_aligned_block() -> None:
    """The rule, observed: prefill forwards are whole blocks at block-aligned absolute
    positions, hits are whole blocks, and the batch only ever steps one token per row (it
    never prefills a prompt, also not for requests arriving together)."""
    h = EngineHarness("qwen3_vl", "q4", max_batch=4)
    block = h.engine.config.cache.exact_block_tokens(on_gpu=False)
    model = h.engine.model
    forwards = record_prefill_forwards(model)
    batch_rows: list[int] = []
    text_core = model.text_core.__call__

    def spy_text_core(inputs, cache=None, **kw):  # noqa: ANN001, ANN003, ANN202
        batch_rows.append(inputs.shape[1])
        return text_core(inputs, cache, **kw)

    type(model.text_core).__call__ = lambda self, *a, **kw: spy_text_core(*a, **kw)
    try:
        image = noise_image(61, 112, 112)
        runs = conversation(h, image, turns=3)
        with h.arriving_together():
            together = [h.submit(chat_body(f"short {i}", max_tokens=3)) for i in range(3)]
        runs += [r.wait() for r in together]
    finally:
        type(model.text_core).__call__ = text_core.__func__  # type: ignore[attr-defined]
        h.close()
    assert forwards and block_shaped(forwards, block)
    assert set(batch_rows) == {1}
    assert all(r.finish.usage.cached_tokens % block == 0 for r in runs)
    assert any(r.finish.usage.cached_tokens > 0 for r in runs)


@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_checkpoints_keep_float_image_features(arch: str) -> None:
    """Image features are cast to the embedding's *output* dtype; for a quantized checkpoint
    the embedding's weight is packed uint32, which truncated features to integers."""
    model = QwenVL(str(tiny_model(arch, "q4")))
    assert model.embed_dtype == mx.float32
    image = noise_image(71, 56, 56)
    pixels, grid = model.preprocess(image)
    features = np.array(model.encode_image(pixels, grid).features)
    out = model.model.vision_tower(mx.array(pixels), mx.array([grid]))
    tower = np.array(out[0] if isinstance(out, tuple) else out)
    assert features.dtype == np.float32
    np.testing.assert_allclose(features, tower, rtol=1e-5, atol=1e-6)
