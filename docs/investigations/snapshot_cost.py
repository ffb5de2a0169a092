"""What Qwen3.5's recurrent-state snapshots cost: bytes per block, and the time to take one,
store it, restore it into a request and a batch, and move it through the disk tier's file
format, at real layer shapes.

    python -m docs.investigations.snapshot_cost [--block 256] [--reps 20]

Shapes: transformers' `Qwen3_5TextConfig` defaults (the released text tower's shapes):
32 layers, every 4th full attention (8 layers, 4 KV heads x 256, bf16 KV), 24 gated-delta
layers (16 key heads x 128, 32 value heads x 128, kernel 4): a snapshot per layer is the
convolution window (1, 3, 8192) in bf16 and the recurrent state (1, 32, 128, 128) in
float32. The arrays are random (timing does not depend on values). Steps timed (median ms):

    mark        RowStateCache.mark on every recurrent layer (after a prefill forward)
    store       the block's value as the prefix cache stores it (`layer_block` per layer,
                evaluated): KV rows are copied, snapshots are shared
    restore     `assemble` of a one-block hit into a request's cache (KV joined, state
                layers pointed at the snapshot)
    merge       the request joining a decode batch: its per-layer caches merged (the
                recurrent states copied into the batch's stacked arrays)
    disk_write  the block's tensors encoded as the disk tier writes them (`disk_format`)
    disk_read   decoded and copied back into MLX arrays (`to_array`), as a disk hit does

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import mlx.core as mx

from caches.disk_format import decode, encode
from caches.prefix import PrefixHit
from gateway.engine.disk.kv import BlockLayers
from gateway.engine.disk.tier import raw_tensor, to_array
from gateway.engine.model.kv import RowKVCache, assemble
from gateway.engine.model.snapshots import layer_block, snapshot_nbytes
from gateway.engine.model.state_cache import BatchStateCache, RowStateCache

LAYERS, INTERVAL = 32, 4
KV_HEADS, HEAD_DIM = 4, 256
K_HEADS, V_HEADS, K_DIM, V_DIM, KERNEL = 16, 32, 128, 128, 4


def _caches(block: int) -> list[object]:
    """One request's caches after a prefill forward of one block (random contents)."""
    conv_dim = 2 * K_HEADS * K_DIM + V_HEADS * V_DIM
    out: list[object] = []
    for i in range(LAYERS):
        if (i + 1) % INTERVAL:
            c = RowStateCache()
            c.cache = [
                mx.random.normal((1, KERNEL - 1, conv_dim)).astype(mx.bfloat16),
                mx.random.normal((1, V_HEADS, V_DIM, K_DIM)),
            ]
            c.offset = block
        else:
            shape = (1, KV_HEADS, block, HEAD_DIM)
            c = RowKVCache.from_arrays(
                mx.random.normal(shape).astype(mx.bfloat16),
                mx.random.normal(shape).astype(mx.bfloat16),
                0,
            )
        out.append(c)
    mx.eval([c.state for c in out])  # type: ignore[attr-defined]
    return out


def _median_ms(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return round(statistics.median(times), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    block = args.block
    kv = _caches(block)
    states = [c for c in kv if isinstance(c, RowStateCache)]

    def mark() -> None:
        for c in states:
            c.mark()

    mark()

    def store() -> BlockLayers:
        value = BlockLayers(layer_block(c, 0, block) for c in kv)
        mx.eval(list(value))
        return value

    value = store()
    nbytes = sum(a.nbytes + b.nbytes for a, b in value)
    snap = snapshot_nbytes(value, kv)
    hit = PrefixHit((value,), block, 0, True)

    def restore() -> list[object]:
        empty = [RowStateCache() if isinstance(c, RowStateCache) else RowKVCache() for c in kv]
        return assemble(hit, 0, 1, empty)  # type: ignore[arg-type]

    restored = restore()

    def merge() -> None:
        merged = [type(c).merge([c]) for c in restored]  # type: ignore[attr-defined]
        mx.eval([m.state for m in merged if isinstance(m, BatchStateCache)])

    tensors = {}
    for i, (a, b) in enumerate(value):
        tensors[f"k.{i}"], tensors[f"v.{i}"] = raw_tensor(a), raw_tensor(b)
    blob = encode(tensors, {"block_tokens": str(block)})

    def disk_read() -> None:
        got, _ = decode(blob)
        mx.eval([to_array(t, None) for t in got.values()])

    print(
        json.dumps(
            {
                "device": str(mx.default_device()),
                "block_tokens": block,
                "block_mib": round(nbytes / 2**20, 2),
                "snapshot_mib": round(snap / 2**20, 2),
                "kv_mib": round((nbytes - snap) / 2**20, 2),
                "snapshot_share": round(snap / nbytes, 3),
                "ms": {
                    "mark": _median_ms(mark, args.reps),
                    "store": _median_ms(store, args.reps),
                    "restore": _median_ms(restore, args.reps),
                    "merge": _median_ms(merge, args.reps),
                    "disk_write": _median_ms(lambda: encode(tensors, {}), args.reps),
                    "disk_read": _median_ms(disk_read, args.reps),
                },
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
