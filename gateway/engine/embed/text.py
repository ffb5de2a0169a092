"""Text embedders: a causal text model whose hidden states are pooled as its
sentence-transformers files say (`1_Pooling/config.json`; last token when absent), then
normalized: Qwen3-Embedding (`model_type: qwen3` in that layout).

The model is the one mlx-vlm's `load_embedding_model` builds (its `qwen3_embedding` model)
and the pooling mlx-vlm's `pool_by_config`, so a vector equals the reference's
`model(ids).text_embeds` exactly (pinned by tests/gateway/engine/embed/test_text.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

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

# Families trained with Matryoshka representation learning: a prefix of the vector is itself
# an embedding (Qwen3-Embedding's model card: any size from 32 up).
MATRYOSHKA_TYPES = ("qwen3", "qwen3_embedding")  # (mlx-vlm renames qwen3 on load)


class TextEmbedder(Embedder):
    """A loaded text embedding checkpoint (engine thread; `prepare` any thread)."""

    def __init__(self, path: str) -> None:
        from mlx_vlm.embedding_loader import load_embedding_model
        from mlx_vlm.models.pooling import read_pooling_config
        from mlx_vlm.utils import load_processor

        folder = Path(path)
        self.model = load_embedding_model(folder)
        self.pooling = read_pooling_config(folder) or {"pooling_mode": "lasttoken"}
        self.model.pooling_config = self.pooling  # what the reference reads
        processor = load_processor(folder, add_detokenizer=False)
        self.tokenizer = getattr(processor, "tokenizer", processor)
        config = self.model.config
        model_type = str(config.model_type)
        self.card = EmbedCard(
            family="text_embedding",
            model_type=model_type,
            media=frozenset(),
            dimensions=int(config.hidden_size),
            max_tokens=tokenizer_limit(
                self.tokenizer, getattr(config, "max_position_embeddings", None)
            ),
            matryoshka=model_type in MATRYOSHKA_TYPES,
            normalize=True,
        )
        self.fingerprint = fingerprint(
            model_fingerprint(path, model_type), tuple(sorted(self.pooling.items()))
        )

    def prepare(self, item: EmbedItem) -> Prepared:
        if item.pair is not None:
            raise EmbedRefused("this model embeds; it does not rerank (a pair)")
        if item.parts is not None and item.images:
            raise EmbedRefused("this model embeds text only; it takes no images")
        if item.ids is not None:
            ids = list(item.ids)
            vocab = int(self.model.config.vocab_size)
            if any(not 0 <= i < vocab for i in ids):
                raise EmbedRefused(
                    f"a token id is outside this model's vocabulary (0..{vocab - 1})"
                )
        else:
            text = item.text if item.text is not None else "".join(item.parts or ())
            ids = list(self.tokenizer(text)["input_ids"])
        self.check_length(ids)
        return Prepared(tuple(ids))

    def pooled(self, rows: Sequence[Prepared], features: Sequence[ImageFeatures]) -> mx.array:
        from mlx_vlm.models.pooling import pool_by_config

        ids, mask = padded(rows)
        attention = mx.array(mask)
        out = self.model(mx.array(ids), attention_mask=attention)
        return pool_by_config(out.last_hidden_state, attention, self.pooling)
