"""Log-probability values computed with the decode step (gateway/engine/tokens/logprobs.py).

Pinned: a step's values for each row equal those read from that row alone (`row_values`),
the alternatives sorted and cut to what the request asked; a row or token the step did not
sample gets None (the caller then reads the row itself); and through the engine, a batch of
requests asking for alternatives gets exactly what each gets alone, with the decode steps'
values taken from the step (no per-row read after it).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from support import EngineHarness, chat_body

import gateway.engine.scheduler.endings as endings
from gateway.config import CacheConfig
from gateway.engine.tokens.logprobs import TOP_K, StepLogprobs, row_values


def _logprobs(rows: int, vocab: int = 300, seed: int = 0) -> mx.array:
    logits = mx.array(np.random.default_rng(seed).normal(size=(rows, vocab)), dtype=mx.bfloat16)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def test_step_values_equal_each_row_read_alone() -> None:
    logprobs = _logprobs(4)
    sampled = mx.array([3, 250, 7, 7], dtype=mx.uint32)
    step = StepLogprobs([10, 11, 12, 13], logprobs, sampled, with_top=True)
    for row, (uid, token) in enumerate(zip([10, 11, 12, 13], [3, 250, 7, 7], strict=True)):
        for top in (0, 1, 5, TOP_K):
            got = step.get(uid, token, top)
            assert got == row_values(logprobs[row], token, top)
            assert got is not None and len(got.top) == top
            values = [v for _, v in got.top]
            assert values == sorted(values, reverse=True)
        assert got.chosen == pytest.approx(float(logprobs[row, token].astype(mx.float32)))
    assert step.get(99, 3, 0) is None  # not a row of this step
    assert step.get(10, 4, 0) is None  # not the token it sampled
    chosen_only = StepLogprobs([10], logprobs[:1], sampled[:1], with_top=False)
    assert chosen_only.get(10, 3, 0) == row_values(logprobs[0], 3, 0)
    assert chosen_only.get(10, 3, 5) is None  # alternatives were not computed


def test_batched_alternatives_equal_alone_and_come_from_the_step(monkeypatch) -> None:
    h = EngineHarness("qwen2_5_vl", cache=CacheConfig(prefix_enabled=False), max_batch=8)
    questions = ["one thing", "a second, longer thing to say", "three", "four and more"]
    bodies = [chat_body(q, max_tokens=8, top_logprobs=5) for q in questions]
    try:
        alone = [h.run(body) for body in bodies]
        reads = []
        real = endings.row_values

        def spy(*args):  # noqa: ANN002, ANN202
            reads.append(args)
            return real(*args)

        monkeypatch.setattr(endings, "row_values", spy)
        with h.arriving_together():
            runs = [h.submit(body) for body in bodies]
        together = [r.wait() for r in runs]
    finally:
        h.close()

    def alternatives(run) -> list:  # noqa: ANN001
        events = [e for e in run.events if hasattr(e, "logprobs")]
        return [(lp.token_id, lp.logprob, lp.top) for e in events for lp in e.logprobs]

    for a, b in zip(alone, together, strict=True):
        assert a.token_ids == b.token_ids
        assert alternatives(a) == alternatives(b)
        assert all(len(top) == 5 for _, _, top in alternatives(b))
    # Only the first tokens (from each prefill) were read row by row (the others' are those of
    # the request holding the engine, which asks for no alternatives).
    assert len([r for r in reads if r[2] == 5]) == len(bodies)
