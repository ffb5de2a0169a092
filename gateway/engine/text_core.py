"""The language model as mlx-lm's BatchGenerator sees it."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from gateway.engine.kv import RowBatchKVCache, RowKVCache, row_positions, share_row_state


class TextCore(nn.Module):
    """The language model as mlx-lm's BatchGenerator sees it: tokens in, logits out.

    Positions come from each row's cache (`tokens in cache + row rope delta`), so image rows
    (delta < 0) and text rows (delta 0) decode in one batch.
    """

    def __init__(self, language_model: nn.Module) -> None:
        super().__init__()
        self.lm = language_model

    @property
    def layers(self) -> list[nn.Module]:
        return self.lm.model.layers

    def make_cache(self) -> list[RowKVCache]:
        return [RowKVCache() for _ in self.layers]

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None, **_: Any) -> mx.array:
        batch, length = inputs.shape
        positions = row_positions(cache[0], length) if cache else mx.arange(length)[None]
        positions = mx.broadcast_to(positions[None], (3, batch, length))
        hidden = self.lm.model(inputs, cache=cache, position_ids=positions)
        if cache and isinstance(cache[0], RowBatchKVCache):
            share_row_state(cache)
        return logits_from_hidden(self.lm, hidden)


def logits_from_hidden(language_model: nn.Module, hidden: mx.array) -> mx.array:
    if getattr(language_model.args, "tie_word_embeddings", False):
        return language_model.model.embed_tokens.as_linear(hidden)
    return language_model.lm_head(hidden)
