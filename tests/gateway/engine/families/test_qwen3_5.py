"""Qwen3.5 through the engine (families/qwen3_5.py) on the tiny offline checkpoints (mlx-vlm's
own model classes: 3 gated-delta layers, then one full-attention layer, dense or MoE; the
checkpoints' own chat template, which opens a `<think>` block).

Pinned at tolerance zero (token ids and logprobs): the engine's greedy answer equals mlx-vlm's
own `stream_generate` (tests/reference.py, rendered with the template's defaults as the
gateway renders it) with one image, two images and none, in float32, bf16 and 4-bit, including at
the CPU's default 32-token block (rounded up to the family's 64); batched == alone; cached ==
uncached across a 5-turn image conversation, whose warm turns restore recurrent-state
snapshots (in memory here; the disk tier in test_families_disk.py).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from PIL import Image
from support import EngineHarness, Run, chat_body, tiny_model

from gateway.config import CacheConfig
from gateway.engine.families.qwen3_5 import Qwen35
from gateway.metrics import CacheCollector
from tests.gateway.engine.families.common import (
    Request,
    assert_batched_equals_alone,
    assert_cached_equals_uncached,
    assert_reference_answer,
    conversation,
    reference_messages,
)

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures"
QUESTION = "What is in this picture?"
LONG = "Tell me more about the colours and the shapes you can see here."
THINKING = {"enable_thinking": True}  # the template's default, which the gateway renders


@pytest.fixture(scope="module")
def images() -> list[Image.Image]:
    first = Image.open(FIXTURES / "shapes.png").convert("RGB")
    return [first, first.rotate(90)]


@pytest.mark.parametrize(
    ("arch", "weights"),
    [
        ("qwen3_5", "float32"),
        ("qwen3_5", "bfloat16"),
        ("qwen3_5", "q4"),
        ("qwen3_5_moe", "float32"),
    ],
)
def test_greedy_answer_equals_mlx_vlm_generate(
    arch: str, weights: str, images: list[Image.Image]
) -> None:
    """Invariant: engine == mlx-vlm's generate (prompt ids, answer ids, logprobs) with
    0, 1 and 2 images: block forwards of 64 rows line up with mlx-vlm's chunked gated-delta
    scan, and the prompt's last token is a one-row step as there (the MoE arch too)."""
    path = tiny_model(arch, weights)
    h = EngineHarness(path=path, max_batch=4)
    try:
        assert isinstance(h.engine.model, Qwen35)
        assert h.engine.loaded.prefiller.block == 64  # CPU's 32, rounded up
        for question, n in [(QUESTION, 1), ("Hi", 0), (LONG, 2)]:
            body = chat_body(question, images=n, max_tokens=12)
            messages = reference_messages(question, n)
            assert_reference_answer(h, path, body, images[:n], messages, THINKING)
    finally:
        h.close()


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_5_moe"])
def test_batched_equals_alone(arch: str, images: list[Image.Image]) -> None:
    """Invariant: rows decoded together (different prompt lengths: left-padded attention KV
    beside stacked recurrent states; routed experts) answer as each does alone."""
    h = EngineHarness(path=tiny_model(arch), max_batch=8)
    try:
        cases = [(QUESTION, 1), ("Hi", 0), (LONG, 2), ("Short?", 1)]
        requests = [(chat_body(q, images=n, max_tokens=12), images[:n]) for q, n in cases]
        assert_batched_equals_alone(h, requests)
    finally:
        h.close()


def _conversation(h: EngineHarness, image: Image.Image) -> list[Run]:
    """Five turns about the image resending the history, then a new question about it."""
    first = chat_body(LONG, images=1, max_tokens=10)
    then: list[Request] = [(chat_body(QUESTION, images=1, max_tokens=10), [image])]
    return conversation(h, (first, [image]), 5, lambda t: f"And what about part {t}?", then)


def test_cached_equals_uncached(images: list[Image.Image]) -> None:
    """Invariant: a 5-turn image conversation answers the same with the caches as without:
    every warm turn restores the recurrent state from the snapshot at its hit's last block
    end and prefills the rest; the budget counts the snapshots' bytes."""

    def check(cached: EngineHarness, runs: list[Run]) -> None:
        usage = [r.finish.usage for r in runs]
        assert all(u.cached_tokens > 0 and u.cached_tokens % 64 == 0 for u in usage[1:])
        assert [u.cached_tokens for u in usage[1:5]] == sorted(u.cached_tokens for u in usage[1:5])
        stats = cached.engine.cache_stats()["prefix"]
        assert stats["snapshot_hits"] == stats["hits"] == len(runs) - 1
        assert stats["snapshots"] == stats["blocks"] > 0
        assert 0 < stats["snapshot_bytes"] < stats["bytes"]
        families = CacheCollector(cached.engine.cache_stats).collect()
        exported = {f.name: f.samples[0].value for f in families if "snapshot" in f.name}
        assert exported == {
            "vision_gateway_prefix_cache_snapshots": stats["snapshots"],
            "vision_gateway_prefix_cache_snapshot_bytes": stats["snapshot_bytes"],
            "vision_gateway_prefix_cache_snapshot_hits": stats["snapshot_hits"],
        }

    talk = functools.partial(_conversation, image=images[0])
    assert_cached_equals_uncached(tiny_model("qwen3_5"), talk, check, max_batch=4)


def test_without_the_exact_rule_the_prefix_cache_is_off(images: list[Image.Image]) -> None:
    """Invariant: with --no-exact-cache no forward ends at a block boundary, so there are no
    snapshots: the prefix cache is off (the reason in the stats); prompts are prefilled by
    the engine, never in the generator's left-padded prefill, so batched == alone still."""
    h = EngineHarness(path=tiny_model("qwen3_5"), max_batch=8, cache=CacheConfig(exact_reuse=False))
    try:
        cases = [(QUESTION, 0), ("Hi", 0), (LONG, 0), ("Short?", 1)]
        requests = [(chat_body(q, images=n, max_tokens=12), images[:n]) for q, n in cases]
        assert_batched_equals_alone(h, requests)
        stats = h.engine.cache_stats()
        assert stats["family"]["prefix_cache"].startswith("off: recurrent-state snapshots")
        assert stats["prefix"]["hits"] == 0 and stats["prefix"]["blocks"] == 0
    finally:
        h.close()
