"""What one decode step's attention costs with quantized KV (`--kv-bits`), at a real model's
attention shapes and without a model (issue 40, "speed").

`python -m docs.investigations.kv_attention [--context 1024 4096] [--batch 1 16] [--reps 20]`:
one layer of Qwen2.5-VL-7B's attention (28 query heads, 4 KV heads of 128, bf16) for one new
token per row over `context` cached positions: full precision is mlx-lm's
`mx.fast.scaled_dot_product_attention` (the new token's keys written into the cache first);
quantized is the new token's keys and values quantized and written (both in place, into a
buffer with room, as the engine's caches write), then mlx-lm's
`quantized_scaled_dot_product_attention` (two quantized matmuls and a softmax), as the engine's
rows decode. The median of `reps` evaluated steps, per configuration, configurations
alternating so both see the same machine load. On a GPU the step is memory-bound, so fewer
bytes read may make it faster; on this CPU the quantized matmuls' unpacking costs compute.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import mlx.core as mx
from mlx_lm.models.base import quantized_scaled_dot_product_attention

Q_HEADS, KV_HEADS, DIM, GROUP = 28, 4, 128, 64


def _step(bits: int, batch: int, context: int) -> Callable[[], mx.array]:
    """A closure running one decode step's attention (evaluated) over a filled cache whose
    buffer has room for the new token (written in place, as the engine's caches do)."""
    shape = (batch, KV_HEADS, context + 1, DIM)
    keys = mx.random.normal(shape).astype(mx.bfloat16)
    values = mx.random.normal(shape).astype(mx.bfloat16)
    new = mx.random.normal((batch, KV_HEADS, 1, DIM)).astype(mx.bfloat16)
    queries = mx.random.normal((batch, Q_HEADS, 1, DIM)).astype(mx.bfloat16)
    held: list = [keys, values]
    if bits:
        held = [mx.quantize(a, group_size=GROUP, bits=bits) for a in held]
    mx.eval(new, queries, held)
    scale = DIM**-0.5

    def plain() -> mx.array:
        for buffer in held:
            buffer[..., context:, :] = new
        return mx.fast.scaled_dot_product_attention(queries, *held, scale=scale)

    def quantized() -> mx.array:
        token = mx.quantize(new, group_size=GROUP, bits=bits)
        for buffer in held:
            for part, rows in zip(buffer, token, strict=True):
                part[..., context:, :] = rows
        return quantized_scaled_dot_product_attention(
            queries * 1, *held, scale=scale, mask=None, group_size=GROUP, bits=bits
        )  # (a copy of the queries: mlx-lm scales them in place)

    return quantized if bits else plain


def measure(contexts: list[int], batches: list[int], reps: int) -> dict[tuple, float]:
    out: dict[tuple, list[float]] = {}
    for context in contexts:
        for batch in batches:
            steps = {bits: _step(bits, batch, context) for bits in (0, 8, 4)}
            for _ in range(reps):
                for bits, step in steps.items():  # alternating: the same load for each
                    started = time.perf_counter()
                    mx.eval(step())
                    out.setdefault((context, batch, bits), []).append(time.perf_counter() - started)
    return {key: statistics.median(times) * 1e3 for key, times in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    print(f"device: {mx.default_device()}")
    for (context, batch, bits), ms in measure(args.context, args.batch, args.reps).items():
        label = f"{bits}-bit" if bits else "bf16"
        print(f"context {context:6d} batch {batch:3d} {label:6s} {ms:9.3f} ms")


if __name__ == "__main__":
    main()
