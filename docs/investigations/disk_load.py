"""What a KV disk hit costs the engine thread at realistic shapes, without a model: the
blocks of one prompt written to a DiskStore, then read back the old way (everything on the
engine thread) and the new way (the reader thread reads, verifies and checks; the engine
thread copies into MLX), while a stand-in for decoding rows (a small MLX op, evaluated in a
loop on the "engine" thread) measures how long it is kept from running.

    python -m docs.investigations.disk_load [--blocks 5] [--repeats 5]

Shape: Qwen2.5-VL-7B's KV, 28 layers x (keys, values) of (1, 4 heads, 256, 128) bf16: 14 MiB
a block; 5 blocks is a 1024 px image's prompt (~1300 tokens). Files are in the page cache
after the first repeat (a restart's second request for a hot image; a cold disk adds its
read time to the reader's part only). Columns, medians over the repeats, ms:
- `inline`: a hit on the engine thread as before this change (read, checksum, checks, copy);
- `engine`: the engine thread's part now (copy into MLX arrays, evaluated);
- `reader`: the reader thread's part now (read, checksum, checks), while the engine steps;
- `longest step`: the longest stand-in step while the reader ran (the GIL the reader holds
  in pieces of at most 1 MiB of hashing), against `step`, its median alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import mlx.core as mx

from caches.disk import DiskStore
from gateway.engine.disk.kv import to_block
from gateway.engine.disk.plan import BlockWant, ReadPlan, check_block
from gateway.engine.disk.reader import DiskReader
from gateway.engine.disk.tier import raw_tensor

LAYERS, HEADS, BLOCK, DIM = 28, 4, 256, 128


def _write(store: DiskStore, blocks: int) -> list[BlockWant]:
    wants = []
    for k in range(blocks):
        arrays = [mx.random.normal((1, HEADS, BLOCK, DIM)).astype(mx.bfloat16) for _ in range(2)]
        mx.eval(arrays)
        tensors = {f"{kv}.{i}": raw_tensor(arrays[j]) for i in range(LAYERS)
                   for j, kv in enumerate("kv")}  # fmt: skip
        items = tuple(range(k * BLOCK, (k + 1) * BLOCK))
        want = BlockWant(k, f"{k:032x}", items, 0)
        meta = {"block_index": str(k), "block_tokens": str(BLOCK), "rope_delta": "0",
                "images": "[]", "token_key": json.dumps(list(items))}  # fmt: skip
        assert store.put("prefix", want.key, tensors, meta)
        wants.append(want)
    return wants


def _inline(store: DiskStore, wants: list[BlockWant]) -> float:
    started = time.perf_counter()
    blocks = []
    for want in wants:
        found = store.get("prefix", want.key)
        assert found is not None
        blocks.append(to_block(check_block(want, BLOCK, LAYERS, found.metadata, found.tensors)))
    mx.eval([b.value for b in blocks])
    return time.perf_counter() - started


def _split(reader: DiskReader, wants: list[BlockWant]) -> tuple[float, float, float]:
    """(engine part, reader part, longest stand-in step while the reader ran), seconds."""
    step = mx.random.normal((64, 64))
    started = time.perf_counter()
    prefetch = reader.submit(ReadPlan(tuple(wants), BLOCK, LAYERS, 0, ()))
    longest, last = 0.0, time.perf_counter()
    while not prefetch.done():
        mx.eval(step @ step)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    read = time.perf_counter() - started
    found = prefetch.result()
    assert len(found.blocks) == len(wants)
    started = time.perf_counter()
    blocks = [to_block(b) for b in found.blocks]
    mx.eval([b.value for b in blocks])
    engine = time.perf_counter() - started
    prefetch.release()
    return engine, read, longest


def _step_alone(repeats: int = 200) -> float:
    step = mx.random.normal((64, 64))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        mx.eval(step @ step)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="disk-load-") as folder:
        store = DiskStore(Path(folder), "bench", 2**40)
        wants = _write(store, args.blocks)
        reader = DiskReader(store)
        _inline(store, wants)  # into the page cache
        inline = [_inline(store, wants) for _ in range(args.repeats)]
        split = [_split(reader, wants) for _ in range(args.repeats)]
        reader.close()
    mb = args.blocks * LAYERS * 2 * HEADS * BLOCK * DIM * 2 / 1e6
    ms = [statistics.median(col) * 1000 for col in (inline, *zip(*split, strict=True))]
    print("| blocks | MB | inline | engine | reader | longest step | step |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.blocks} | {mb:.0f} | {ms[0]:.1f} | {ms[1]:.1f} | {ms[2]:.1f} | {ms[3]:.1f} "
          f"| {_step_alone() * 1000:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
