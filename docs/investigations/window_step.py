"""One decode step of a sliding-window family (Gemma 3 / 4), engine against raw mlx-lm, by
cache layout: where a Gemma 3 decode step's time goes.

    python -m docs.investigations.window_step --model DIR [--batch 1 16] [--prompt 128]

On the H200 (Gemma 3 4B shapes, bf16; docs/performance.md run 14) the server decoded one
stream at 52 tok/s against raw mlx-lm's 102, where Qwen2.5-VL-7B runs at ~0.9x raw. The
engine's sliding layers keep every position and gather the window in mlx-vlm's ring order at
each one-row step (gateway/engine/model/window_kv.py); mlx-lm's rotate a ring buffer in
place. Variants, each `--batch` rows of `--prompt` tokens merged into one batch, then timed
one-row steps (each evaluated and synchronised; median of the last 50 of 60):

    raw           mlx-lm's own model (bench.raw) with its batch caches (rotating ring)
    engine        the family's text core with its caches (`WindowBatchKVCache`), the step's
                  gather index shared by all sliding layers (`shared_ring`)
    per_layer     the same, each sliding layer computing its own index (before `shared_ring`)
    no_window     the family's text core with plain caches in every layer (no window, no
                  gather: not the model's function, only what the gather costs)

Prints one JSON object: ms per step per variant and batch size.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from typing import Any

import mlx.core as mx
from mlx_lm.generate import _merge_caches
from mlx_lm.models.cache import make_prompt_cache

from bench.raw import load_text_model
from gateway.engine.families.registry import load_model
from gateway.engine.model.kv import RowKVCache


def _batch(model: Any, new_cache: Any, rows: int, prompt: int) -> list[Any]:
    caches = []
    for i in range(rows):
        cache = new_cache()
        ids = mx.array([[7 + i] + list(range(100, 100 + prompt - 1))], dtype=mx.int32)
        mx.eval(model(ids, cache=cache))
        mx.eval([c.state for c in cache])
        caches.append(cache)
    return _merge_caches(caches)


def _step_ms(model: Any, batch: list[Any], rows: int, steps: int = 60) -> float:
    token = mx.full((rows, 1), 42, dtype=mx.int32)
    times = []
    for _ in range(steps):
        mx.synchronize()
        started = time.perf_counter()
        mx.eval(model(token, cache=batch))
        mx.synchronize()
        times.append(1000 * (time.perf_counter() - started))
    return round(statistics.median(times[10:]), 3)


def measure(model_dir: str, batches: list[int], prompt: int) -> dict[str, Any]:
    import gateway.engine.families.gemma3_forward as forward

    family = load_model(model_dir)
    raw = load_text_model(model_dir)
    core = family.text_core
    plain = lambda: [RowKVCache() for _ in family.new_cache()]  # noqa: E731
    shared = forward.shared_ring
    out: dict[str, Any] = {"model": model_dir, "prompt": prompt}
    for rows in batches:
        for rep in range(2):  # the first round warms kernels up
            got = {
                "raw": _step_ms(
                    raw, _batch(raw, lambda: make_prompt_cache(raw), rows, prompt), rows
                ),
                "engine": _step_ms(core, _batch(core, family.new_cache, rows, prompt), rows),
            }
            forward.shared_ring = lambda *_: contextlib.nullcontext()
            try:
                got["per_layer"] = _step_ms(
                    core, _batch(core, family.new_cache, rows, prompt), rows
                )
            finally:
                forward.shared_ring = shared
            got["no_window"] = _step_ms(core, _batch(core, plain, rows, prompt), rows)
            if rep:
                out[f"batch_{rows}"] = got
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    p.add_argument("--prompt", type=int, default=128)
    args = p.parse_args(argv)
    print(json.dumps(measure(args.model, args.batch, args.prompt)), flush=True)


if __name__ == "__main__":
    main()
