"""Qwen3-VL rerankers (as Qwen3-VL-Reranker): a Qwen3-VL chat checkpoint asked whether a
document (text, an image, or both) meets a query (likewise), the score being
sigmoid(logit("yes") - logit("no")) at the prompt's last token.

As `reranker.TextReranker` for text, everything is mlx-vlm's (`mlx_vlm.server.reranking`'s
`_score_vl_batch`): the model `load_reranker` loads, its system prompt and default
instruction, its conversation (`_vl_messages`: the query's image, then its text; the same
for the document) rendered by the chat template with the generation prompt opened, the
tower, mRoPE positions and deepstack features, the "causal" mask of an unpadded prompt, its
yes/no scoring. Served as the embedder over the same model (`QwenVLEmbedder`'s per-image
tower, cached by pixel hash, and right-padded forwards), so a score equals the reference's
over that document at tolerance zero (tests/gateway/engine/embed/test_qwen3_vl_reranker.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from caches.hashing import fingerprint
from gateway.engine.embed.embedder import ImageFeatures, Prepared
from gateway.engine.embed.qwen3_vl import QwenVLEmbedder
from gateway.engine.embed.request import EmbedCard, EmbedItem, EmbedRefused, RerankSide


class QwenVLReranker(QwenVLEmbedder):
    """A loaded Qwen3-VL reranker (engine thread; `prepare` any thread)."""

    MODEL_TYPES = ("qwen3_vl",)

    def __init__(self, path: str) -> None:
        from mlx_vlm.server import reranking

        super().__init__(path)
        self.yes = reranking._token_id(self.tokenizer, "yes")
        self.no = reranking._token_id(self.tokenizer, "no")
        self.default_instruction = reranking.DEFAULT_INSTRUCTION
        card = self.card
        self.card = EmbedCard(
            family="qwen3_vl_reranker",
            model_type=card.model_type,
            media=card.media,
            dimensions=1,
            max_tokens=card.max_tokens,
            matryoshka=False,
            normalize=False,
            task="rerank",
        )
        self.fingerprint = fingerprint(self.fingerprint, "rerank")

    @staticmethod
    def _load(path: str) -> tuple[Any, Any]:
        """(model, processor) as mlx-vlm's server loads a reranker."""
        from mlx_vlm.reranker_loader import load_reranker
        from mlx_vlm.server import reranking

        model, processor = load_reranker(path)
        reranking.ensure_chat_template(processor, path)
        return model, processor

    def prepare(self, item: EmbedItem) -> Prepared:
        from mlx_vlm.server import reranking

        if item.pair is None:
            raise EmbedRefused("this model reranks: it takes a query and documents")
        instruction, query, document = item.pair
        messages = reranking._vl_messages(
            _item(query), _item(document), instruction or self.default_instruction
        )
        return self._prepared(messages, item.images)

    def pooled(self, rows: Sequence[Prepared], features: Sequence[ImageFeatures]) -> mx.array:
        """Each row's score, (rows, 1)."""
        hidden, attention = self.hidden(rows, features, causal=True)
        last = mx.array([len(r.ids) - 1 for r in rows])
        pooled = hidden[mx.arange(len(rows)), last]
        lm = self.model.language_model
        if getattr(lm, "lm_head", None) is not None:
            logits = lm.lm_head(pooled)
        else:
            logits = lm.model.embed_tokens.as_linear(pooled)
        return mx.sigmoid(logits[:, self.yes] - logits[:, self.no])[:, None]


def _item(side: RerankSide) -> Any:
    """mlx-vlm's item for a side: only whether it has an image matters to the prompt."""
    from mlx_vlm.server import reranking

    return reranking.RerankItem(text=side.text or None, image="image" if side.image else None)
