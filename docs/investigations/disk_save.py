"""What handing a prompt's KV blocks to the disk writer costs the engine thread, by how the
bytes are exposed: one buffer view per array (the writer's input until now) or one view of
the arrays joined per block or per store.

    python -m docs.investigations.disk_save [--blocks 5] [--repeats 5]

Why: on the H200 the step that stores a 1024 px image's prompt blocks (5 blocks of
Qwen2.5-VL-7B shapes: 28 layers x (keys, values) of (1, 4, 256, 128) bf16, 14 MiB a block)
spent 28-42 ms in the store (issue 30's largest gaps; the step trace's `store` stage), where
the device copies themselves take ~0.6 ms (docs/investigations/join_cost.py). On Apple
silicon and the CPU an array's buffer view is free (unified memory); on CUDA, MLX exposes a
device buffer to the host by moving it, array by array. Columns, medians over the repeats, ms,
each on fresh evaluated arrays, synchronised:

    per_array       a memoryview of each of the 280 arrays (`raw_tensor` per layer)
    joined_block    per block, its 56 arrays joined into one flat device array, evaluated,
                    one memoryview (tensors are byte slices of it)
    joined_store    all blocks joined into one array, one memoryview
    reread_before   a device reduction over the arrays before any view (their home)
    reread_after    the same after `per_array`'s views: did the arrays leave the device?
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from gateway.engine.disk.tier import raw_tensor

LAYERS, HEADS, BLOCK, DIM = 28, 4, 256, 128


def _blocks(n: int, seed: int) -> list[list[mx.array]]:
    mx.random.seed(seed)
    shape = (1, HEADS, BLOCK, DIM)
    out = [[mx.random.normal(shape).astype(mx.bfloat16) for _ in range(2 * LAYERS)]
           for _ in range(n)]  # fmt: skip
    mx.eval(out)
    mx.synchronize()
    return out


def _timed(run: Callable[[], Any]) -> float:
    mx.synchronize()
    started = time.perf_counter()
    run()
    mx.synchronize()
    return 1000 * (time.perf_counter() - started)


def _joined_views(groups: list[list[mx.array]]) -> list[memoryview]:
    flats = [mx.concatenate([a.reshape(-1) for a in group]) for group in groups]
    mx.eval(flats)
    return [memoryview(f).cast("B") for f in flats]


def _reread(blocks: list[list[mx.array]]) -> None:
    mx.eval(sum(mx.sum(a.astype(mx.float32)) for block in blocks for a in block))


def measure(blocks: int, repeats: int) -> dict[str, Any]:
    rows: dict[str, list[float]] = {}
    for rep in range(repeats + 1):  # the first round warms kernels and buffers up
        sample = {}
        arrays = _blocks(blocks, rep)
        sample["reread_before"] = _timed(lambda: _reread(arrays))  # noqa: B023
        views: list[Any] = []
        sample["per_array"] = _timed(
            lambda: views.extend(raw_tensor(a) for block in arrays for a in block)  # noqa: B023
        )
        sample["reread_after"] = _timed(lambda: _reread(arrays))  # noqa: B023
        arrays = _blocks(blocks, 100 + rep)
        sample["joined_block"] = _timed(lambda: _joined_views(arrays))  # noqa: B023
        arrays = _blocks(blocks, 200 + rep)
        sample["joined_store"] = _timed(
            lambda: _joined_views([[a for block in arrays for a in block]])  # noqa: B023
        )
        if rep:
            for name, ms in sample.items():
                rows.setdefault(name, []).append(ms)
    return {
        "device": str(mx.default_device()),
        "blocks": blocks,
        "arrays": blocks * 2 * LAYERS,
        "mib": round(blocks * 2 * LAYERS * HEADS * BLOCK * DIM * 2 / 2**20, 1),
        **{name: round(statistics.median(ms), 2) for name, ms in rows.items()},
        "ranges": {name: [round(min(ms), 2), round(max(ms), 2)] for name, ms in rows.items()},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    print(json.dumps(measure(args.blocks, args.repeats)))


if __name__ == "__main__":
    main()
