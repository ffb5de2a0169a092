"""Qwen3.5's language model forward over the engine's caches: the decoder layers of mlx-vlm's
`Qwen3_5Model` run in our own loop, so the batch's caches (left-padded KV for the attention
layers, stacked recurrent states for the gated-delta layers) never meet mlx-vlm's batch
branches (which split a padded batch into per-row forwards and rebuild the caches).

Numerics are mlx-vlm's: the same layer modules, the same masks (`create_attention_mask` over
the first attention layer's cache; no mask for the recurrent layers, whose rows have no time
padding), the same position embeddings (computed once per forward from 3-axis position ids,
as `Qwen3_5Model` does). The prompt's last token is fed alone after the rest, as mlx-vlm's
generate feeds it (`prefill` below; `ModelFamily.last_token_apart`): there a one-token step
takes the recurrent layers' per-token path, not the chunked scan.

Why prompt rows are never padded here (unlike the KV families): a padding row would pass
through the recurrence and change the state; the chunked scan pads to its own chunk (64)
internally, with rows that leave the state unchanged.

Engine thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_vlm.models.base import create_attention_mask

from gateway.engine.model.kv import (
    RowBatchKVCache,
    offset_positions,
    row_offsets,
    share_row_state,
)
from gateway.engine.model.prompt_forward import GroupPart, PrefillPlan
from gateway.engine.model.state_cache import settle_block_end
from gateway.engine.model.text_core import logits_from_hidden


def run_layers(
    model: nn.Module, h: mx.array, cache: Sequence[Any], position_ids: mx.array
) -> mx.array:
    """`Qwen3_5Model`'s layer loop over `h` (B, L, d) with `position_ids` (3, B, L); returns
    the final-normed hidden states. `cache[i]` is layer i's cache (updated in place)."""
    attention = [layer for layer in model.layers if not layer.is_linear]
    rotary = attention[0].self_attn.rotary_emb
    embeddings = None if rotary.fused_apply else rotary(h, position_ids)
    mask = create_attention_mask(h, cache[model.fa_idx])
    for layer, c in zip(model.layers, cache):
        h = layer(
            h,
            mask=None if layer.is_linear else mask,
            cache=c,
            position_ids=position_ids,
            position_embeddings=embeddings,
        )
    return model.norm(h)


class HybridTextCore(nn.Module):
    """The language model as mlx-lm's BatchGenerator sees it: (B, L) ids and per-layer caches
    in, logits out. Positions: each row's attention-cache offset plus its rope delta (text
    after images), the same on all three mRoPE axes, as mlx-vlm's decode computes them."""

    def __init__(self, language_model: nn.Module) -> None:
        super().__init__()
        self.lm = language_model
        self.fast_rope = False  # read by the engine's bookkeeping (TextCore's attribute)

    @property
    def layers(self) -> list[nn.Module]:
        return self.lm.model.layers

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None, **_: Any) -> mx.array:
        assert cache is not None, "the engine always decodes with caches"
        model = self.lm.model
        batch, length = inputs.shape
        attn = [c for c, layer in zip(cache, model.layers) if not layer.is_linear]
        pos = offset_positions(row_offsets(attn[0]), length)
        position_ids = mx.broadcast_to(pos[None], (3, batch, length))
        hidden = run_layers(model, model.embed_tokens(inputs), cache, position_ids)
        if isinstance(attn[0], RowBatchKVCache):
            share_row_state(attn)  # equal values; cuts the other layers' lazy offset chains
        return logits_from_hidden(self.lm, hidden)


def prefill(lm: nn.Module, plan: PrefillPlan, cache: list[Any], lo: int, hi: int) -> mx.array:
    """Plan rows [lo, hi) into `cache`, unpadded; the plan's last row, when in range, is fed
    alone afterwards (module doc). Evaluates the caches; returns the final hidden states
    (1, hi - lo, d), lazily, row i for plan row lo + i."""
    model = lm.model
    last = hi == plan.length
    body = hi - 1 if last else hi
    states = []
    for a, b in ((lo, body), (body, hi)) if last else ((lo, hi),):
        if b <= a:
            continue
        assert plan.embeds is not None
        h = plan.embeds[:, a:b]
        states.append(run_layers(model, h, cache, plan.positions[:, :, a:b]))
        settle_block_end(cache)  # the state where this forward ended: a snapshot
    return states[0] if len(states) == 1 else mx.concatenate(states, axis=1)


def prefill_each(lm: nn.Module, parts: Sequence[GroupPart], rows: int) -> mx.array:
    """`prefill_group` as each part alone (a recurrent forward is never shared: its rows would
    need per-row lengths): states (len(parts), rows, d), each part's real rows first."""
    out = []
    for part in parts:
        hidden = prefill(lm, part.plan, part.cache, part.lo, part.hi)
        pad = rows - hidden.shape[1]
        if pad > 0:
            hidden = mx.concatenate([hidden, mx.zeros((1, pad, hidden.shape[2]), hidden.dtype)], 1)
        out.append(hidden)
    return mx.concatenate(out, axis=0)
