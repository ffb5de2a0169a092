"""The text embedder (engine/embed/text.py) on the tiny Qwen3-Embedding checkpoint
(`make-model --arch qwen3_embedding`: Qwen3 in the sentence-transformers layout, last-token
pooling).

Pinned: each vector equals mlx-vlm's server's (`_embed` over the model its embedding loader
builds) at tolerance zero in float32; a vector computed in a right-padded batch equals the
vector alone, bit for bit; `dimensions` keeps a prefix and renormalizes; what it cannot
embed (an image, an empty or over-long input, an id outside the vocabulary) is refused.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
from support import noise_image, tiny_model

from gateway.engine.embed.embedder import Embedder
from gateway.engine.embed.request import EmbedItem, EmbedRefused
from gateway.engine.embed.text import TextEmbedder
from tests.gateway.engine.embed.common import embed_image, vectors
from tests.gateway.engine.embed.reference import Reference

TEXTS = ["hello world", "a much longer sentence about the cats and the dogs of the town", "x"]


@functools.cache
def embedder() -> Embedder:
    return TextEmbedder(str(tiny_model("qwen3_embedding")))


@functools.cache
def reference() -> Reference:
    return Reference(tiny_model("qwen3_embedding"))


@pytest.mark.parametrize("text", TEXTS)
def test_vector_equals_mlx_vlm_reference_exactly(text: str) -> None:
    ours = vectors(embedder(), [EmbedItem(text=text)])[0]
    np.testing.assert_array_equal(ours, reference().text(text))


def test_batched_vectors_equal_alone_bit_for_bit() -> None:
    items = [EmbedItem(text=t) for t in TEXTS]
    batched = vectors(embedder(), items)
    for i, item in enumerate(items):
        np.testing.assert_array_equal(batched[i], vectors(embedder(), [item])[0])


def test_token_ids_embed_as_their_text() -> None:
    ids = embedder().prepare(EmbedItem(text=TEXTS[1])).ids
    np.testing.assert_array_equal(
        vectors(embedder(), [EmbedItem(ids=ids)]), vectors(embedder(), [EmbedItem(text=TEXTS[1])])
    )


def test_dimensions_keep_a_renormalized_prefix() -> None:
    full = vectors(embedder(), [EmbedItem(text=TEXTS[0])])[0]
    short = vectors(embedder(), [EmbedItem(text=TEXTS[0])], dimensions=16)[0]
    assert short.shape == (16,)
    assert abs(float(np.linalg.norm(short)) - 1.0) < 1e-5
    np.testing.assert_allclose(short, full[:16] / np.linalg.norm(full[:16]), rtol=1e-5)


def test_refusals() -> None:
    e = embedder()
    with pytest.raises(EmbedRefused, match="text only"):
        e.prepare(EmbedItem(parts=(embed_image(noise_image(1)),)))
    with pytest.raises(EmbedRefused, match="empty"):
        e.prepare(EmbedItem(text=""))
    with pytest.raises(EmbedRefused, match="vocabulary"):
        e.prepare(EmbedItem(ids=(1, 10**6)))
    short = dataclasses.replace(e.card, max_tokens=3)
    object.__setattr__(e, "card", short)
    try:
        with pytest.raises(EmbedRefused, match="over this model's 3"):
            e.prepare(EmbedItem(text=TEXTS[1]))
    finally:
        embedder.cache_clear()


def test_card_says_matryoshka_and_the_full_size() -> None:
    card = embedder().card
    assert card.matryoshka and card.dimensions == 64 and card.media == frozenset()
