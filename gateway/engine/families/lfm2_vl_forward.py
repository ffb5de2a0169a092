"""LFM2-VL's language model over the engine's caches: the short-convolution layers' state as a
recurrent layer (`ConvStateCache`), prompt forwards unpadded with the state marked where each
ended, and the decode core (`Lfm2TextCore`).

Numerics are mlx-vlm's: every forward is the language model's own `__call__` (mlx-vlm's
`lfm2` `LanguageModel`: its masks, its `ShortConv` and attention, its tied head), fed the
input embeddings mlx-vlm's merge makes. The prompt's last token is fed alone after the rest,
as mlx-vlm's generate feeds it (`ModelFamily.last_token_apart`).

Why prompt rows are never padded here (unlike the KV families): a padding row would enter the
convolution's window (its last `conv_L_cache - 1` inputs) and change the state.

Engine thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from gateway.engine.families.vlm_base import VlmTextCore
from gateway.engine.model.kv import RowBatchKVCache, share_row_state
from gateway.engine.model.prompt_forward import GroupPart, PrefillPlan
from gateway.engine.model.state_cache import RowStateCache, StateArrays, settle_block_end


class ConvStateCache(RowStateCache):
    """A short-convolution layer's cache: one array, the last `conv_L_cache - 1` inputs of
    the convolution (1, L - 1, hidden), as mlx-vlm's `ArraysCache(size=1)` holds it.

    A prefix-cache block's value for a state layer is a pair of arrays (`snapshots.layer_block`,
    the disk tier's files): a mark here is the state and a one-element placeholder, and a
    restore takes the state alone."""

    def __init__(self, rope_delta: int = 0) -> None:
        super().__init__(1, rope_delta)

    def mark(self) -> None:
        state = self.cache[0]
        if state is not None:
            self.marks[self.offset] = (state, mx.zeros((1, 1), dtype=state.dtype))

    def restore(self, arrays: StateArrays, tokens: int) -> None:
        self.cache = [arrays[0]]
        self.offset = tokens


class Lfm2TextCore(VlmTextCore):
    """`VlmTextCore` over a hybrid cache list: after each forward the attention layers'
    per-row offsets point at the first attention layer's (`share_row_state`; the convolution
    layers' batch states keep Python-int offsets)."""

    def __init__(self, language_model: nn.Module, layers: list[nn.Module]) -> None:
        super().__init__(language_model, layers)
        self._attention = tuple(bool(layer.is_attention_layer) for layer in layers)

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None, **_: Any) -> mx.array:
        assert cache is not None, "the engine always decodes with caches"
        logits = self.lm(inputs, cache=cache).logits
        attention = [c for c, a in zip(cache, self._attention) if a]
        if isinstance(attention[0], RowBatchKVCache):
            share_row_state(attention)  # equal values; cuts the other layers' lazy chains
        return logits


def prefill(lm: nn.Module, plan: PrefillPlan, cache: list[Any], lo: int, hi: int) -> mx.array:
    """Plan rows [lo, hi) into `cache`, unpadded; the plan's last row, when in range, is fed
    alone afterwards (module doc). Evaluates the caches and marks every convolution layer's
    state where each forward ended; returns the logits (1, hi - lo, vocab), lazily."""
    assert plan.embeds is not None
    last = hi == plan.length
    body = hi - 1 if last else hi
    out = []
    for a, b in ((lo, body), (body, hi)) if last else ((lo, hi),):
        if b <= a:
            continue
        ids, embeds = plan.ids[:, a:b], plan.embeds[:, a:b]
        out.append(lm(ids, inputs_embeds=embeds, cache=cache).logits)
        settle_block_end(cache)  # the state where this forward ended: a snapshot
    return out[0] if len(out) == 1 else mx.concatenate(out, axis=1)


def prefill_each(lm: nn.Module, parts: Sequence[GroupPart], rows: int) -> mx.array:
    """`prefill_group` as each part alone (a convolution state is never batched in a
    prompt forward: its rows would need per-row lengths): logits (len(parts), rows, vocab),
    each part's real rows first, zeros after."""
    out = []
    for part in parts:
        logits = prefill(lm, part.plan, part.cache, part.lo, part.hi)
        pad = rows - logits.shape[1]
        if pad > 0:
            zeros = mx.zeros((1, pad, logits.shape[2]), logits.dtype)
            logits = mx.concatenate([logits, zeros], axis=1)
        out.append(logits)
    return mx.concatenate(out, axis=0)
