"""The start-up warm-up (gateway.warmup) on the tiny model.

Pinned here: the warm-up drives every decode path that builds kernels of its own on first
use (greedy, log-probabilities with alternatives, seeded sampling, a grammar) and prompts of
every padded final-block size, without a failure; and afterwards the caches are empty with zeroed
counters, so nothing synthetic is served or counted.
"""

from __future__ import annotations

import time

from support import EngineHarness

from gateway.warmup import Warmup


def test_warmup_covers_each_decode_path_and_leaves_caches_empty() -> None:
    h = EngineHarness("qwen2_5_vl", max_batch=6)
    submitted = []
    submit = h.engine.submit

    def spy(request, sink):  # noqa: ANN001, ANN202
        submitted.append(request)
        return submit(request, sink)

    h.engine.submit = spy  # type: ignore[method-assign]
    try:
        Warmup(h.engine, h.prompts, timeout_s=300, bursts=True).run([56])
        deadline = time.monotonic() + 30  # the reset is applied in the engine's inbox order
        while (stats := h.engine.cache_stats())["prefix"][
            "entries"
        ] and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        h.close()
    sampling = [r.sampling for r in submitted]
    assert any(s.greedy and s.grammar is None and not s.logprobs for s in sampling)
    assert any(s.logprobs and s.top_logprobs > 0 for s in sampling)
    assert any(not s.greedy and s.seed is not None for s in sampling)
    assert any(s.grammar is not None for s in sampling)
    assert any(r.images for r in submitted)  # the image size
    # Prompts in every padded final-block size from 32 to 256 rows (powers of two).
    sizes = {max(32, 1 << (len(r.prompt_ids) - 1).bit_length()) for r in submitted}
    assert {32, 64, 128, 256} <= sizes
    assert stats["vision"]["entries"] == 0 and stats["prefix"]["entries"] == 0
    assert stats["vision"]["hits"] == 0 and stats["prefix"]["hits"] == 0


def test_bursts_fit_an_engine_without_a_queue() -> None:
    """Invariant: the warm-up never submits more than the engine's rows and queue take (a
    burst and its runner at --max-batch 2 --max-waiting 0), so start-up cannot fail on it."""
    h = EngineHarness("qwen2_vl", max_batch=2, max_waiting=0)
    try:
        Warmup(h.engine, h.prompts, timeout_s=300, bursts=True).run([])
    finally:
        h.close()
