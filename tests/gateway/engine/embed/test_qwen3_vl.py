"""The Qwen3-VL embedder (engine/embed/qwen3_vl.py) on the tiny Qwen3-VL-Embedding
checkpoint (`make-model --arch qwen3_vl_embedding`).

Pinned: an image's vector and a text's equal mlx-vlm's server's (`_embed_image`, `_embed`
over the model its embedding loader builds) at tolerance zero in float32, for images of
different sizes; images, texts and mixed content computed in one right-padded batch equal
each computed alone, bit for bit; text and an image in one input differ from either alone.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from support import noise_image, tiny_model

from gateway.engine.embed.embedder import Embedder
from gateway.engine.embed.qwen3_vl import QwenVLEmbedder
from gateway.engine.embed.request import EmbedItem, EmbedRefused
from tests.gateway.engine.embed.common import embed_image, vectors
from tests.gateway.engine.embed.reference import Reference

SIZES = [(56, 56), (64, 48), (40, 90)]


@functools.cache
def embedder() -> Embedder:
    return QwenVLEmbedder(str(tiny_model("qwen3_vl_embedding")))


@functools.cache
def reference() -> Reference:
    return Reference(tiny_model("qwen3_vl_embedding"))


@pytest.mark.parametrize("size", SIZES)
def test_image_vector_equals_mlx_vlm_reference_exactly(size: tuple[int, int]) -> None:
    image = noise_image(3, *size)
    ours = vectors(embedder(), [EmbedItem(parts=(embed_image(image),))])[0]
    np.testing.assert_array_equal(ours, reference().image(image))


def test_text_vector_equals_mlx_vlm_reference_exactly() -> None:
    text = "a photo of a cat on a mat"
    np.testing.assert_array_equal(
        vectors(embedder(), [EmbedItem(text=text)])[0], reference().text(text)
    )


def test_batched_vectors_equal_alone_bit_for_bit() -> None:
    items = [
        EmbedItem(parts=(embed_image(noise_image(1, 64, 48)),)),
        EmbedItem(text="short"),
        EmbedItem(parts=("what is this", embed_image(noise_image(2, 40, 90)))),
        EmbedItem(parts=(embed_image(noise_image(3)),)),
        EmbedItem(text="a longer text input than the others in this batch, by far"),
    ]
    batched = vectors(embedder(), items)
    for i, item in enumerate(items):
        np.testing.assert_array_equal(batched[i], vectors(embedder(), [item])[0])


def test_text_with_an_image_is_its_own_input() -> None:
    image = embed_image(noise_image(4))
    both, alone, text = vectors(
        embedder(),
        [EmbedItem(parts=("caption", image)), EmbedItem(parts=(image,)), EmbedItem(text="caption")],
    )
    assert not np.array_equal(both, alone) and not np.array_equal(both, text)


def test_image_placeholder_ids_are_refused() -> None:
    e = embedder()
    assert isinstance(e, QwenVLEmbedder)
    with pytest.raises(EmbedRefused, match="placeholder"):
        e.prepare(EmbedItem(ids=(5, e.image_token_id, 6)))
    # ... and so is text that spells one: in a forward shared with an image input the
    # features would be laid over it (a shape error for the whole batch).
    spelled = e.tokenizer.convert_ids_to_tokens(e.image_token_id)
    with pytest.raises(EmbedRefused, match="placeholder"):
        e.prepare(EmbedItem(text=f"look: {spelled}"))
