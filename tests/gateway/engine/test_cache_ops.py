"""Caches wired into the engine, on every architecture.

Pinned (float32; bf16 and quantized weights in test_exact_reuse.py): greedy output with
caches == without caches, token ids and logprobs bit for bit, for turns 1..5 of a conversation
about one image and for a fresh question on the same image; later turns reuse the earlier
turns' prompt KV in whole blocks (the exact-reuse rule); two images differing in one pixel
share nothing past the text before them; swapping two images' order shares nothing past the
text before them; a stored entry is not mutated by requests that extend it; the prefix
cache holds a conversation's KV once (<= 1.25x its prompt's KV, however many turns), and
two conversations about one image with one system prompt hold those blocks once.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from support import EngineHarness, chat_body, conversation, noise_image

from gateway.config import CacheConfig

ARCHS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


@pytest.fixture(scope="module", params=ARCHS)
def pair(request: pytest.FixtureRequest):
    # Blocks of 16 (not the default 32): another block size, and hits on these small prompts.
    cached = EngineHarness(
        request.param, max_batch=4, prefill_chunk_tokens=16, cache=CacheConfig(kv_block_tokens=16)
    )
    off = CacheConfig(vision_enabled=False, prefix_enabled=False, kv_block_tokens=16)
    plain = EngineHarness(request.param, max_batch=4, cache=off)
    yield cached, plain
    cached.close()
    plain.close()


def test_cached_output_equals_uncached_over_a_conversation(pair) -> None:  # noqa: ANN001
    cached, plain = pair
    image = noise_image(11, 112, 84)
    with_cache = conversation(cached, image)
    without = conversation(plain, image)
    for turn, (a, b) in enumerate(zip(with_cache, without, strict=True)):
        assert a.token_ids == b.token_ids, f"turn {turn + 1}"
        assert a.logprobs == b.logprobs, f"turn {turn + 1}"  # bit for bit
    usage = [r.finish.usage for r in with_cache]
    assert usage[0].cached_tokens == 0 and usage[0].vision_misses == 1
    block = cached.engine.config.cache.kv_block_tokens
    for turn in range(1, 5):
        # Turn N+1 reuses turn N's prompt in whole blocks, and its answer's where the answer
        # prefill (recomputing it in prefill blocks: docs/caching.md) finished before the
        # next turn arrived (test_answer_store.py pins that part).
        previous, current = usage[turn - 1], usage[turn]
        assert current.cached_tokens % block == 0
        assert current.cached_tokens >= previous.prompt_tokens // block * block
    assert usage[-1].cached_tokens >= block  # the fresh question still reuses image blocks
    assert all(u.cached_tokens == 0 for u in (r.finish.usage for r in without))


def test_one_changed_pixel_shares_no_image_kv(pair) -> None:  # noqa: ANN001
    cached, _ = pair
    first = noise_image(21, 84, 56)
    pixels = np.array(first)
    pixels[10, 10, 0] ^= 1
    second = Image.fromarray(pixels)
    a = cached.run(chat_body("Same question", images=1), [first])
    b = cached.run(chat_body("Same question", images=1), [second])
    image_start = cached.engine.model.tokenize(
        cached.engine.model.render([{"role": "user", "content": [{"type": "image"}]}])
    ).index(cached.engine.model.image_token_id)
    assert a.finish.usage.vision_misses == 1 and b.finish.usage.vision_misses == 1
    assert b.finish.usage.cached_tokens <= image_start
    # Control: the unchanged image does hit, so the check above is not met by an empty cache.
    c = cached.run(chat_body("Same question", images=1), [first])
    block = cached.engine.config.cache.kv_block_tokens  # hits are whole exact-reuse blocks
    usage = c.finish.usage
    assert usage.cached_tokens == (usage.prompt_tokens - 1) // block * block > 0


def test_swapped_images_share_no_image_kv(pair) -> None:  # noqa: ANN001
    cached, _ = pair
    x, y = noise_image(31), noise_image(32)
    cached.run(chat_body("Compare", images=2), [x, y])
    swapped = cached.run(chat_body("Compare", images=2), [y, x])
    assert swapped.finish.usage.vision_hits == 2  # features are per image, order-free
    image_start = 3  # "<|im_start|>user\n" precedes <|vision_start|>
    assert swapped.finish.usage.cached_tokens <= image_start + 1
    # Control: the same order again hits past both images.
    again = cached.run(chat_body("Compare", images=2), [x, y])
    block = cached.engine.config.cache.kv_block_tokens  # hits are whole exact-reuse blocks
    usage = again.finish.usage
    assert usage.cached_tokens == (usage.prompt_tokens - 1) // block * block > 0


def test_stored_entry_is_not_mutated_by_extensions(pair) -> None:  # noqa: ANN001
    cached, plain = pair
    image = noise_image(41, 56, 56)
    body = chat_body("Repeat me", images=1, max_tokens=6)
    first = cached.run(body, [image])
    for i in range(3):  # requests that extend the stored prefix in different directions
        cached.run(chat_body(f"Repeat me, variant {i}", images=1, max_tokens=6), [image])
    again = cached.run(body, [image])
    reference = plain.run(body, [image])
    assert first.token_ids == again.token_ids == reference.token_ids
    assert again.logprobs == reference.logprobs
    block = cached.engine.config.cache.kv_block_tokens
    usage = again.finish.usage
    assert usage.cached_tokens == (usage.prompt_tokens - 1) // block * block


def test_stored_kv_holds_only_its_accounted_bytes() -> None:
    """Invariant: MLX memory held by cache entries is what the budget counts. (A lazy KV
    slice of a batch buffer once pinned every row's whole buffer per entry: 300 MB held for
    8 MB accounted under load.)"""
    import mlx.core as mx

    h = EngineHarness("qwen2_vl", max_batch=8)
    try:
        h.run(chat_body("warm up", max_tokens=2))
        mx.clear_cache()
        before = mx.get_active_memory()
        for wave in range(4):  # concurrent rows, so entries come out of shared batch buffers
            runs = [
                h.submit(chat_body(f"wave {wave} question {i} " * 8, max_tokens=12))
                for i in range(8)
            ]
            for run in runs:
                run.wait()
        held = mx.get_active_memory() - before
        stats = h.engine.cache_stats()
        accounted = stats["prefix"]["bytes"] + stats["vision"]["bytes"]
        assert stats["prefix"]["entries"] >= 16
        assert held <= accounted + 2 * 1024 * 1024, (held, accounted)
    finally:
        h.close()


def _kv_bytes_per_token(h: EngineHarness) -> int:
    stats = h.engine.cache_stats()["prefix"]
    assert stats["unique_tokens"] > 0
    return stats["bytes"] // stats["unique_tokens"]


def test_a_conversation_is_held_once() -> None:
    """Invariant: after 6 turns about one image the prefix cache holds <= 1.25x the KV of the
    last prompt (block granularity included): every turn's blocks are shared with the next;
    the snapshot cache held each turn's whole history again (~3.9x after 6 turns)."""
    h = EngineHarness("qwen2_vl", max_batch=2, cache=CacheConfig(kv_block_tokens=16))
    try:
        runs = conversation(h, noise_image(51, 112, 84), turns=6, fresh=False)
        stats = h.engine.cache_stats()["prefix"]
        last_prompt = runs[-1].finish.usage.prompt_tokens
        assert stats["bytes"] <= 1.25 * last_prompt * _kv_bytes_per_token(h)
        assert stats["entries"] == 1 and stats["sharing_ratio"] == 1.0
        assert runs[-1].finish.usage.cached_tokens == runs[-2].finish.usage.prompt_tokens // 16 * 16
    finally:
        h.close()


def test_two_conversations_share_system_prompt_and_image_blocks() -> None:
    """Invariant: two conversations with one system prompt and one image, asking different
    questions, store the blocks before their first different token once (shared blocks);
    each then adds only its own blocks. Answer prefill is off: it stores the first answer's
    blocks in spare time, so whether they are in the count would depend on timing."""
    cache = CacheConfig(kv_block_tokens=16, answer_prefill=False)
    h = EngineHarness("qwen2_vl", max_batch=2, cache=cache)
    system = {"role": "system", "content": "You look at pictures carefully. " * 4}
    image = noise_image(52, 112, 84)
    questions = ("What colour dominates?", "Count the shapes, please.")
    try:
        runs = []
        for question in questions:
            body = chat_body(question, images=1)
            body["messages"] = [system, *body["messages"]]
            runs.append(h.run(body, [image]))
        model = h.engine.model
        a, b = (
            model.tokenize(
                model.render([system, {"role": "user", "content": [{"type": "image"}, q]}])
            )
            for q in ({"type": "text", "text": q} for q in questions)
        )
        first_diff = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        first_diff += runs[0].finish.usage.prompt_tokens - len(a)  # the image's run expanded
        stats = h.engine.cache_stats()["prefix"]
        assert stats["entries"] == 2 and stats["shared_blocks"] == first_diff // 16 > 2
        both = sum(r.finish.usage.prompt_tokens // 16 for r in runs)
        assert stats["blocks"] == both - stats["shared_blocks"]  # each block held once
        assert stats["stored_tokens"] == both * 16  # the entries stand for both prompts
        assert runs[1].finish.usage.cached_tokens == first_diff // 16 * 16
    finally:
        h.close()
