"""The vision tower, run one unit at a time.

MLX is lazy: calling mlx-vlm's tower only builds the graph. `VisionEncoder` records each unit's
(lazy) output while the graph is built (the patch embedding, the pieces of every block's
attention, every block, the merger) and evaluates them in order, so the engine can decode
between two units instead of stalling every running stream for a whole encode; the scheduler
decides how many units fit in one engine step (gateway.engine.scheduler.budget). Evaluating
parts of one graph in a different order does not change its values: the units cut the
evaluation, never the graph. The only re-implemented model code is the vision attention's
split-per-window loop, replaced by one kernel call per window length (`window_attention`,
same numerics up to float rounding, tested against mlx-vlm's tower); the rest is mlx-vlm's.

On CPU a block's attention over one 448 px image (1024 patches) alone took 110-240 ms on the
2-core test machine, 20-40 decode steps of the tiny model, so there the attention is also cut
into pieces of query rows (`AttentionPieces`, ATTENTION_PIECE_WORK): that changes the graph, but
identically for every schedule (stepwise or one graph, alone or grouped), and each query row is
computed by the same kernel from the same keys (bitwise equal to the uncut call on CPU:
tests/gateway/engine/model/test_vision_units.py). The patch embedding (a conv applied to each
patch row alone) is cut into pieces of rows the same way. On a GPU the attention stays one
call per segment length and the embedding whole (there a block is a few ms and per-piece
launches would cost the idle path).

Engine thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from gateway.engine.model.window_attention import AttentionPieces, batch_segment_attention

# On CPU: query x key x head x head_dim products per attention piece (per segment): 64 query
# rows of a 1024-patch image on the tiny tower (4 heads of 8), ~7 ms there.
ATTENTION_PIECE_WORK = 2**21
# On CPU: rows x weights per patch-embedding piece: 222 rows of the tiny tower (~6 ms).
EMBED_PIECE_WORK = 2**23


@dataclass(frozen=True)
class Unit:
    """One evaluation of the tower graph, named for cost estimates: `kind` ("embed", "attn",
    "block", "merge"), the patches of the whole tower call and the unit's output shape (so
    one key is one cost: attention pieces of different lengths are different keys)."""

    kind: str
    patches: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class EncodedImage:
    """Vision-tower output for one image, in the language model's dtype.

    `deepstack` holds Qwen3-VL's per-layer features (each (num_tokens, hidden)), else None.
    """

    features: mx.array  # (num_tokens, hidden)
    deepstack: tuple[mx.array, ...] | None

    @property
    def nbytes(self) -> int:
        extra = sum(d.nbytes for d in self.deepstack) if self.deepstack else 0
        return self.features.nbytes + extra


class VisionEncoder:
    """Wraps a loaded tower (mutating only the Python classes of the tower, its blocks and
    their attention, never parameters or weights)."""

    def __init__(self, tower: nn.Module, arch: str, embed_dtype: mx.Dtype) -> None:
        self.tower = tower
        self.embed_dtype = embed_dtype
        self.dtype = tower.patch_embed.proj.weight.dtype
        if arch == "qwen2_5_vl":
            drop_empty_attention_windows(tower)
        # Per-window attention calls make the tower launch-bound on GPUs; see window_attention.
        # On CPU the attention is also cut into pieces (module doc), by device only.
        on_cpu = mx.default_device().type == mx.DeviceType.cpu
        self.pieces = AttentionPieces(ATTENTION_PIECE_WORK if on_cpu else None, self._record_piece)
        # The patch embedding is row-wise (a conv whose kernel is the patch): on CPU it is cut
        # into pieces of rows too (~30 ms for 1024 patches on the tiny tower, uncut).
        proj = tower.patch_embed.proj.weight
        self.embed_rows = max(EMBED_PIECE_WORK // proj.size, 64) if on_cpu else None
        self.batched_attention = batch_segment_attention(tower, self.pieces)
        self._outputs: list[tuple[str, mx.array]] | None = None
        self._record_unit_outputs()

    def encode(self, pixel_values: np.ndarray, grid_thw: tuple[int, int, int]) -> EncodedImage:
        """Run the whole tower on one image."""
        steps = self.steps(pixel_values, grid_thw)
        while True:  # evaluated unit by unit, as the engine would while rows decode
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def steps(
        self, pixel_values: np.ndarray, grid_thw: tuple[int, int, int]
    ) -> Generator[Unit, None, EncodedImage]:
        """The tower on one image a unit at a time (`steps_many`); returns the features."""
        [encoded] = yield from self.steps_many([(pixel_values, grid_thw)])
        return encoded

    def steps_many(
        self,
        images: Sequence[tuple[np.ndarray, tuple[int, int, int]]],
        stepwise: Callable[[], bool] = lambda: True,
    ) -> Generator[Unit, None, list[EncodedImage]]:
        """Several images in one tower call (they stay separate: each is its own attention
        segment), a unit at a time; returns each image's features, in order.

        The first `next()` builds the graph and yields the first `Unit` (not evaluated yet);
        each later `next()` evaluates the unit it yielded last and yields the next one, so the
        caller knows what a `next()` will cost before making it. The last `next()` evaluates
        the last unit and the features (StopIteration carries them).

        `stepwise()` is asked before each unit: when it says no (nothing else is waiting for
        the device), the remaining units are not evaluated one by one but as one graph at the
        end, which saves a synchronisation per block (1024 px on an H200: 97.5 ms stepwise,
        59.8 ms as one graph)."""
        pixels = mx.concatenate([mx.array(p) for p, _ in images]).astype(self.dtype)
        grid = mx.array([g for _, g in images], dtype=mx.int32)
        patches = int(pixels.shape[0])
        self._outputs = []
        try:
            out = self.tower(pixels, grid, output_hidden_states=False)
        finally:
            unit_outputs, self._outputs = self._outputs, None
        for kind, hidden in unit_outputs:
            if stepwise():
                yield Unit(kind, patches, tuple(hidden.shape))
                mx.eval(hidden)
        stack: list[mx.array] = []
        if isinstance(out, tuple):  # Qwen3-VL: (features, [per-layer deepstack features])
            out, stack = out
        merge = self.tower.spatial_merge_size**2
        counts = [t * h * w // merge for _, (t, h, w) in images]
        if sum(counts) != out.shape[0]:
            raise RuntimeError(f"vision tower gave {out.shape[0]} features for {sum(counts)}")
        bounds = np.cumsum([0, *counts]).tolist()

        def own(array: mx.array, k: int) -> mx.array:
            # A gather, not a slice: a slice would share (and so keep alive) the whole
            # group's buffer for as long as this one image sits in the vision cache.
            rows = array if len(images) == 1 else array[mx.arange(bounds[k], bounds[k + 1])]
            return rows.astype(self.embed_dtype)

        encoded = [
            EncodedImage(own(out, k), tuple(own(d, k) for d in stack) or None)
            for k in range(len(images))
        ]
        mx.eval([e.features for e in encoded], [list(e.deepstack or ()) for e in encoded])
        return encoded

    def _embed_pieces(self, module: nn.Module, base: type, x: mx.array, rows: int) -> mx.array:
        """The patch embedding over `x` in pieces of `rows` patches (each its own unit)."""
        parts = []
        for lo in range(0, x.shape[0], rows):
            part = base.__call__(module, x[lo : lo + rows])
            if self._outputs is not None:
                self._outputs.append(("embed", part))
            parts.append(part)
        return mx.concatenate(parts, axis=0)

    def _record_piece(self, out: mx.array) -> None:
        if self._outputs is not None:
            self._outputs.append(("attn", out))

    def _record_unit_outputs(self) -> None:
        """Give the patch embedding, every block and the merger a subclass whose __call__ also
        reports its output while `steps` builds the graph. Parameters, names and numerics are
        untouched."""
        encoder = self
        units = [("embed", self.tower.patch_embed), *(("block", b) for b in self.tower.blocks)]
        merger = getattr(self.tower, "merger", None)
        if isinstance(merger, nn.Module):
            units.append(("merge", merger))
        for kind, unit in units:
            base = type(unit)

            def call(
                module: nn.Module, *args: Any, _base: type = base, _kind: str = kind, **kwargs: Any
            ) -> Any:
                rows = encoder.embed_rows
                if _kind == "embed" and rows is not None and args[0].shape[0] > rows:
                    return encoder._embed_pieces(module, _base, args[0], rows)
                out = _base.__call__(module, *args, **kwargs)
                if encoder._outputs is not None and isinstance(out, mx.array):
                    encoder._outputs.append((_kind, out))
                return out

            unit.__class__ = type(f"Recorded{base.__name__}", (base,), {"__call__": call})


def drop_empty_attention_windows(tower: nn.Module) -> None:
    """Make Qwen2.5-VL's window boundaries unique.

    mlx-vlm 0.7.10 dedupes `cu_window_seqlens` with a Python `set` of `mx.array` scalars, which
    hash by identity, so nothing is removed: repeated boundaries become empty attention
    windows (5 of 9 at a 16x16 patch grid) and reach scaled_dot_product_attention with empty
    inputs, which dies with SIGFPE on CUDA in bf16. Boundaries are non-decreasing, so dropping
    repeats of the previous value is an exact dedupe; the output is unchanged (tested).
    """
    original = tower.get_window_index

    def get_window_index(grid_thw: mx.array) -> tuple[mx.array, mx.array]:
        window_index, bounds = original(grid_thw)
        values = bounds.tolist()
        keep = [i for i, v in enumerate(values) if i == 0 or v != values[i - 1]]
        return window_index, bounds[mx.array(keep, dtype=mx.int32)]

    object.__setattr__(tower, "get_window_index", get_window_index)
