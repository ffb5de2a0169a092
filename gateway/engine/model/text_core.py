"""The language model as mlx-lm's BatchGenerator sees it."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from gateway.engine.model.kv import (
    RowBatchKVCache,
    RowKVCache,
    offset_positions,
    row_offsets,
    share_row_state,
)
from gateway.engine.model.text_rope import install_text_rope, text_rope


class TextCore(nn.Module):
    """The language model as mlx-lm's BatchGenerator sees it: tokens in, logits out.

    Positions come from each row's cache (`tokens in cache + row rope delta`), so image rows
    (delta < 0) and text rows (delta 0) decode in one batch. Every token TextCore sees is a
    text token (its three mRoPE sections share one position), so where the architecture
    allows it (`fast_rope`, see text_rope.py) attention uses one `mx.fast.rope` per q/k with
    per-row offsets instead of mlx-vlm's unfused multimodal rope; the logits are the same.
    Image prefill (model.py `prefill`) calls the same modules outside that context and keeps
    the multimodal rope.
    """

    def __init__(self, language_model: nn.Module, fast_rope: bool = True) -> None:
        super().__init__()
        self.lm = language_model
        # False when disabled or when some layer's rope is not plain rope at text positions.
        self.fast_rope = fast_rope and install_text_rope(language_model)

    @property
    def layers(self) -> list[nn.Module]:
        return self.lm.model.layers

    def make_cache(self) -> list[RowKVCache]:
        return [RowKVCache() for _ in self.layers]

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None, **_: Any) -> mx.array:
        batch, length = inputs.shape
        offsets = row_offsets(cache[0]) if cache else 0
        # The fast path never evaluates these (the rope reads `offsets`); they stay correct
        # mRoPE ids for the slow path and for anything else in the model that reads them.
        positions = mx.broadcast_to(offset_positions(offsets, length)[None], (3, batch, length))
        with text_rope(offsets) if self.fast_rope else nullcontext():
            hidden = self.lm.model(inputs, cache=cache, position_ids=positions)
        if cache and isinstance(cache[0], RowBatchKVCache):
            share_row_state(cache)
        return logits_from_hidden(self.lm, hidden)


def logits_from_hidden(language_model: nn.Module, hidden: mx.array) -> mx.array:
    if getattr(language_model.args, "tie_word_embeddings", False):
        return language_model.model.embed_tokens.as_linear(hidden)
    return language_model.lm_head(hidden)
