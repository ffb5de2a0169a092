"""Vision-tower latency per image size: `python -m docs.investigations.vision_tower MODEL_DIR
--sizes 448 1024 [--repeats 5] [--no-compare]`.

Times the tower as the gateway runs it (batched segment attention, see
gateway.engine.model.window_attention) and, unless --no-compare, with mlx-vlm's own per-window
attention restored on the same loaded weights, plus the max difference between the two
outputs. Images are random noise (tower cost depends on the patch grid only), resized by the
model's own processor, so a size above its max_pixels is shrunk (the grid is reported).

Not a test: numbers are only meaningful on the machine they are reported for.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import mlx.core as mx
import numpy as np
from PIL import Image

from gateway.engine.families.qwen_vl import QwenVL
from gateway.engine.model.window_attention import (
    batch_segment_attention,
    restore_per_segment_attention,
)


def _timed(run: Callable[[], Any]) -> tuple[Any, float]:
    """(evaluated output, wall ms)."""
    start = time.perf_counter()
    out = run()
    mx.eval(out)
    return out, (time.perf_counter() - start) * 1e3


def _features(out: Any) -> mx.array:
    return out[0] if isinstance(out, tuple) else out  # Qwen3-VL also returns deepstack


def _time_size(model: QwenVL, size: int, repeats: int, compare: bool) -> dict:
    """One image size. Variants are interleaved within each repeat, so load on a shared
    machine hits them alike; each reports the median ms after one warm-up round (which
    absorbs kernel compilation and allocator growth, and is reported as `*_first_ms`)."""
    tower = model.model.vision_tower
    rng = np.random.default_rng(size)
    image = Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8), "RGB")
    pixels, grid = model.preprocess(image)
    tower_call = partial(
        tower, mx.array(pixels).astype(model.vision_dtype), mx.array([grid], dtype=mx.int32)
    )

    def stepwise() -> mx.array:
        return model.encode_image(pixels, grid).features  # evaluates block by block

    # name -> (install the attention variant, what to time)
    variants: dict[str, tuple[Callable[[Any], Any], Callable[[], Any]]] = {
        "batched": (batch_segment_attention, tower_call),
        "stepwise": (batch_segment_attention, stepwise),
    }
    if compare:
        variants["per_window"] = (restore_per_segment_attention, tower_call)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    outputs: dict[str, Any] = {}
    try:
        for _ in range(1 + max(1, repeats)):
            for name, (install, run) in variants.items():
                install(tower)
                outputs[name], ms = _timed(run)
                samples[name].append(ms)
    finally:
        batch_segment_attention(tower)
    row: dict[str, Any] = {"grid": list(grid), "patches": int(np.prod(grid))}
    for name, ms in samples.items():
        row[f"{name}_ms"] = round(statistics.median(ms[1:]), 3)
        # Cold call: includes kernel/cuDNN-graph builds for shapes this process has not seen
        # (batched attention has a few more distinct shapes per new image size).
        row[f"{name}_first_ms"] = round(ms[0], 3)
    if compare:
        want = _features(outputs["per_window"]).astype(mx.float32)
        got = _features(outputs["batched"]).astype(mx.float32)
        row["speedup"] = row["per_window_ms"] / row["batched_ms"]
        row["max_abs_diff"] = mx.abs(got - want).max().item()
        row["feature_scale"] = mx.abs(want).max().item()
    return row


def time_tower(
    model_dir: str, sizes: Sequence[int], repeats: int = 5, compare: bool = True
) -> dict[str, Any]:
    """Per square image `size`: median ms of one whole-tower call with batched attention
    (`batched_ms`, one mx.eval at the end) and of the engine's stepwise encode (`stepwise_ms`,
    one eval per block). With `compare` also mlx-vlm's per-window attention (`per_window_ms`)
    on the same weights, and the max abs difference of the two outputs' features."""
    model = QwenVL(model_dir)
    return {
        "model": model_dir,
        "arch": model.arch,
        "dtype": str(model.vision_dtype),
        "device": str(mx.default_device()),
        "repeats": repeats,
        "sizes": {str(size): _time_size(model, size, repeats, compare) for size in sizes},
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--sizes", type=int, nargs="+", default=[448, 1024])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--no-compare", action="store_true", help="skip mlx-vlm's per-window attention"
    )
    args = parser.parse_args(argv)
    report = time_tower(args.model_dir, args.sizes, args.repeats, compare=not args.no_compare)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
