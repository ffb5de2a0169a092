"""Quantized KV (`--kv-bits 8 | 4`) through the engine: still exact, and smaller.

Pinned: at 8 and 4 bits a request served from cached (quantized) blocks gives the tokens and
logprobs, bit for bit, of the same server computing them afresh: a 5-turn image conversation
and a fresh question on Qwen2-VL (float32 and bfloat16), Qwen2.5-VL (heads 32 wide:
`kv_support.wide_heads`) and Mistral 3, a multi-turn text conversation on a text model
(Qwen3); rows decoding together get what they get alone; the prefix cache's bytes for a
fixed conversation shrink to <= 0.55x (8 bits) and <= 0.3x (4 bits) of the unquantized
server's, with the same blocks held, and the budget counts the quantized arrays' bytes (what
MLX holds); /v1/cache/stats names the KV's dtype, bits and group size and the bytes per
cached token (and /metrics the same).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
from kv_support import wide_heads
from support import EngineHarness, chat_body, conversation, noise_image, tiny_model

from gateway.config import CacheConfig
from gateway.engine.model.kv import block_nbytes

BITS = [8, 4]
IMAGE = noise_image(11, 168, 168)


def _engines(path: Path, bits: int, **cache: object) -> tuple[EngineHarness, EngineHarness]:
    """An engine with both caches and one without, both holding KV at `bits`."""
    quant = {"kv_bits": bits, "kv_group_size": 32, **cache}
    cached = EngineHarness(path=path, max_batch=4, cache=CacheConfig(**quant))  # type: ignore[arg-type]
    off = CacheConfig(vision_enabled=False, prefix_enabled=False, **quant)  # type: ignore[arg-type]
    return cached, EngineHarness(path=path, max_batch=4, cache=off)


def _assert_identical(with_cache: list, without: list) -> None:
    for i, (a, b) in enumerate(zip(with_cache, without, strict=True)):
        assert a.token_ids == b.token_ids, f"request {i + 1}"
        assert a.logprobs == b.logprobs, f"request {i + 1}"  # tolerance exactly zero


def _text_conversation(h: EngineHarness, turns: int = 4) -> list:
    messages = [{"role": "user", "content": "Tell me a long story about a lighthouse. " * 3}]
    runs = []
    for turn in range(turns):
        body = {"model": "t", "temperature": 0, "max_tokens": 8, "logprobs": True}
        run = h.run({**body, "messages": messages})
        runs.append(run)
        messages = [
            *messages,
            {"role": "assistant", "content": run.text},
            {"role": "user", "content": f"And then, part {turn + 2}?"},
        ]
    return runs


# Vision-language checkpoints whose heads MLX can quantize (32 wide): mlx-vlm's Qwen2-VL and
# Qwen2.5-VL attention (our TextCore decodes), and Mistral 3's (on VlmFamily).
VISION = {
    "qwen2_vl-float32": lambda: wide_heads("qwen2_vl"),
    "qwen2_vl-bfloat16": lambda: wide_heads("qwen2_vl", "bfloat16"),
    "qwen2_5_vl-float32": lambda: wide_heads("qwen2_5_vl"),
    "mistral3-float32": lambda: tiny_model("mistral3"),
}


@pytest.mark.parametrize("checkpoint", list(VISION))
@pytest.mark.parametrize("bits", BITS)
def test_cached_image_conversation_equals_uncached(bits: int, checkpoint: str) -> None:
    """Invariant: a 5-turn image conversation and a fresh question about the image, served
    from quantized blocks, equal the uncached server at the same bits, bit for bit."""
    cached, plain = _engines(VISION[checkpoint](), bits)
    try:
        with_cache, without = conversation(cached, IMAGE), conversation(plain, IMAGE)
        _assert_identical(with_cache, without)
        assert all(r.finish.usage.cached_tokens > 0 for r in with_cache[1:])
    finally:
        cached.close()
        plain.close()


@pytest.mark.parametrize("bits", BITS)
def test_cached_text_conversation_equals_uncached(bits: int) -> None:
    """Invariant: the same for a text model through mlx-lm's own attention (Qwen3)."""
    cached, plain = _engines(tiny_model("qwen3"), bits)
    try:
        with_cache, without = _text_conversation(cached), _text_conversation(plain)
        _assert_identical(with_cache, without)
        assert all(r.finish.usage.cached_tokens > 0 for r in with_cache[1:])
    finally:
        cached.close()
        plain.close()


def test_rows_decoding_together_equal_alone() -> None:
    """Invariant (CPU): image and text rows of different lengths decoding together in one
    quantized batch each get the tokens and logprobs they get alone."""
    h = EngineHarness(path=wide_heads("qwen2_vl"), max_batch=4, cache=_quant(8))
    bodies = [
        (chat_body("What is in this picture?", images=1, max_tokens=10), [IMAGE]),
        (chat_body("short", max_tokens=12), []),
        (chat_body("a much longer question about nothing in particular " * 3), []),
    ]
    try:
        alone = [h.run(body, images) for body, images in bodies]
        h.engine.reset_caches()  # the batch computes afresh, as alone did first
        with h.arriving_together():
            runs = [h.submit(body, images) for body, images in bodies]
        _assert_identical([r.wait() for r in runs], alone)
    finally:
        h.close()


def _quant(bits: int, **cache: object) -> CacheConfig:
    return CacheConfig(kv_bits=bits, kv_group_size=32, **cache)  # type: ignore[arg-type]


def _fixed_conversation(h: EngineHarness) -> None:
    """Three turns whose history does not depend on the answers (fixed assistant turns)."""
    messages: list[dict] = []
    for turn in range(3):
        question = {"type": "text", "text": f"Question {turn}: what else do you see?"}
        image = {"type": "image_url", "image_url": {"url": "x"}}
        messages = [*messages, {"role": "user", "content": [image, question]}]
        body = {"model": "t", "temperature": 0, "max_tokens": 4, "messages": messages}
        h.run(body, [IMAGE] * (turn + 1))
        messages = [*messages, {"role": "assistant", "content": f"A fixed answer {turn}."}]


def test_stored_bytes_shrink_with_the_bits() -> None:
    """Invariant: a fixed conversation's prefix-cache bytes at 8 bits are <= 0.55x and at 4
    bits <= 0.3x those of the unquantized server, over the same blocks; the stats say how
    the KV is held and what a cached token costs."""
    stats, metrics = {}, {}
    for bits in (0, 8, 4):
        h = EngineHarness(path=wide_heads("qwen2_vl"), cache=_quant(bits, answer_prefill=False))
        try:
            _fixed_conversation(h)
            stats[bits] = h.engine.cache_stats()["prefix"]
            metrics[bits] = h.metrics.render().decode()
        finally:
            h.close()
    full, eight, four = stats[0], stats[8], stats[4]
    assert full["blocks"] == eight["blocks"] == four["blocks"] > 0
    assert eight["bytes"] <= 0.55 * full["bytes"] and four["bytes"] <= 0.3 * full["bytes"]
    assert full["bytes_per_token"] == full["bytes"] / full["unique_tokens"]
    assert (full["kv_dtype"], full["kv_quantized"], full["kv_bits"]) == ("float32", False, 32)
    assert (four["kv_dtype"], four["kv_quantized"], four["kv_bits"]) == ("float32", True, 4)
    assert four["kv_group_size"] == 32 and full["kv_group_size"] == 0
    assert "vision_gateway_kv_cache_bits 4.0" in metrics[4]  # /metrics: the same source
    assert f"vision_gateway_prefix_cache_bytes_per_token {four['bytes_per_token']}" in metrics[4]


def test_the_budget_counts_the_quantized_bytes_mlx_holds() -> None:
    """Invariant: each stored block counts the bytes of its packed arrays, scales and biases
    (the budget's total is their sum), and MLX holds no more than that for the entries."""
    h = EngineHarness(path=wide_heads("qwen2_vl"), max_batch=4, cache=_quant(4))
    try:
        h.run(chat_body("warm up", max_tokens=2))
        mx.clear_cache()
        before = mx.get_active_memory()
        runs = [h.submit(chat_body(f"question {i} " * 12, max_tokens=6)) for i in range(6)]
        for run in runs:
            run.wait()
        held = mx.get_active_memory() - before
        prefix = h.engine.loaded.cache_ops.prefix
        nodes = {id(n): n for leaf, _ in prefix._tree.leaves() for n in leaf.path()}
        blocks = [n.block for n in nodes.values() if n.block is not None]
        assert sum(block_nbytes(b.value) for b in blocks) == prefix.stats().bytes > 0
        assert all(isinstance(k, tuple) and len(k) == 3 for b in blocks for k, _ in b.value)
        assert held <= prefix.stats().bytes + 2 * 1024 * 1024, held
    finally:
        h.close()
