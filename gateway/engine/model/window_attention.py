"""Batched segment attention for mlx-vlm's Qwen-VL vision towers.

mlx-vlm's vision `Attention` splits q, k, v at every `cu_seqlens` boundary and calls
scaled_dot_product_attention once per segment: about 100 windows x 28 windowed layers for a
1024px image on Qwen2.5-VL, so a GPU spends its time launching tiny kernels. Here segments of
equal length are stacked into a batch and attended in ONE call per distinct length, with no
mask: segments never see each other because each is its own batch entry, and nothing is
padded, so no padded row can turn into NaN and no FLOPs are wasted. A Qwen2.5-VL image has at
most 4 window lengths (full, short right column, short bottom row, corner); a full-attention
layer has one segment per image, so one call per distinct image size.

Which rows form which batch depends only on the boundaries, so the row permutation is built
once on the host with numpy per distinct `cu_seqlens` array in a tower forward (the windowed
and the full-attention array), and shared by every layer that receives that array.

Installation swaps Python classes only (as `VisionEncoder` does for blocks): parameter names
and weights are untouched, so checkpoints load the same and `restore_per_segment_attention`
undoes it. The q/k/v projection, rotary embedding and kernel entry point are the arch
module's own functions; only the split/loop/concatenate around the kernel is replaced.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

# Vision attention classes whose __call__ is the per-segment loop replaced here (mlx-vlm 0.7).
PATCHED_ATTENTION = {
    "mlx_vlm.models.qwen2_vl.vision.Attention",
    "mlx_vlm.models.qwen2_5_vl.vision.Attention",
    "mlx_vlm.models.qwen3_vl.vision.Attention",
}


@dataclass(frozen=True)
class SegmentPlan:
    """How to attend rows [0, n) split into segments as batches of equal-length segments.

    `groups[i] = (first_row, count, length)`: after reordering the rows by `order`, rows
    [first_row, first_row + count * length) are `count` whole segments of `length` rows each.
    `order[j]` is the original row at grouped position j; `inverse` maps back. Both are None
    when the rows are already grouped (one segment, or segments sorted by length).
    """

    groups: tuple[tuple[int, int, int], ...]
    order: mx.array | None
    inverse: mx.array | None

    @classmethod
    def from_bounds(cls, bounds: Sequence[int]) -> SegmentPlan:
        """`bounds` are cumulative segment boundaries starting at 0, non-decreasing (repeats
        are empty segments and are skipped). Longest segments first."""
        b = np.asarray(bounds, dtype=np.int64)
        if b.ndim != 1 or b.size < 2 or b[0] != 0 or np.any(np.diff(b) < 0):
            raise ValueError(f"cu_seqlens must start at 0 and not decrease: {b.tolist()}")
        starts, lengths = b[:-1], np.diff(b)
        groups: list[tuple[int, int, int]] = []
        rows: list[np.ndarray] = []
        first = 0
        for length in sorted({int(x) for x in lengths if x > 0}, reverse=True):
            seg_starts = starts[lengths == length]
            rows.append((seg_starts[:, None] + np.arange(length)).reshape(-1))
            groups.append((first, len(seg_starts), length))
            first += len(seg_starts) * length
        order = np.concatenate(rows)
        if np.array_equal(order, np.arange(order.size)):
            return cls(tuple(groups), None, None)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        return cls(tuple(groups), _int32(order), _int32(inverse))


def _int32(indices: np.ndarray) -> mx.array:
    return mx.array(indices.astype(np.int32))


class _PlanCache:
    """Plans for the current tower forward, keyed by the identity of the `cu_seqlens` array.

    Each entry keeps a reference to its array, so an id cannot be reused by another array
    while the forward runs. Outside a forward (an attention module called on its own) every
    call plans afresh: correct, just not shared."""

    def __init__(self) -> None:
        self._plans: dict[int, tuple[mx.array, SegmentPlan]] | None = None

    @contextmanager
    def forward(self) -> Iterator[None]:
        outer, self._plans = self._plans, {}
        try:
            yield
        finally:
            self._plans = outer

    def plan(self, cu_seqlens: mx.array) -> SegmentPlan:
        if self._plans is None:
            return SegmentPlan.from_bounds(cu_seqlens.tolist())
        hit = self._plans.get(id(cu_seqlens))
        if hit is None:
            hit = (cu_seqlens, SegmentPlan.from_bounds(cu_seqlens.tolist()))
            self._plans[id(cu_seqlens)] = hit
        return hit[1]


@dataclass
class AttentionPieces:
    """How finely the vision attention's graph is cut, and who hears of each piece.

    `work`: at most this many query x key x head x head_dim products per piece *per
    segment*: a segment's queries are split into pieces of equal rows (the last shorter),
    each attending all of the segment's keys. None: one kernel call per segment length (no
    cut). Softmax is per query row, so a piece's rows are the rows of the uncut call; the cut
    depends only on the segment's length and the head shape, never on which other images
    share the call, so an image gets the same graph alone or in a group. `record(out)` is
    called with each piece's lazy output while the graph is built (`VisionEncoder` evaluates
    them one at a time between decode steps). Engine thread only (set before a tower call).
    """

    work: int | None = None
    record: Callable[[mx.array], None] | None = None

    def rows(self, length: int, heads: int, head_dim: int) -> int:
        """Query rows per piece for segments of `length` rows (all of them: no cut)."""
        if self.work is None:
            return length
        rows = max(self.work // (length * heads * head_dim), MIN_PIECE_ROWS)
        return min(rows, length)


# Fewer query rows per piece than this is all launch overhead.
MIN_PIECE_ROWS = 32


def attend_segments(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    plan: SegmentPlan,
    sdpa: Callable[..., mx.array],
    pieces: AttentionPieces | None = None,
) -> mx.array:
    """Attention within each segment of `plan`. q, k, v: (rows, heads, head_dim); returns
    (rows, heads * head_dim) in the original row order. `sdpa(q, k, v)` is the kernel (scale
    bound), called per group with (count, heads, length, head_dim) inputs, or with `pieces`
    once per piece of query rows (count, heads, piece, head_dim) against all keys."""
    rows, heads, head_dim = q.shape
    if plan.order is not None:
        q, k, v = q[plan.order], k[plan.order], v[plan.order]
    pieces = pieces or AttentionPieces()
    outputs = []
    for first, count, length in plan.groups:
        # (count * length, heads, head_dim) rows -> (count, heads, length, head_dim) batch
        batch = [
            t[first : first + count * length]
            .reshape(count, length, heads, -1)
            .transpose(0, 2, 1, 3)
            for t in (q, k, v)
        ]
        step = pieces.rows(length, heads, head_dim)
        parts = []
        for lo in range(0, length, step):
            part = sdpa(batch[0][:, :, lo : lo + step] if step < length else batch[0], *batch[1:])
            if pieces.record is not None and step < length:
                pieces.record(part)
            parts.append(part)
        out = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2)
        outputs.append(out.transpose(0, 2, 1, 3).reshape(count * length, heads * head_dim))
    out = outputs[0] if len(outputs) == 1 else mx.concatenate(outputs, axis=0)
    return out if plan.inverse is None else out[plan.inverse]


def _batched_call(
    base: type, plans: _PlanCache, pieces: AttentionPieces
) -> Callable[..., mx.array]:
    """A drop-in `Attention.__call__` for `base` (an mlx-vlm vision Attention class)."""
    arch = sys.modules[base.__module__]
    rope = arch.apply_rotary_pos_emb_vision
    # Qwen3-VL pads head_dim up to a fused-kernel size through mlx-vlm's helper; use the
    # same entry point as the arch's own code so the kernel choice does not change.
    fused = getattr(arch, "ensure_fused_sdpa", None)

    def call(
        self: nn.Module, x: mx.array, cu_seqlens: mx.array, rotary_pos_emb: mx.array | None = None
    ) -> mx.array:
        rows = x.shape[0]
        qkv = self.qkv(x).reshape(rows, 3, self.num_heads, -1).transpose(1, 0, 2, 3)
        q, k, v = mx.split(qkv, 3)  # each (1, rows, heads, head_dim), as in mlx-vlm
        q = rope(mx.expand_dims(q, 0), rotary_pos_emb)[0, 0]
        k = rope(mx.expand_dims(k, 0), rotary_pos_emb)[0, 0]

        def sdpa(qb: mx.array, kb: mx.array, vb: mx.array) -> mx.array:
            if fused is not None:
                return fused(qb, kb, vb, self.scale)
            return mx.fast.scaled_dot_product_attention(qb, kb, vb, scale=self.scale, mask=None)

        out = attend_segments(q, k, v[0], plans.plan(cu_seqlens), sdpa, pieces)
        return self.proj(out)

    return call


def batch_segment_attention(tower: nn.Module, pieces: AttentionPieces | None = None) -> bool:
    """Make every vision block's attention one kernel call per segment length (or per piece
    of one, with `pieces`: see `AttentionPieces`).

    Returns False (and changes nothing) when the blocks' attention is not a known mlx-vlm
    per-segment class. Idempotent (the first installation's `pieces` stay)."""
    attentions = [blk.attn for blk in tower.blocks]
    base = type(attentions[0])
    if getattr(base, "_per_segment_base", None) is not None:
        return True  # already installed
    if f"{base.__module__}.{base.__qualname__}" not in PATCHED_ATTENTION:
        return False
    if any(type(a) is not base for a in attentions):
        return False
    plans = _PlanCache()
    batched = type(
        f"Batched{base.__name__}",
        (base,),
        {
            "__call__": _batched_call(base, plans, pieces or AttentionPieces()),
            "_per_segment_base": base,
        },
    )
    for attn in attentions:
        attn.__class__ = batched
    _scope_tower_forward(tower, plans)
    return True


def _scope_tower_forward(tower: nn.Module, plans: _PlanCache) -> None:
    """Give the tower a subclass whose __call__ opens a fresh plan cache for its duration."""
    base = type(tower)

    def call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        with plans.forward():
            return base.__call__(module, *args, **kwargs)

    attrs = {"__call__": call, "_per_segment_base": base}
    tower.__class__ = type(f"PlanScoped{base.__name__}", (base,), attrs)


def restore_per_segment_attention(tower: nn.Module) -> None:
    """Undo `batch_segment_attention`: mlx-vlm's own classes again (for A/B timing)."""
    for module in [tower, *(blk.attn for blk in tower.blocks)]:
        original = getattr(type(module), "_per_segment_base", None)
        if original is not None:
            module.__class__ = original
