"""Prefill under the exact-reuse rule: how a final partial block is shaped, and requests whose
final blocks share one forward.

Pinned: a final partial block is padded to the next power of two from 32 rows (at most one
block), a whole block is a block; requests arriving together whose next forward is their final
partial block at the same absolute position share one forward, and each one's tokens and
logprobs are then exactly (tolerance zero) those of the same request alone without any cache,
for text prompts and for repeat questions whose hit ends inside an image, on all three
architectures in bf16 and 4-bit; a burst is never handed to the batch to prefill; a failure
in one request's set-up or first token fails that request alone, not its burst or the rows
decoding meanwhile.
"""

from __future__ import annotations

import pytest
from support import EngineHarness, block_shaped, chat_body, noise_image

from gateway.config import CacheConfig
from gateway.engine.scheduler.prefill import Prefiller

ARCHS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
VARIANTS = [(arch, w) for w in ("bfloat16", "q4") for arch in ARCHS]


def test_final_rows_pads_a_partial_final_block_to_a_power_of_two() -> None:
    prefiller = Prefiller(model=None, cache_ops=None, block=256)  # type: ignore[arg-type]
    shapes = {real: prefiller.final_rows(real) for real in (1, 27, 32, 33, 100, 129, 255, 256)}
    assert shapes == {1: 32, 27: 32, 32: 32, 33: 64, 100: 128, 129: 256, 255: 256, 256: 256}
    small = Prefiller(model=None, cache_ops=None, block=8)  # type: ignore[arg-type]
    assert [small.final_rows(n) for n in (1, 3, 8)] == [2, 4, 8]  # from a quarter block
    cpu = Prefiller(model=None, cache_ops=None, block=32)  # type: ignore[arg-type]
    assert [cpu.final_rows(n) for n in (1, 8, 9, 17, 32)] == [8, 8, 16, 32, 32]


def _burst(h: EngineHarness, image: object, together: bool) -> list:
    """Three short text questions and two repeat questions about `image` (asked once
    before, so a cache holding it hits), submitted together or one after the other."""
    h.run(chat_body("Describe it.", images=1, max_tokens=4), [image])
    bodies = [(chat_body(q, max_tokens=6), []) for q in ("Hi?", "Name a colour.", "Why?")]
    bodies += [(chat_body(q, images=1, max_tokens=6), [image]) for q in ("What?", "Where?")]
    if not together:
        return [h.run(body, images) for body, images in bodies]
    with h.arriving_together():
        runs = [h.submit(body, images) for body, images in bodies]
    return [r.wait() for r in runs]


@pytest.mark.parametrize(("arch", "weights"), VARIANTS, ids=[f"{a}-{w}" for a, w in VARIANTS])
def test_final_blocks_share_a_forward_and_answer_as_alone(arch: str, weights: str) -> None:
    cached = EngineHarness(arch, weights, max_batch=8)
    plain = EngineHarness(
        arch, weights, max_batch=8, cache=CacheConfig(vision_enabled=False, prefix_enabled=False)
    )
    model = cached.engine.model
    group, shared = model.prefill_group, []
    joined: list[int] = []
    inserted: list[int] = []
    join, insert = cached.engine.scheduler.batch.join, cached.engine.scheduler.batch.insert

    def spy_group(parts, rows):  # noqa: ANN001, ANN202
        shared.append((len(parts), rows, parts[0].cache[0].offset))
        return group(parts, rows)

    def spy_join(job, token, *args):  # noqa: ANN001, ANN002, ANN202
        joined.append(token)
        return join(job, token, *args)

    def spy_insert(job, tokens, *args):  # noqa: ANN001, ANN002, ANN202
        inserted.append(len(tokens))
        return insert(job, tokens, *args)

    model.prefill_group = spy_group
    cached.engine.scheduler.batch.join = spy_join
    cached.engine.scheduler.batch.insert = spy_insert
    try:
        image = noise_image(71, 224, 224)
        together = _burst(cached, image, together=True)
        alone = _burst(plain, image, together=False)
    finally:
        cached.close()
        plain.close()
    block = cached.engine.config.cache.exact_block_tokens(on_gpu=False)
    assert shared and max(n for n, _, _ in shared) >= 2  # a forward was shared
    assert block_shaped([(offset, rows) for _, rows, offset in shared], block)
    # Requests join with their first token; none hands a prompt to the generator's prefill.
    assert len(joined) >= 6 and not inserted
    assert any(r.finish.usage.cached_tokens > 0 for r in together[3:])  # repeats were hits
    for i, (a, b) in enumerate(zip(together, alone, strict=True)):
        assert a.token_ids == b.token_ids, f"request {i + 1}"
        assert a.logprobs == b.logprobs, f"request {i + 1}"  # tolerance exactly zero


def _burst_with_one_broken(patch: str) -> tuple[list, object]:
    """Three short prompts arriving together while a request decodes, the second one's
    `patch` (a Prefiller method) raising; returns (the three runs, the decoding run)."""
    h = EngineHarness("qwen2_vl", "bfloat16", max_batch=8)
    prefiller = h.engine.loaded.prefiller
    original = getattr(prefiller, patch)

    def broken(job, *args):  # noqa: ANN001, ANN002, ANN202
        if job.request_id == "req-3":
            raise RuntimeError("broken on purpose")
        return original(job, *args)

    setattr(prefiller, patch, broken)
    try:
        with h.arriving_together():
            holder = h.engine.scheduler.jobs["req-1"]  # the request that holds the engine, decoding
            runs = [h.submit(chat_body(q, max_tokens=4)) for q in ("Hi?", "Hey?", "Yo?")]
        runs = [r.wait() for r in runs]
        holder_run = holder.sink.__self__.wait()
    finally:
        h.close()
    return runs, holder_run


@pytest.mark.parametrize("patch", ["_plan", "_first_token"])
def test_a_failure_in_a_shared_prefill_fails_that_request_alone(patch: str) -> None:
    """A request whose set-up (`_plan`) or first token (`_first_token`) fails ends with an
    error; the other requests of its burst and the request decoding meanwhile answer."""
    runs, holder = _burst_with_one_broken(patch)
    broken = runs[1]
    assert type(broken.finish).__name__ == "ErrorEvent" and "broken" in broken.finish.message
    for run in (runs[0], runs[2], holder):
        assert type(run.finish).__name__ == "FinishEvent", run.finish


def test_prefill_budget_bounds_the_stall_of_a_busy_batch_and_widens_for_bursts() -> None:
    """Invariant: a request arriving alone at a decoding batch is prefilled one chunk per step
    (the rows' stall bound); with nothing decoding, or a burst of at least a quarter of the
    rows, a step may prefill 4 chunks (fewer, larger forwards)."""
    from gateway.engine.scheduler.prefill_stage import prefill_budget

    assert prefill_budget(512, rows=8, waiting=1) == 512  # one image joins 8 streams
    assert prefill_budget(512, rows=32, waiting=1) == 512
    assert prefill_budget(512, rows=32, waiting=7) == 512  # under a quarter
    assert prefill_budget(512, rows=0, waiting=1) == 2048  # nothing to stall
    assert prefill_budget(512, rows=1, waiting=31) == 2048  # a wave arriving
    assert prefill_budget(512, rows=24, waiting=8) == 2048
