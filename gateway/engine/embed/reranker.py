"""Rerankers: a Qwen3 chat checkpoint (as Qwen3-Reranker) asked whether a document meets a
query, the score being sigmoid(logit("yes") - logit("no")) at the prompt's last token.

Everything is mlx-vlm's reranker's (`mlx_vlm.server.reranking`): the model its
`load_reranker` loads, its system prompt, its default instruction, its chat-template
rendering (thinking off) and answer suffix, its forward (embeddings, layers, norm) and its
yes/no scoring; so a score equals its `_score_text_batch` over that document at tolerance
zero (tests/gateway/engine/embed/test_reranker.py). Served as an `Embedder` whose "vector"
is the one score, so the embedding engine batches, caches and counts pairs as inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx

from caches.hashing import fingerprint
from gateway.engine.embed.embedder import (
    Embedder,
    ImageFeatures,
    Prepared,
    padded,
    tokenizer_limit,
)
from gateway.engine.embed.request import EmbedCard, EmbedItem, EmbedRefused
from gateway.engine.families.family import model_fingerprint


class TextReranker(Embedder):
    """A loaded Qwen3 reranker (engine thread; `prepare` any thread)."""

    def __init__(self, path: str) -> None:
        from mlx_vlm.reranker_loader import load_reranker
        from mlx_vlm.server import reranking

        self.model, processor = load_reranker(path)
        reranking.ensure_chat_template(processor, path)
        self.tokenizer: Any = getattr(processor, "tokenizer", processor)
        self.suffix = list(self.tokenizer.encode(reranking.TEXT_SUFFIX, add_special_tokens=False))
        self.yes = reranking._token_id(self.tokenizer, "yes")
        self.no = reranking._token_id(self.tokenizer, "no")
        self.default_instruction = reranking.DEFAULT_INSTRUCTION
        config = self.model.config
        model_type = str(config.model_type)
        text = getattr(config, "text_config", config)
        self.card = EmbedCard(
            family="qwen3_reranker",
            model_type=model_type,
            media=frozenset(),
            dimensions=1,
            max_tokens=tokenizer_limit(
                self.tokenizer, getattr(text, "max_position_embeddings", None)
            ),
            matryoshka=False,
            normalize=False,
            task="rerank",
        )
        self.fingerprint = fingerprint(
            model_fingerprint(path, model_type), "rerank", Path(path).name
        )

    def prepare(self, item: EmbedItem) -> Prepared:
        from mlx_vlm.server import reranking

        if item.pair is None:
            raise EmbedRefused("this model reranks: it takes a query and documents")
        instruction, query, document = item.pair
        if item.images:
            raise EmbedRefused("this reranker reads text only; it takes no images")
        messages = reranking._text_messages(
            reranking.RerankItem(text=query.text),
            reranking.RerankItem(text=document.text),
            instruction or self.default_instruction,
        )
        tokens = reranking._input_ids(
            self.tokenizer.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=False, enable_thinking=False
            )
        )
        ids = list(tokens) + self.suffix
        self.check_length(ids)
        return Prepared(tuple(ids))

    def pooled(self, rows: Sequence[Prepared], features: Sequence[ImageFeatures]) -> mx.array:
        """Each row's score, (rows, 1)."""
        from mlx_vlm.models.cache import create_causal_mask

        ids, mask = padded(rows)
        input_ids, attention = mx.array(ids), mx.array(mask)
        inner = self.model.language_model.model
        hidden = inner.embed_tokens(input_ids)
        if bool(mask.all()):  # no padding: as the reference masks a single document
            layer_mask: Any = "causal"
        else:  # right padding: real rows never see a pad; pad rows (dropped) see real keys
            keys = mx.expand_dims(attention.astype(mx.bool_), (1, 2))
            layer_mask = create_causal_mask(ids.shape[1])[None, None, :, :] & keys
        for layer in inner.layers:
            hidden = layer(hidden, layer_mask, None)
        hidden = inner.norm(hidden)
        last = mx.array([len(r.ids) - 1 for r in rows])
        pooled = hidden[mx.arange(len(rows)), last]
        lm = self.model.language_model
        if hasattr(lm, "lm_head"):
            logits = lm.lm_head(pooled)
        else:
            logits = inner.embed_tokens.as_linear(pooled)
        return mx.sigmoid(logits[:, self.yes] - logits[:, self.no])[:, None]
