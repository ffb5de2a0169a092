"""The vision tower, run one unit at a time.

MLX is lazy: calling mlx-vlm's tower only builds the graph. `VisionEncoder` records each unit's
(lazy) output while the graph is built (the patch embedding, then every block) and evaluates
them in order, so the engine can decode between two blocks instead of stalling every running
stream for a whole encode. The only re-implemented model code is the vision attention's
split-per-window loop, replaced by one kernel call per window length (`window_attention`,
same numerics up to float rounding, tested against mlx-vlm's tower); the rest is mlx-vlm's.

Engine thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from gateway.engine.model.window_attention import batch_segment_attention


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
        self.batched_attention = batch_segment_attention(tower)
        self._outputs: list[mx.array] | None = None
        self._record_unit_outputs()

    def encode(self, pixel_values: np.ndarray, grid_thw: tuple[int, int, int]) -> EncodedImage:
        """Run the whole tower on one image."""
        steps = self.steps(pixel_values, grid_thw)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def steps(
        self, pixel_values: np.ndarray, grid_thw: tuple[int, int, int]
    ) -> Generator[None, None, EncodedImage]:
        """One unit (patch embedding, then each block) per `next()`; returns the features."""
        [encoded] = yield from self.steps_many([(pixel_values, grid_thw)])
        return encoded

    def steps_many(
        self,
        images: Sequence[tuple[np.ndarray, tuple[int, int, int]]],
        stepwise: Callable[[], bool] = lambda: True,
    ) -> Generator[None, None, list[EncodedImage]]:
        """Several images in one tower call (they stay separate: each is its own attention
        segment), one unit per `next()`; returns each image's features, in order.

        `stepwise()` is asked before each unit: when it says no (nothing else is waiting for
        the GPU), the remaining units are not evaluated one by one but as one graph at the
        end, which saves a synchronisation per block (1024 px on an H200: 97.5 ms stepwise,
        59.8 ms as one graph)."""
        pixels = mx.concatenate([mx.array(p) for p, _ in images]).astype(self.dtype)
        grid = mx.array([g for _, g in images], dtype=mx.int32)
        self._outputs = []
        try:
            out = self.tower(pixels, grid, output_hidden_states=False)
        finally:
            unit_outputs, self._outputs = self._outputs, None
        for hidden in unit_outputs:
            if stepwise():
                mx.eval(hidden)
                yield
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

    def _record_unit_outputs(self) -> None:
        """Give the patch embedding and every block a subclass whose __call__ also reports
        its output while `steps` builds the graph. Parameters, names and numerics are
        untouched."""
        encoder = self
        for unit in [self.tower.patch_embed, *self.tower.blocks]:
            base = type(unit)

            def call(module: nn.Module, *args: Any, _base: type = base, **kwargs: Any) -> Any:
                out = _base.__call__(module, *args, **kwargs)
                if encoder._outputs is not None:
                    encoder._outputs.append(out)
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
