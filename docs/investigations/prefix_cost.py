"""What a prefix hit costs the engine before prefill: lookup + assembly of the block radix
tree, against the snapshot store it replaced (one contiguous array per entry, forked by a
slice).

`python -m docs.investigations.prefix_cost [--repeats N]` prints one markdown row per shape: a
conversation's prompt of `tokens` tokens stored as blocks of `block` tokens; a request that
hits all whole blocks but the last and then writes one block of prefill KV into its cache.

- radix: `PrefixCache.lookup` (key items, one dict step per block) + `assemble` (the blocks
  copied into one buffer with room for the rest) + the first block's in-place write;
- snapshot: the old fork: a slice of the stored array, whose first write reallocates (a
  copy of the prefix, the same amount of memory traffic as the radix assembly).

Times are medians in ms over `--repeats` requests, evaluated (mx.eval) each time. The old
store's lookup (a bisect plus two C-level tuple comparisons) is not re-run here: it was a
few microseconds, below this table's resolution.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

from caches.prefix import ImageSpan, PrefixCache
from caches.radix import Block
from gateway.engine.model.kv import RowKVCache, assemble

SHAPES = (  # name, layers, kv heads, head dim, dtype, tokens, block
    ("tiny (CPU default)", 2, 2, 16, mx.float32, 305, 32),
    ("7B-shaped bf16", 28, 4, 128, mx.bfloat16, 1400, 32),
    ("7B-shaped bf16", 28, 4, 128, mx.bfloat16, 1400, 256),
    ("7B-shaped bf16", 28, 4, 128, mx.bfloat16, 8000, 256),
)


def _kv(layers: int, heads: int, dim: int, dtype: mx.Dtype, tokens: int) -> list[RowKVCache]:
    out = []
    for _ in range(layers):
        k = mx.random.normal((1, heads, tokens, dim)).astype(dtype)
        out.append(RowKVCache.from_arrays(k, k + 1, 0))
    mx.eval([c.keys for c in out], [c.values for c in out])
    return out


def _radix(kv: list[RowKVCache], prompt: list[int], spans: list[ImageSpan], block: int) -> float:
    cache = PrefixCache(10**12, block_tokens=block)

    def make(k: int) -> Block:
        lo, hi = k * block, (k + 1) * block
        arrays = tuple(
            (mx.contiguous(c.keys[..., lo:hi, :]), mx.contiguous(c.values[..., lo:hi, :]))
            for c in kv
        )
        mx.eval(arrays)
        return Block(arrays, sum(a.nbytes + b.nbytes for a, b in arrays))

    cache.store(prompt, spans, make)
    query = prompt + [7] * 20
    new = [c.keys[..., :block, :] for c in kv]
    started = time.perf_counter()
    hit = cache.lookup(query, spans, align=block)
    assert hit is not None
    layers = assemble(hit, 0, len(query) - hit.tokens + block)
    for layer, rows in zip(layers, new):
        layer.update_and_fetch(rows, rows)
    mx.eval([c.keys for c in layers], [c.values for c in layers])
    return time.perf_counter() - started


def _snapshot(kv: list[RowKVCache], tokens: int, block: int) -> float:
    use = (tokens - 1) // block * block
    new = [c.keys[..., :block, :] for c in kv]
    started = time.perf_counter()
    layers = [RowKVCache.from_arrays(c.keys[..., :use, :], c.values[..., :use, :], 0) for c in kv]
    mx.eval([c.keys for c in layers])
    for layer, rows in zip(layers, new):
        layer.update_and_fetch(rows, rows)
    mx.eval([c.keys for c in layers], [c.values for c in layers])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print("| shape | prompt tokens | block | radix lookup + assembly ms | snapshot fork ms |")
    print("|---|---|---|---|---|")
    for name, layers, heads, dim, dtype, tokens, block in SHAPES:
        kv = _kv(layers, heads, dim, dtype, tokens)
        prompt = [5] * 20 + [151655] * 64 + list(range(tokens - 84))
        spans = [ImageSpan(20, 84, "f" * 32)]
        radix = statistics.median(_radix(kv, prompt, spans, block) for _ in range(args.repeats))
        snap = statistics.median(_snapshot(kv, tokens, block) for _ in range(args.repeats))
        print(f"| {name} | {tokens} | {block} | {radix * 1e3:.2f} | {snap * 1e3:.2f} |")


if __name__ == "__main__":
    main()
