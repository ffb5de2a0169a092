"""The language model as the batch decoder sees it.

Pinned: under continuous batching (rows finishing and joining while the batch never empties)
no layer's per-row bookkeeping (offsets, left padding, rope deltas) grows a lazy graph. Only
layer 0's offsets feed the forward, so without care the other layers' arrays chain one node
per step for as long as the batch lives: a native leak that MLX's memory counters never see.
"""

from __future__ import annotations

import io
import random

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from support import tiny_model

from gateway.engine.families.qwen_vl import QwenVL
from gateway.engine.model.kv import RowBatchKVCache


def graph_ops(array: mx.array) -> int:
    """Primitive nodes an evaluation of `array` would still have to run (0 = evaluated)."""
    dot = io.StringIO()
    mx.export_to_dot(dot, array)
    return dot.getvalue().count("shape=rectangle")


def test_batch_bookkeeping_stays_evaluated_under_churn() -> None:
    """Invariant: lazy graphs of batch bookkeeping stay bounded however long the batch lives."""
    model = QwenVL(str(tiny_model("qwen2_vl")))
    batch = BatchGenerator(model.text_core, completion_batch_size=8, prefill_batch_size=4)
    rng = random.Random(0)
    live: set[int] = set()
    steps = 0
    with mx.stream(batch.stream):
        while steps < 300:
            while len(live) < 6:  # refill so the batch never drains
                prompt = [rng.randrange(100, 1000) for _ in range(rng.randint(3, 12))]
                [uid] = batch.insert([prompt], max_tokens=[rng.randint(2, 9)])
                live.add(uid)
            _, responses = batch.next()
            steps += 1
            live -= {r.uid for r in responses if r.finish_reason is not None}
        caches = [c for c in batch._generation_batch.prompt_cache if isinstance(c, RowBatchKVCache)]
        assert len(caches) == len(model.text_core.layers)
        depth = max(graph_ops(a) for c in caches for a in c.bookkeeping())
        mx.synchronize(batch.stream)
    assert depth <= 16, f"bookkeeping graph is {depth} ops deep after {steps} steps"
