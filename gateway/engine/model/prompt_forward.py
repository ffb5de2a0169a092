"""The language model's forward over prompt tokens, with image features merged in: the
inputs of a token range (`plan_inputs`), one request's range (`forward`) and several
requests' ranges at the same positions in one forward (`forward_group`), each padded to a
fixed number of query rows where the exact-reuse rule asks for it
(gateway.engine.scheduler.prefill).

`lm` is mlx-vlm's inner language model (`model.language_model.model`): ids, embeddings,
3-axis mRoPE position ids and caches in, final hidden states out. Engine thread only; every
function evaluates the caches it wrote and returns the hidden states lazily.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from gateway.engine.model.kv import RowKVCache, concat_parts, map_parts
from gateway.engine.model.text_rope import text_rope
from gateway.engine.model.vision import EncodedImage
from gateway.processors.positions import ImageLayout, mrope_positions


@dataclass(frozen=True)
class PrefillPlan:
    """Everything needed to prefill a token range in chunks (relative indexing)."""

    ids: mx.array  # (1, L)
    embeds: mx.array | None  # (1, L, hidden); None: the family feeds `ids` (no image rows)
    positions: mx.array  # (axes, 1, L): 3 for mRoPE, 1 for 1D positions
    visual: np.ndarray  # (L,) bool: image placeholder positions (Qwen3-VL deepstack)
    deepstack: list[mx.array] | None  # per layer (visual tokens in range, hidden)
    host_positions: np.ndarray  # (axes, L) the same positions on the host (no stream sync)

    @property
    def length(self) -> int:
        return int(self.ids.shape[1])


@dataclass(frozen=True)
class GroupPart:
    """One request's share of `prefill_group`: plan tokens [lo, hi) into `cache`."""

    plan: PrefillPlan
    cache: list[RowKVCache]
    lo: int
    hi: int


def _padded_inputs(
    plan: PrefillPlan, lo: int, hi: int, rows: int
) -> tuple[mx.array, mx.array, mx.array, np.ndarray]:
    """Plan tokens [lo, hi) as (ids, embeds, positions, visual), padded after the real rows to
    `rows` query rows when `rows` > hi - lo: zero embeddings at the text positions that would
    follow the last real token (causal attention keeps them out of every real row)."""
    pad = max(rows - (hi - lo), 0)
    ids, embeds = plan.ids[:, lo:hi], plan.embeds[:, lo:hi]
    positions = plan.positions[:, :, lo:hi]
    visual = plan.visual[lo:hi]
    if pad:
        ids = mx.concatenate([ids, mx.broadcast_to(ids[:, -1:], (1, pad))], axis=1)
        embeds = mx.concatenate([embeds, mx.zeros((1, pad, embeds.shape[2]), embeds.dtype)], 1)
        steps = mx.arange(1, pad + 1, dtype=positions.dtype)
        tail = positions.max(axis=0, keepdims=True)[..., -1:] + steps  # text after the end
        positions = mx.concatenate([positions, mx.broadcast_to(tail, (3, 1, pad))], axis=2)
        visual = np.concatenate([visual, np.zeros(pad, dtype=bool)])
    return ids, embeds, positions, visual


def plan_inputs(
    embed: Any,
    visual_ids: tuple[int, ...],
    prompt_ids: Sequence[int],
    layouts: Sequence[ImageLayout],
    encoded: Sequence[EncodedImage | None],
    start: int,
    end: int,
) -> PrefillPlan:
    """Inputs for prefilling prompt tokens [start, end) with image features merged in.

    `end` may not fall inside an image span; `start` may (the exact-reuse rule starts
    prefill at a block boundary: the image's features are then used from that row on).
    `encoded[i]` must be given for every image overlapping the range (images wholly before
    `start` are already in the cache).
    """
    ids = mx.array(list(prompt_ids[start:end]), dtype=mx.int32)
    pieces: list[mx.array] = []
    deep: list[list[mx.array]] = []
    cursor = start
    for layout, image in zip(layouts, encoded):
        if layout.end <= start or layout.start >= end:
            continue
        assert image is not None, "image inside the prefill range was not encoded"
        if layout.start > cursor:
            pieces.append(embed(ids[cursor - start : layout.start - start]))
        skip = max(start - layout.start, 0)  # rows of this image already in the cache
        pieces.append(image.features[skip:])
        if image.deepstack:
            deep.append([d[skip:] for d in image.deepstack])
        cursor = layout.end
    if cursor < end:
        pieces.append(embed(ids[cursor - start :]))
    embeds = mx.concatenate(pieces, axis=0)[None]
    host = np.ascontiguousarray(mrope_positions(end, layouts)[:, start:])
    positions = mx.array(host)[:, None, :]
    visual = np.isin(np.asarray(prompt_ids[start:end]), visual_ids)
    deepstack = None
    if deep:
        deepstack = [mx.concatenate(layer, axis=0) for layer in zip(*deep)]
    return PrefillPlan(ids[None], embeds, positions, visual, deepstack, host)


def text_offset(plan: PrefillPlan, lo: int, hi: int) -> int | None:
    """The position of plan row `lo` when rows [lo, hi) are text at consecutive positions,
    equal in all three mRoPE sections (then multimodal rope is plain rope from there: the
    one-kernel `text_rope` path); None when the range holds image tokens.

    Which path a range takes depends only on its own tokens, so a block is computed the same
    way whether it is prefilled cold or recomputed after a cache hit (docs/caching.md)."""
    if plan.visual[lo:hi].any():
        return None
    rows = plan.host_positions[:, lo:hi]
    first = int(rows[0, 0])
    expected = np.arange(first, first + (hi - lo))
    return first if bool((rows == expected).all()) else None


def forward(
    lm: Any,
    plan: PrefillPlan,
    cache: list[RowKVCache],
    lo: int,
    hi: int,
    rows: int = 0,
    fast_text: bool = False,
) -> mx.array:
    """Feed plan tokens [lo, hi) (relative to the plan) into `cache`; return the final
    hidden states (1, max(rows, hi - lo), hidden), lazily.

    `rows` > hi - lo pads the forward to that many query rows (the exact-reuse rule: every
    block is computed in one shape). Padding rows come after the real ones, so causal
    attention keeps them out of every real row; their KV is trimmed from `cache` again.
    `fast_text` (the model's rope layers are swapped, gateway.engine.model.text_rope): a range of
    text rows runs with one `mx.fast.rope` per q/k instead of mlx-vlm's multimodal rope
    (same values; on an H200 ~3.5 ms less per 256-row forward, `docs/investigations/block_cost.py`).
    """
    ids, embeds, positions, visual = _padded_inputs(plan, lo, hi, rows)
    pad = ids.shape[1] - (hi - lo)
    kwargs: dict[str, Any] = {}
    if plan.deepstack is not None:
        before = int(plan.visual[:lo].sum())
        count = int(plan.visual[lo:hi].sum())
        kwargs["visual_pos_masks"] = mx.array(visual)[None]
        kwargs["deepstack_visual_embeds"] = (
            [d[before : before + count] for d in plan.deepstack] if count else None
        )
    offset = text_offset(plan, lo, hi) if fast_text else None
    with text_rope(offset) if offset is not None else nullcontext():
        hidden = lm(ids, inputs_embeds=embeds, cache=cache, position_ids=positions, **kwargs)
    if pad:
        for layer in cache:
            layer.trim(pad)
    mx.eval([c.state for c in cache])
    return hidden


def forward_group(
    lm: Any, parts: Sequence[GroupPart], rows: int, fast_text: bool = False
) -> mx.array:
    """Several requests' next blocks in one forward: each part's plan tokens [lo, hi),
    padded to `rows` query rows exactly as `prefill` pads one, fed into its own `cache`.
    Every cache must hold the same number of tokens (the blocks sit at the same absolute
    positions) and no part may carry deepstack features. Returns the hidden states
    (len(parts), rows, hidden), lazily; each cache ends holding its real rows only.

    Each row's inputs, positions and keys are those of `prefill` for that request alone;
    whether its results are bit-identical to that is up to the backend's kernels (a
    batch dimension in every matmul and attention call), which is why only blocks that
    are never stored are computed here (gateway.engine.scheduler.prefill). `fast_text` as in
    `forward`, when every part's range is text."""
    offset = parts[0].cache[0].offset
    assert all(p.cache[0].offset == offset for p in parts), "blocks at different positions"
    assert all(p.plan.deepstack is None for p in parts), "deepstack blocks are fed alone"
    inputs = [_padded_inputs(p.plan, p.lo, p.hi, rows) for p in parts]
    ids = mx.concatenate([i[0] for i in inputs], axis=0)
    embeds = mx.concatenate([i[1] for i in inputs], axis=0)
    positions = mx.concatenate([i[2] for i in inputs], axis=1)
    batch_cache = join_caches([p.cache for p in parts])
    firsts = [text_offset(p.plan, p.lo, p.hi) for p in parts] if fast_text else [None]
    offsets = mx.array(firsts, dtype=mx.int32) if None not in firsts else None
    with text_rope(offsets) if offsets is not None else nullcontext():
        hidden = lm(ids, inputs_embeds=embeds, cache=batch_cache, position_ids=positions)
    mx.eval([c.state for c in batch_cache])
    split_caches([p.cache for p in parts], [p.hi - p.lo for p in parts], batch_cache)
    return hidden


def join_caches(caches: Sequence[list[RowKVCache]]) -> list[RowKVCache]:
    """One batch cache per layer over several single-row caches holding the same number of
    tokens (their KV copied, row i = caches[i]), for a grouped forward. The joint caches
    are of the rows' form (quantized under --kv-bits)."""
    offset = caches[0][0].offset

    def held(p: mx.array) -> mx.array:
        return p[..., :offset, :]

    joint_layers = []
    for layer in range(len(caches[0])):
        joint = caches[0][layer].empty_like()
        if offset:
            joint.keys = concat_parts([map_parts(held, c[layer].keys) for c in caches], 0)
            joint.values = concat_parts([map_parts(held, c[layer].values) for c in caches], 0)
            joint.offset = offset
        joint_layers.append(joint)
    return joint_layers


def split_caches(
    caches: Sequence[list[RowKVCache]], added: Sequence[int], joint: list[RowKVCache]
) -> None:
    """After a grouped forward over `join_caches(caches)`: cache i takes row i of `joint`
    up to its own `added[i]` new tokens (its real rows; the padding rows are dropped)."""
    for i, cache in enumerate(caches):
        end = cache[0].offset + added[i]
        for layer, rows in zip(cache, joint):
            layer.keys = map_parts(lambda p, i=i, end=end: p[i : i + 1, :, :end, :], rows.keys)
            layer.values = map_parts(lambda p, i=i, end=end: p[i : i + 1, :, :end, :], rows.values)
            layer.offset = end
