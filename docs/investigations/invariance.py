"""Batched == single, measured: does a request's output depend on what it runs with?

    python -m docs.investigations.invariance [--model DIR] [--requests 8] [--tokens 32] [--out F]

Two levels, on whatever device MLX uses (CPU here, CUDA on the H200):
- forward: N text prompts' final partial blocks (the exact-reuse rule's shared forward,
  `QwenVL.prefill_group`) against each prompt's block alone (`prefill`): how many
  rows' last hidden states and KV are bit-identical, and the largest difference;
- engine: N greedy requests (distinct prompts, `ignore_eos`, logprobs) each alone, then all
  submitted at once (their final blocks share a forward, they decode as one batch): how many
  differ in any token id or logprob, where the first token differs, and the largest logprob
  difference over the tokens before that.
The first answers whether bursts can share a forward without changing answers on this
backend; the second is issue 14's point 5 (batched == single) as users would see it.
Without --model a tiny random checkpoint is built (CPU smoke run).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from gateway.config import CacheConfig, EngineConfig
from gateway.engine.core import Engine
from gateway.engine.families.qwen_vl import QwenVL
from gateway.engine.model.prompt_forward import GroupPart
from gateway.engine.request import (
    EngineRequest,
    ErrorEvent,
    FinishEvent,
    SamplingParams,
    TokenEvent,
)
from gateway.engine.scheduler.prefill import Prefiller
from gateway.metrics import Metrics


@dataclass
class _Answer:
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    def sink(self, event: object) -> None:
        if isinstance(event, TokenEvent):
            self.ids.extend(event.token_ids)
            self.logprobs.extend(lp.logprob for lp in event.logprobs)
        elif isinstance(event, (FinishEvent, ErrorEvent)):
            self.error = event.message if isinstance(event, ErrorEvent) else None
            self.done.set()


def _prompts(vocab: int, count: int, lengths: tuple[int, int]) -> list[list[int]]:
    """`count` distinct prompts, lengths spread over [lo, hi], ids from a fixed seed."""
    rng = np.random.default_rng(7)
    lo, hi = lengths
    sizes = np.linspace(lo, hi, count).astype(int)
    return [rng.integers(100, vocab - 100, size=int(n)).tolist() for n in sizes]


def forward_level(model: QwenVL, prompts: list[list[int]], rows: int) -> dict:
    """Each prompt's single block (`rows` query rows) alone vs all in one shared forward."""
    plans = [model.prefill_plan(p, [], [], 0, len(p)) for p in prompts]
    alone_h, alone_k = [], []
    for plan in plans:
        cache = model.new_cache()
        hidden = model.prefill(plan, cache, 0, plan.length, rows=rows)
        alone_h.append(hidden[0, plan.length - 1])
        alone_k.append(cache[-1].keys[0, :, : plan.length])
    caches = [model.new_cache() for _ in plans]
    parts = [GroupPart(plan, c, 0, plan.length) for plan, c in zip(plans, caches)]
    hidden = model.prefill_group(parts, rows)
    same_h = same_k = 0
    diff = 0.0
    for i, plan in enumerate(plans):
        h = hidden[i, plan.length - 1]
        k = caches[i][-1].keys[0, :, : plan.length]
        mx.eval(h, k, alone_h[i], alone_k[i])
        same_h += bool(mx.array_equal(h, alone_h[i]).item())
        same_k += bool(mx.array_equal(k, alone_k[i]).item())
        delta = mx.abs(h.astype(mx.float32) - alone_h[i].astype(mx.float32)).max()
        diff = max(diff, float(delta.item()))
    n = len(plans)
    return {"rows": rows, "prompts": n, "hidden_identical": same_h, "kv_identical": same_k,
            "max_hidden_diff": diff}  # fmt: skip


def _submit(engine: Engine, ids: list[int], tokens: int, name: str) -> _Answer:
    sampling = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, logprobs=True)
    answer = _Answer()
    engine.submit(EngineRequest(name, tuple(ids), (), sampling, time.perf_counter()), answer.sink)
    return answer


def engine_level(engine: Engine, prompts: list[list[int]], tokens: int) -> dict:
    """Each prompt alone, then all at once; compare token ids and logprobs."""
    alone = []
    for i, p in enumerate(prompts):
        answer = _submit(engine, p, tokens, f"alone-{i}")
        answer.done.wait(600)
        alone.append(answer)
    together = [_submit(engine, p, tokens, f"together-{i}") for i, p in enumerate(prompts)]
    for answer in together:
        answer.done.wait(600)
    errors = [a.error for a in alone + together if a.error]
    if errors:
        raise RuntimeError(errors[0])
    differ, first_diff, max_lp = 0, [], 0.0
    for a, b in zip(alone, together):
        if a.ids == b.ids and a.logprobs == b.logprobs:
            continue
        differ += 1
        split = next((j for j, (x, y) in enumerate(zip(a.ids, b.ids)) if x != y), len(a.ids))
        first_diff.append(split)
        for x, y in zip(a.logprobs[: split + 1], b.logprobs[: split + 1]):
            max_lp = max(max_lp, abs(x - y))
    return {"requests": len(prompts), "tokens": tokens, "differing": differ,
            "first_token_diff_at": first_diff, "max_logprob_diff": max_lp}  # fmt: skip


def run(model_dir: str, requests: int, tokens: int, lengths: tuple[int, int]) -> dict[str, Any]:
    """Both levels on one loaded model: the forward level on this thread first, then the
    engine (which owns the model from then on)."""
    model = QwenVL(model_dir)
    on_gpu = mx.default_device().type == mx.DeviceType.gpu
    caches = CacheConfig(vision_enabled=False, prefix_enabled=False)
    block = caches.exact_block_tokens(on_gpu)
    prompts = _prompts(model.vocab_size, requests, lengths)
    out: dict[str, Any] = {"device": str(mx.default_device()), "block": block}
    if block:
        rows = Prefiller(model, None, block).final_rows(max(len(p) for p in prompts))  # type: ignore[arg-type]
        out["forward"] = forward_level(model, prompts, rows)
    config = EngineConfig(model=model_dir, served_model_name="inv", max_batch=max(requests, 1),
                          cache=caches)  # fmt: skip
    engine = Engine(config, Metrics(), loader=lambda: model)
    engine.start()
    try:
        out["engine"] = engine_level(engine, prompts, tokens)
    finally:
        engine.stop()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="checkpoint dir (default: a tiny random one)")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="generated tokens per request")
    parser.add_argument("--lengths", type=int, nargs=2, default=(12, 28),
                        help="prompt lengths, shortest and longest (tokens)")  # fmt: skip
    parser.add_argument("--out", help="write the JSON here too")
    args = parser.parse_args(argv)
    model = args.model
    if model is None:
        from gateway.offline_model import build_model

        model = str(build_model(Path(tempfile.mkdtemp()) / "tiny", "qwen2_5_vl", "tiny", 0))
    result = run(model, args.requests, args.tokens, tuple(args.lengths))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
