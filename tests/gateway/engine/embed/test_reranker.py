"""The reranker (engine/embed/reranker.py) on the tiny Qwen3-Reranker checkpoint
(`make-model --arch qwen3_reranker`, served with `--task rerank`).

Pinned: each document's score equals mlx-vlm's reranker's (`_score_text_batch` over that
document, the model its `load_reranker` loads) at tolerance zero, with the default
instruction and a custom one; scores computed in one right-padded batch equal each alone,
bit for bit (mlx-vlm's own left-padded batch does not: its last bits move); the engine
returns them in document order and caches pairs.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from support import noise_image, tiny_model

from gateway.config import EngineConfig
from gateway.engine.embed.embedder import as_numpy
from gateway.engine.embed.engine import EmbedEngine
from gateway.engine.embed.request import Embed, EmbedItem, EmbedRefused, RerankSide
from gateway.engine.embed.reranker import TextReranker
from tests.gateway.engine.embed.common import embed_image

QUERY = "what is a cat"
DOCS = ["a cat is a small animal", "stocks fell", "x", "cats purr and sleep all day in the sun"]


@functools.cache
def reranker() -> TextReranker:
    return TextReranker(str(tiny_model("qwen3_reranker")))


@functools.cache
def reference() -> tuple[object, object]:
    from mlx_vlm.reranker_loader import load_reranker

    return load_reranker(str(tiny_model("qwen3_reranker")))


def _reference_score(document: str, instruction: str | None) -> float:
    from mlx_vlm.server import reranking

    model, processor = reference()
    scores, _ = reranking._score_text_batch(
        model,
        processor,
        reranking.RerankItem(text=QUERY),
        [reranking.RerankItem(text=document)],
        instruction or reranking.DEFAULT_INSTRUCTION,
    )
    return scores[0]


def _scores(pairs: list[EmbedItem]) -> np.ndarray:
    rows = [reranker().prepare(p) for p in pairs]
    return as_numpy(reranker().pooled(rows, []))[:, 0]


@pytest.mark.parametrize("instruction", ["", "Find the passage about animals."])
def test_scores_equal_mlx_vlm_reference_exactly(instruction: str) -> None:
    for document in DOCS:
        (ours,) = _scores([EmbedItem(pair=(instruction, RerankSide(QUERY), RerankSide(document)))])
        assert float(ours) == _reference_score(document, instruction)


def test_batched_scores_equal_alone_bit_for_bit() -> None:
    pairs = [EmbedItem(pair=("", RerankSide(QUERY), RerankSide(d))) for d in DOCS]
    batched = _scores(pairs)
    for i, pair in enumerate(pairs):
        np.testing.assert_array_equal(batched[i], _scores([pair])[0])


def test_a_reranker_takes_only_text_pairs() -> None:
    with pytest.raises(EmbedRefused, match="reranks"):
        reranker().prepare(EmbedItem(text="hello"))
    image = embed_image(noise_image(1))
    with pytest.raises(EmbedRefused, match="text only"):
        reranker().prepare(EmbedItem(pair=("", RerankSide(QUERY), RerankSide("", image))))


def test_engine_scores_in_document_order_and_caches_pairs() -> None:
    config = EngineConfig(
        model=str(tiny_model("qwen3_reranker")), served_model_name="r", task="rerank"
    )
    engine = EmbedEngine(config)
    engine.start(120)
    try:
        pairs = tuple(EmbedItem(pair=("", RerankSide(QUERY), RerankSide(d))) for d in DOCS)
        first = engine.embed(Embed(pairs))
        assert [float(s) for s in first.vectors[:, 0]] == [_reference_score(d, "") for d in DOCS]
        again = engine.embed(Embed(pairs[:2]))
        assert again.cached == 2
        np.testing.assert_array_equal(again.vectors, first.vectors[:2])
    finally:
        engine.stop()
