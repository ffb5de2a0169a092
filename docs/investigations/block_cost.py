"""What one prefill forward costs, by path: where a cold prompt's prefill time goes.

    python -m docs.investigations.block_cost --model DIR [--prompt-tokens 1393] [--block 256]

On an H200 a cold 1024x1024 image prompt (1393 tokens) spends ~100-160 ms in the engine's
prefill against 37 ms for raw mlx-lm's one forward of as many tokens. The engine computes
that prompt in blocks of 256 query rows (the exact-reuse rule, docs/caching.md), through
mlx-vlm's language model with input embeddings and 3-axis mRoPE positions. This bench
separates the three factors on text tokens of the same count, all in one process, the
variants interleaved per repetition (a lent VM drifts within minutes):

    raw_one        mlx-lm's text model (bench.raw), the whole prompt in one forward
    raw_blocks     the same model, the prompt in blocks of `block` rows (last one partial)
    engine_blocks  the engine's prefill path (`QwenVL.prefill` on a plan from
                   `prefill_plan`), blocks of `block` rows, the last padded as the engine
                   pads it (`final_rows`); text blocks take the one-kernel rope (1bc88c4)
    engine_blocks_mrope  the same with the multimodal rope for every block (the path image
                   blocks take), its apply compiled (gateway/engine/model/compiled_mrope.py)
    engine_blocks_mrope_eager  the same with mlx-vlm's eager apply (image blocks before it)
    textcore_blocks  the engine's decode model (`TextCore`: token ids, fused rope) in blocks

Prints one JSON object: each variant's median total ms and per-block ms, whether the compiled
mRoPE is installed and whether it is bit-identical to the eager apply on this device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from bench.raw import load_text_model
from bench.raw_measure import token_ids
from gateway.engine.families.qwen_vl import QwenVL
from gateway.engine.model.compiled_mrope import eager_mrope
from gateway.engine.model.prompt_forward import forward
from gateway.engine.scheduler.prefill import final_rows


def _spans(n: int, block: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + block, n)) for lo in range(0, n, block)]


def variants(raw: Any, vlm: QwenVL, ids: list[int], block: int) -> dict[str, Any]:
    """name -> a function running the whole prompt once from an empty cache and returning
    the wall ms of each forward (each forward evaluated before the next)."""

    def timed(forwards: list[Callable[[], Any]]) -> list[float]:
        times = []
        for run in forwards:
            mx.synchronize()
            started = time.perf_counter()
            mx.eval(run())
            times.append(1000 * (time.perf_counter() - started))
        return times

    def raw_one() -> list[float]:
        cache = make_prompt_cache(raw)
        return timed([lambda: [raw(mx.array([ids]), cache=cache), *(c.state for c in cache)]])

    def raw_blocks() -> list[float]:
        cache = make_prompt_cache(raw)

        def step(lo: int, hi: int) -> Callable[[], Any]:
            return lambda: [raw(mx.array([ids[lo:hi]]), cache=cache), *(c.state for c in cache)]

        return timed([step(lo, hi) for lo, hi in _spans(len(ids), block)])

    def engine_blocks() -> list[float]:
        cache = vlm.new_cache()
        plan = vlm.prefill_plan(ids, [], [], 0, len(ids))

        def step(lo: int, hi: int) -> Callable[[], Any]:
            rows = final_rows(hi - lo, block)
            return lambda: vlm.prefill(plan, cache, lo, hi, rows=rows)

        return timed([step(lo, hi) for lo, hi in _spans(len(ids), block)])

    def engine_blocks_mrope() -> list[float]:
        cache = vlm.new_cache()
        plan = vlm.prefill_plan(ids, [], [], 0, len(ids))
        lm = vlm.model.language_model.model

        def step(lo: int, hi: int) -> Callable[[], Any]:
            rows = final_rows(hi - lo, block)
            return lambda: forward(lm, plan, cache, lo, hi, rows, fast_text=False)

        return timed([step(lo, hi) for lo, hi in _spans(len(ids), block)])

    def engine_blocks_mrope_eager() -> list[float]:
        with eager_mrope():
            return engine_blocks_mrope()

    def textcore_blocks() -> list[float]:
        cache = vlm.new_cache()

        def step(lo: int, hi: int) -> Callable[[], Any]:
            return lambda: [
                vlm.text_core(mx.array([ids[lo:hi]], dtype=mx.int32), cache),
                *(c.state for c in cache),
            ]

        return timed([step(lo, hi) for lo, hi in _spans(len(ids), block)])

    return {
        "raw_one": raw_one,
        "raw_blocks": raw_blocks,
        "engine_blocks": engine_blocks,
        "engine_blocks_mrope": engine_blocks_mrope,
        "engine_blocks_mrope_eager": engine_blocks_mrope_eager,
        "textcore_blocks": textcore_blocks,
    }


def mrope_identical(vlm: QwenVL, ids: list[int], block: int) -> bool:
    """The first block's hidden states and KV through the multimodal rope, compiled against
    mlx-vlm's eager apply: bit-identical on this backend? (Pinned on CPU by the tests; this
    checks the device the bench runs on.)"""
    lm = vlm.model.language_model.model
    plan = vlm.prefill_plan(ids, [], [], 0, len(ids))
    hi = min(block, len(ids))

    def run() -> list[mx.array]:
        cache = vlm.new_cache()
        hidden = forward(lm, plan, cache, 0, hi, final_rows(hi, block), fast_text=False)
        out = [hidden, *cache[-1].state]
        mx.eval(out)
        return out

    compiled = run()
    with eager_mrope():
        eager = run()
    return all(mx.array_equal(a, b).item() for a, b in zip(compiled, eager, strict=True))


def measure(model_dir: str, prompt_tokens: int, block: int, reps: int) -> dict[str, Any]:
    vlm = QwenVL(model_dir)
    raw = load_text_model(model_dir)
    ids = token_ids(prompt_tokens, vlm.vocab_size, 5)
    runs = variants(raw, vlm, ids, block)
    samples: dict[str, list[list[float]]] = {name: [] for name in runs}
    for rep in range(reps + 2):  # two untimed rounds first: kernels, buffers
        for name, run in runs.items():
            times = run()
            if rep >= 2:
                samples[name].append(times)
        print(f"block_cost: round {rep + 1}/{reps + 2}", file=sys.stderr, flush=True)
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "block": block, "reps": reps}
    # Without the compiled apply (another arch, or Metal's fused kernel) both mRoPE variants
    # run the same code.
    out["compiled_mrope"] = vlm.compiled_mrope
    out["mrope_bit_identical"] = mrope_identical(vlm, ids, block)
    for name, rounds in samples.items():
        totals = [sum(r) for r in rounds]
        per_block = [statistics.median(col) for col in zip(*rounds)]
        out[name] = {
            "total_ms": round(statistics.median(totals), 2),
            "per_block_ms": [round(x, 2) for x in per_block],
        }
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m docs.investigations.block_cost", description=__doc__
    )
    p.add_argument("--model", required=True, help="local checkpoint dir (Qwen-VL)")
    p.add_argument("--prompt-tokens", type=int, default=1393)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    print(json.dumps(measure(args.model, args.prompt_tokens, args.block, args.reps)))


if __name__ == "__main__":
    main()
