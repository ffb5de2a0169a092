"""Gemma 3n through the engine (families/gemma3n.py) on the tiny offline checkpoint (mlx-vlm's
own model classes; 10 layers of which the last 4 share KV, 6 caches; AltUp, Laurel,
per-layer inputs; a 48-token window; mlx-vlm 0.7.10's full MobileNetV5 tower at 256 px,
256 soft tokens per image).

Pinned at tolerance zero (token ids and logprobs): the engine's greedy answer equals mlx-vlm's
own `stream_generate` (tests/reference.py) with no image (short, and past the window) and
with one image, in float32; cached == uncached (prefix blocks over the KV-sharing layers,
follow-up turns, a new question about the same image: vision hit and blocks); batched ==
alone (text and image rows). Audio: tests/gateway/engine/families/test_gemma3n_audio.py.

The tower costs tens of seconds per image on a CPU (its size is fixed in mlx-vlm), so each
image test encodes as few images as its invariant needs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image
from support import EngineHarness, Run, chat_body, tiny_model

from gateway.engine.families.gemma3n import Gemma3n
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
LONG = (
    "Tell me more about the colours and the shapes you can see here, and then say what they "
    "remind you of, in a few words, and why."
)


@pytest.fixture(scope="module")
def image() -> Image.Image:
    return Image.open(FIXTURES / "shapes.png").convert("RGB")


def test_text_answer_equals_mlx_vlm_generate() -> None:
    """Invariant: engine == mlx-vlm's generate (prompt ids, answer ids, logprobs) for text
    prompts, one shorter than the 48-token window and one past it (the ring wrapped, the
    KV-sharing layers reading the fetched window)."""
    path = tiny_model("gemma3n")
    h = EngineHarness(path=path, max_batch=2)
    try:
        assert isinstance(h.engine.model, Gemma3n)
        for question in ("Hi", LONG):
            body = chat_body(question, images=0, max_tokens=12)
            run = assert_reference_answer(h, path, body, [], reference_messages(question, 0))
            assert len(run.token_ids) == 12
    finally:
        h.close()


def test_image_answer_equals_mlx_vlm_generate(image: Image.Image) -> None:
    """Invariant: engine == mlx-vlm's generate with one image (256 soft tokens between the
    markers, blocks crossing the image, the vision block's ids embedded by `embed_vision`)."""
    path = tiny_model("gemma3n")
    h = EngineHarness(path=path, max_batch=2)
    try:
        body = chat_body(QUESTION, images=1, max_tokens=8)
        assert_reference_answer(h, path, body, [image], reference_messages(QUESTION, 1))
    finally:
        h.close()


def test_cached_equals_uncached(image: Image.Image) -> None:
    """Invariant: prefix-block hits (a follow-up turn resending the history with the image;
    a new question about the same image) and the vision hit change no token id and no
    logprob; the KV-sharing layers read restored blocks as they read computed ones."""

    def talk(h: EngineHarness) -> list[Run]:
        first = chat_body(QUESTION, images=1, max_tokens=8)
        then: list[Request] = [(chat_body(LONG, images=1, max_tokens=8), [image])]
        return conversation(h, (first, [image]), 2, lambda t: f"And part {t}?", then)

    def check(cached: EngineHarness, runs: list[Run]) -> None:
        del cached
        hits = [r.finish.usage.cached_tokens for r in runs]
        assert hits[0] == 0 and all(h >= 256 for h in hits[1:]), hits
        assert runs[2].finish.usage.vision_hits == 1

    assert_cached_equals_uncached(tiny_model("gemma3n"), talk, check, max_batch=2)


def test_text_turns_cached_equal_uncached() -> None:
    """Invariant: a text conversation's later turns, prefilled from cached blocks of the
    sliding, full and (through them) KV-sharing layers, answer as without caches."""

    def talk(h: EngineHarness) -> list[Run]:
        first = chat_body(LONG, images=0, max_tokens=10)
        return conversation(h, (first, []), 3, lambda t: f"And what about part {t}?")

    def check(cached: EngineHarness, runs: list[Run]) -> None:
        del cached
        assert all(r.finish.usage.cached_tokens >= 32 for r in runs[1:])

    assert_cached_equals_uncached(tiny_model("gemma3n"), talk, check, max_batch=2)


def test_batched_equals_alone(image: Image.Image) -> None:
    """Invariant: rows decoded together (different prompt lengths, ring phases, left padding,
    an image row and text rows) answer as each does alone."""
    h = EngineHarness(path=tiny_model("gemma3n"), max_batch=4)
    try:
        cases = [("Hi", []), (QUESTION, [image]), (LONG, []), ("Short?", [])]
        requests = [(chat_body(q, images=len(m), max_tokens=10), m) for q, m in cases]
        assert_batched_equals_alone(h, requests)
    finally:
        h.close()


def test_registry_maps_gemma3n_to_its_family() -> None:
    """Invariant: a `model_type` "gemma3n" checkpoint is served by `Gemma3n`, and errors
    name it."""
    from gateway.engine.families.registry import family_for, supported_families

    assert family_for({"model_type": "gemma3n", "vision_config": {}}) is Gemma3n
    assert "gemma3n" in supported_families()
