"""The Qwen3-VL reranker (engine/embed/qwen3_vl_reranker.py) on the tiny checkpoint
(`make-model --arch qwen3_vl_reranker`, served with `--task rerank`).

Pinned: each pair's score equals mlx-vlm's `_score_vl_batch` over that one document (the
model its `load_reranker` loads) at tolerance zero, for text, an image query, an image
document, and both with images and text; scores of those pairs in one right-padded batch
(the per-image tower outputs merged) equal each alone, bit for bit; the engine scores a
repeated image with no second tower pass.
"""

from __future__ import annotations

import base64
import functools
import io
from typing import Any

import pytest
from PIL import Image
from support import noise_image, tiny_model

from gateway.config import EngineConfig
from gateway.engine.embed.embedder import as_numpy
from gateway.engine.embed.engine import EmbedEngine
from gateway.engine.embed.qwen3_vl_reranker import QwenVLReranker
from gateway.engine.embed.request import Embed, EmbedItem, RerankSide
from tests.gateway.engine.embed.common import embed_image

QUERY_IMAGE, DOC_IMAGE = noise_image(1, 64, 48), noise_image(2, 56, 56)


@functools.cache
def reranker() -> QwenVLReranker:
    return QwenVLReranker(str(tiny_model("qwen3_vl_reranker")))


@functools.cache
def reference() -> tuple[Any, Any]:
    from mlx_vlm.reranker_loader import load_reranker
    from mlx_vlm.server import reranking

    path = str(tiny_model("qwen3_vl_reranker"))
    model, processor = load_reranker(path)
    reranking.ensure_chat_template(processor, path)
    return model, processor


def _uri(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _side(text: str, image: Image.Image | None) -> RerankSide:
    return RerankSide(text, embed_image(image) if image is not None else None)


CASES = [
    ("what is a cat", None, "a cat is a small animal", None),
    ("what is this", QUERY_IMAGE, "a drawing of shapes", None),
    ("find the picture", None, "", DOC_IMAGE),
    ("", QUERY_IMAGE, "its caption", DOC_IMAGE),
]


def _reference(case: tuple[str, Any, str, Any]) -> float:
    from mlx_vlm.server import reranking

    model, processor = reference()
    model.language_model._position_ids = None  # (as a fresh load: no positions kept)
    model.language_model._rope_deltas = None
    q_text, q_image, d_text, d_image = case

    def item(text: str, image: Image.Image | None) -> Any:
        return reranking.RerankItem(text=text or None, image=_uri(image) if image else None)

    scores, _ = reranking._score_vl_batch(
        model,
        processor,
        item(q_text, q_image),
        [item(d_text, d_image)],
        reranking.DEFAULT_INSTRUCTION,
    )
    return scores[0]


def _scores(items: list[EmbedItem]) -> list[float]:
    r = reranker()
    rows = [r.prepare(i) for i in items]
    features = [
        r.encode_image(image, grid)
        for row in rows
        for image, grid in zip(row.images, row.grids, strict=True)
    ]
    return [float(x) for x in as_numpy(r.pooled(rows, features))[:, 0]]


def _item(case: tuple[str, Any, str, Any]) -> EmbedItem:
    q_text, q_image, d_text, d_image = case
    return EmbedItem(pair=("", _side(q_text, q_image), _side(d_text, d_image)))


@pytest.mark.parametrize("case", CASES, ids=["text", "image-query", "image-doc", "both"])
def test_scores_equal_mlx_vlm_reference_exactly(case: tuple[str, Any, str, Any]) -> None:
    assert _scores([_item(case)]) == [_reference(case)]


def test_batched_scores_equal_alone_bit_for_bit() -> None:
    items = [_item(c) for c in CASES]
    assert _scores(items) == [_scores([i])[0] for i in items]


def test_engine_scores_a_repeated_image_with_one_tower_pass() -> None:
    config = EngineConfig(
        model=str(tiny_model("qwen3_vl_reranker")), served_model_name="r", task="rerank"
    )
    engine = EmbedEngine(config)
    engine.start(120)
    try:
        assert isinstance(engine.embedder, QwenVLReranker)
        image = _side("", DOC_IMAGE)
        pairs = (
            EmbedItem(pair=("", RerankSide("one"), image)),
            EmbedItem(pair=("", RerankSide("two"), image)),
        )
        result = engine.embed(Embed(pairs))
        assert engine.metrics.tower_passes._value.get() == 1  # noqa: SLF001
        assert [float(s) for s in result.vectors[:, 0]] == _scores(list(pairs))
    finally:
        engine.stop()
