"""What a long row joining a decoding batch costs, part by part.

    python -m docs.investigations.join_cost --model DIR [--rows 4] [--row-tokens 300]
        [--join-tokens 1400 1500] [--reps 3]

On the H200 (issue 30, docs/performance.md §8h) the largest gap of running streams while an
image is admitted is the step where the image's request joins the batch: its final prefill
block (45-66 ms against 15-26 for the other blocks) and a decode step of 30-59 ms against
12-20. This separates, on the engine's own model path (`family.text_core`, the family's row
caches, mlx-lm's batch merge and extend as `DecodeBatch` uses them), each piece with a device
synchronisation around it:

    decode_before   one decode step of the `--rows` rows (median of 5)
    merge           the joiner's cache merged into a one-row batch cache (`_merge_caches`)
    extend          that batch appended to the running batch (`_extend_cache`: every row
                    padded to the longest and concatenated)
    decode_join     the first decode step after the join (its cache update re-grows every
                    layer's buffer: mlx-lm's extend leaves no spare slot)
    decode_after    the next decode step
    store_copy      a contiguous copy of the joiner's whole KV, evaluated (what storing the
                    image part in the prefix cache does at the final block)

Variants: `as_is` (today's path), `room` (extend, then give every layer spare slots up to the
next 256 in the same step, so the first decode writes in place). Each joiner length runs
`--reps` times: the first run of a new length shows what is paid once per shape.
Prints one JSON object per (variant, length, rep) and a summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.generate import _extend_cache, _merge_caches

from gateway.engine.families.registry import load_model


def timed(run: Callable[[], Any]) -> tuple[Any, float]:
    mx.synchronize()
    started = time.perf_counter()
    out = run()
    mx.eval(out)
    mx.synchronize()
    return out, 1000 * (time.perf_counter() - started)


def prefill(family: Any, n: int, seed: int) -> list[Any]:
    """A row cache holding `n` random text tokens, fed in 256-token chunks."""
    cache = family.new_cache()
    ids = mx.random.randint(10, 1000, (1, n), key=mx.random.key(seed)).astype(mx.int32)
    for lo in range(0, n, 256):
        mx.eval(family.text_core(ids[:, lo : lo + 256], cache))
        mx.eval([c.state for c in cache])
    return cache


def decode(family: Any, batch: list[Any], rows: int) -> mx.array:
    tokens = mx.full((rows, 1), 42, dtype=mx.int32)
    return mx.argmax(family.text_core(tokens, batch)[:, -1, :], axis=-1)


def give_room(batch: list[Any], step: int = 256) -> None:
    """Spare slots up to the next multiple of `step` past the used length, in every layer."""
    for layer in batch:
        used, size = layer._idx, layer.keys.shape[2]
        want = (used // step + 1) * step
        if size < want:
            pad = [(0, 0), (0, 0), (0, want - size), (0, 0)]
            layer.keys, layer.values = mx.pad(layer.keys, pad), mx.pad(layer.values, pad)
    mx.eval([(c.keys, c.values) for c in batch])


def one_join(family: Any, rows: list[list[Any]], join: int, variant: str, seed: int) -> dict:
    batch = _merge_caches([[c.snapshot() for c in row] for row in rows])
    mx.eval([c.state for c in batch])
    before = [timed(lambda: decode(family, batch, len(rows)))[1] for _ in range(5)]
    joiner = prefill(family, join, seed)
    _, store_ms = timed(lambda: [mx.contiguous(c.keys[..., :join, :]) for c in joiner])
    merged, merge_ms = timed(lambda: _merge_caches([joiner]))

    def extend() -> list[Any]:
        out = _extend_cache(batch, merged)
        if variant == "room":
            give_room(out)
        return [c.state for c in out]

    _, extend_ms = timed(extend)
    n = len(rows) + 1
    _, join_ms = timed(lambda: decode(family, batch, n))
    after = [timed(lambda: decode(family, batch, n))[1] for _ in range(3)]
    return {
        "variant": variant,
        "join_tokens": join,
        "decode_before_ms": round(statistics.median(before), 2),
        "merge_ms": round(merge_ms, 2),
        "extend_ms": round(extend_ms, 2),
        "decode_join_ms": round(join_ms, 2),
        "decode_after_ms": round(statistics.median(after), 2),
        "store_copy_ms": round(store_ms, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--row-tokens", type=int, default=300)
    parser.add_argument("--join-tokens", type=int, nargs="+", default=[1400, 1500])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    family = load_model(args.model)
    rows = [prefill(family, args.row_tokens + 7 * i, i) for i in range(args.rows)]
    results = []
    for join in args.join_tokens:
        for rep in range(args.reps):
            for variant in ("as_is", "room"):
                result = one_join(family, rows, join, variant, 100 + rep)
                result["rep"] = rep
                print(json.dumps(result), flush=True)
                results.append(result)
    keys = [k for k in results[0] if k.endswith("_ms")]
    summary = {
        v: {k: statistics.median(r[k] for r in results if r["variant"] == v) for k in keys}
        for v in ("as_is", "room")
    }
    print(json.dumps({"summary": summary}))


if __name__ == "__main__":
    main()
