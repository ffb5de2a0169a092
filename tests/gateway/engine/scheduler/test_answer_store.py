"""Answer prefill (gateway.engine.scheduler.answer_store): follow-up turns reuse the previous
answer's KV, exactly.

Pinned: for every family whose prefix cache is on (Qwen2-VL, SmolVLM, Gemma 3, Mistral 3,
Gemma 4, a text model), a 5-turn conversation reuses each answer (every warm turn's hit
reaches past the previous prompt's own blocks) and answers bit for bit as with no caches
(token ids and logprobs, tolerance zero); every answer-prefill forward is one whole block at
an aligned position; requests decoding together answer as alone with answer prefills
between them; an answer prefill never runs while a user request waits, encodes or prefills
(nor once one reached the inbox); while rows decode it runs only within the step's spare
budget, a block at most a quarter of a decode step, and never under the fixed rule or in a
wave; `--no-answer-prefill`, `use_caches`
false and a cache reset leave nothing queued; a tenant's answer blocks stay in its scope;
a conversation's template variables (`chat_template_kwargs`) render its answers too.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from support import (
    EngineHarness,
    _image_turn,
    block_shaped,
    chat_body,
    noise_image,
    record_prefill_forwards,
    wait_until,
)

from gateway.config import CacheConfig
from gateway.engine.scheduler.answer_job import AnswerJob
from gateway.engine.scheduler.answer_store import AnswerStore
from gateway.engine.scheduler.budget import CostModel, StepBudget

FAMILIES = ["qwen2_vl", "smolvlm", "gemma3", "mistral3", "gemma4", "llama", "qwen3_5", "lfm2_vl"]
TEXT_ONLY = {"llama"}
# Templates that open a thinking by default: a random model's answer is all thinking, which
# the next turn's template drops, so there is nothing of it to reuse (exactness still holds).
THINKING = {"qwen3_5"}


def answers_of(h: EngineHarness) -> dict:
    return h.engine.cache_stats()["answers"]


def settle(h: EngineHarness, offered: int) -> dict:
    """Wait until `offered` answers were queued and none is left pending."""
    return wait_until(
        lambda: (a := answers_of(h))["offered"] >= offered and a["pending"] == 0 and a,
        60,
        0.005,
    )


def talk(
    h: EngineHarness, image: object, turns: int = 5, wait: bool = True, **extra: object
) -> list:
    """A greedy conversation resending its history; `wait`: let each answer prefill end
    before the next turn (a user's think time), so the test does not race it; `extra`: more
    request fields."""
    first = "Tell me a long story about a cat, a dog and a bird."
    messages = [_image_turn(first) if image is not None else {"role": "user", "content": first}]
    runs = []
    for turn in range(turns):
        body = {"model": "t", "temperature": 0, "max_tokens": 40, "logprobs": True, **extra}
        run = h.run({**body, "messages": messages}, [image] if image is not None else [])
        runs.append(run)
        if wait:
            settle(h, turn + 1)
        messages = [
            *messages,
            {"role": "assistant", "content": run.text},
            {"role": "user", "content": f"Tell me more, part {turn + 2}."},
        ]
    return runs


@pytest.mark.parametrize("arch", FAMILIES)
def test_follow_ups_reuse_the_answer_and_answer_as_uncached(arch: str) -> None:
    cached = EngineHarness(arch)
    plain = EngineHarness(arch, cache=CacheConfig(vision_enabled=False, prefix_enabled=False))
    model = cached.engine.model
    block = cached.engine.config.cache.exact_block_tokens(on_gpu=False)
    block = -(-block // model.block_multiple) * model.block_multiple  # qwen3_5: 64
    forwards = record_prefill_forwards(model)
    try:
        image = None if arch in TEXT_ONLY else noise_image(11, 224, 224)
        with_cache, without = talk(cached, image), talk(plain, image, wait=False)
        stats = answers_of(cached)
    finally:
        cached.close()
        plain.close()
    for i, (a, b) in enumerate(zip(with_cache, without, strict=True)):
        assert a.token_ids == b.token_ids, f"turn {i + 1}"
        assert a.logprobs == b.logprobs, f"turn {i + 1}"  # tolerance exactly zero
    if arch in THINKING:
        assert stats["failed"] == 0
        return
    for before, after in zip(with_cache, with_cache[1:], strict=False):
        own_blocks = before.finish.usage.prompt_tokens // block * block
        assert after.finish.usage.cached_tokens > own_blocks  # the answer was reused
    assert stats["done"] >= 4 and stats["blocks"] > 0 and stats["failed"] == 0
    if not model.last_token_apart:  # (those feed a prompt's last token as a one-row step)
        # answer prefills are forwards of whole aligned blocks, as every prefill under the rule
        assert block_shaped(forwards, block)


def test_answers_rendered_with_the_requests_template_variables_are_reused() -> None:
    """A conversation sent with `chat_template_kwargs` (Qwen3's `enable_thinking` off, which
    changes the generation prompt) gets its answers prefilled with those variables: each
    follow-up hits past its previous prompt's own blocks and answers as uncached."""
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    cached = EngineHarness("qwen3")
    plain = EngineHarness("qwen3", cache=CacheConfig(vision_enabled=False, prefix_enabled=False))
    block = cached.engine.config.cache.exact_block_tokens(on_gpu=False)
    try:
        with_cache = talk(cached, None, turns=3, **kwargs)
        without = talk(plain, None, turns=3, wait=False, **kwargs)
        stats = answers_of(cached)
    finally:
        cached.close()
        plain.close()
    for a, b in zip(with_cache, without, strict=True):
        assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs)
    for before, after in zip(with_cache, with_cache[1:], strict=False):
        own_blocks = before.finish.usage.prompt_tokens // block * block
        assert after.finish.usage.cached_tokens > own_blocks
    assert stats["skipped"] == 0 and stats["done"] >= 2


def test_an_answer_prefill_never_runs_ahead_of_a_user_request() -> None:
    """Each answer-prefill block is checked at the moment it runs: no user request waits,
    encodes or prefills, and nothing is in the engine's inbox. Turns are sent back to back
    (racing the answer prefill) and beside a running stream, so both cases occur."""
    h = EngineHarness("qwen2_vl", max_batch=4)
    scheduler = h.engine._scheduler
    seen: list[tuple[bool, bool, bool]] = []
    feed = AnswerJob.feed_block

    def spy(head, model, block):  # noqa: ANN001, ANN202
        busy = bool(scheduler.waiting or scheduler.encoding or scheduler.prefilling)
        seen.append((busy, not h.engine._inbox.empty(), bool(scheduler.batch.rows)))
        return feed(head, model, block)

    AnswerJob.feed_block = spy  # type: ignore[method-assign]
    try:
        image = noise_image(12, 224, 224)
        stream = h.submit(chat_body("A long story, please.", max_tokens=200))
        runs = talk(h, image, turns=4, wait=False)
        stream.wait()
        runs += talk(h, None, turns=3, wait=False)
        settle(h, 8)
    finally:
        AnswerJob.feed_block = feed  # type: ignore[method-assign]
        h.close()
    assert seen, "no answer prefill ran"
    assert not any(busy or inbox for busy, inbox, _ in seen)
    assert all(r.finish.usage.prompt_tokens for r in runs)


def _store_with_job(budget_rows: int = 32) -> tuple[AnswerStore, list[int]]:
    """An AnswerStore over a stand-in model with one started job of 4 blocks; `ran` lists
    the rows of each block forward."""
    model = SimpleNamespace(cache_policy=SimpleNamespace(prefix_off=None))
    ops = SimpleNamespace(model=model)
    store = AnswerStore(ops, 32, pressure=lambda: False)  # type: ignore[arg-type]
    ran: list[int] = []
    head = AnswerJob(None, [], "an answer")  # type: ignore[arg-type]
    head.job, head.target = SimpleNamespace(fed=0), 128  # type: ignore[assignment]

    def block(model, size):  # noqa: ANN001, ANN202
        time.sleep(0.001)
        head.job.fed += size  # type: ignore[union-attr]
        ran.append(size)

    head.feed_block = block  # type: ignore[method-assign]
    store._queue.append(head)
    store._store = lambda h: True  # type: ignore[method-assign]
    return store, ran


def _budget(ratio: float, rows: int, admitting: int = 0, step: float = 0.05) -> StepBudget:
    costs = CostModel()
    costs.decode_step.add(step)
    costs.prefill_row.add(0.001 / 32)  # 1 ms a block
    return StepBudget(costs, ratio, rows, admitting)


def test_while_rows_decode_only_the_spare_budget_is_used() -> None:
    never = lambda: False  # noqa: E731
    store, ran = _store_with_job()
    spent = _budget(2.0, rows=4)
    spent.spend(0.1)  # the step's admission work used the whole budget
    assert store.step(spent, spent.costs, True, never) == 0 and not ran
    fixed = _budget(0.0, rows=4)
    assert store.step(fixed, fixed.costs, True, never) == 0 and not ran
    wave = _budget(2.0, rows=2, admitting=8)
    assert store.step(wave, wave.costs, True, never) == 0 and not ran
    spare = _budget(2.0, rows=4)  # 100 ms left, 1 ms a block: the whole job (started)
    assert store.step(spare, spare.costs, True, never) == 128
    assert spare.spent > 0 and spare.worked


def test_while_rows_decode_a_block_costing_over_a_quarter_step_waits_for_idle() -> None:
    """However much budget is left, a block estimated above DECODING_SHARE of a decode step
    never runs while rows decode (it would lengthen every running stream's step by more);
    idle, it runs."""
    never = lambda: False  # noqa: E731
    store, ran = _store_with_job()
    costly = _budget(8.0, rows=4, step=0.001)  # 8 ms left; a block (1 ms) > 0.25 x 1 ms
    assert store.step(costly, costly.costs, True, never) == 0 and not ran
    idle = _budget(2.0, rows=0)
    assert store.step(idle, idle.costs, False, never) == 128


def test_idle_it_yields_as_soon_as_a_message_arrives() -> None:
    store, ran = _store_with_job()
    idle = _budget(2.0, rows=0)
    calls = iter([False, True])
    assert store.step(idle, idle.costs, False, lambda: next(calls)) == 32
    assert ran == [32] and store.pending  # resumed later
    assert store.step(idle, idle.costs, False, lambda: False) == 96
    assert not store.pending and store.counts["done"] == 1


def test_memory_pressure_drops_the_queue() -> None:
    store, ran = _store_with_job()
    store._pressure = lambda: True
    idle = _budget(2.0, rows=0)
    assert store.step(idle, idle.costs, False, lambda: False) == 0
    assert not ran and not store.pending and store.counts["dropped"] == 1


def _submit(h: EngineHarness, body: dict, **changes: object):  # noqa: ANN202
    """Submit `body` with the built request's or chat's fields changed (e.g. `use_caches`)."""
    from dataclasses import replace

    from support import Run

    from gateway.api.openai.parse import parse_chat_request

    chat = parse_chat_request(body)
    if "cache_scope" in changes:
        chat = replace(chat, cache_scope=changes.pop("cache_scope"))
    request = h.prompts.build(chat, [], f"sub-{time.perf_counter_ns()}", time.perf_counter())
    run = Run()
    h.engine.submit(replace(request, **changes), run.sink)
    return run.wait()


def test_off_by_flag_for_requests_without_caches_and_after_a_reset() -> None:
    body = chat_body("Hello there, how are you today? Tell me everything.", max_tokens=40)
    off = EngineHarness("qwen2_vl", cache=CacheConfig(answer_prefill=False))
    on = EngineHarness("qwen2_vl")
    try:
        off.run(body)
        assert answers_of(off)["enabled"] is False and answers_of(off)["offered"] == 0
        _submit(on, body, use_caches=False)
        assert answers_of(on)["offered"] == 0
        on.run(body)
        stats = settle(on, 1)
        assert stats["done"] + stats["covered"] == 1
        on.engine.reset_caches()
        assert answers_of(on)["pending"] == 0
    finally:
        off.close()
        on.close()


def test_a_scoped_answer_is_stored_in_its_scope_only() -> None:
    h = EngineHarness("qwen2_vl")
    first = "Tell me a long story about a cat, a dog and a bird, please."
    try:
        one = _submit(h, chat_body(first, max_tokens=40), cache_scope="alice")
        settle(h, 1)
        follow = chat_body(first, max_tokens=4)
        follow["messages"] += [
            {"role": "assistant", "content": one.text},
            {"role": "user", "content": "More."},
        ]
        shared = _submit(h, follow)
        settle(h, 2)
        scoped = _submit(h, follow, cache_scope="alice")
    finally:
        h.close()
    assert shared.finish.usage.cached_tokens == 0  # another scope: nothing shared
    own = one.finish.usage.prompt_tokens // 32 * 32
    assert scoped.finish.usage.cached_tokens > own  # its own answer, in its scope


def test_a_job_never_started_waits_for_idle_time_while_rows_decode() -> None:
    """Starting a job copies its prompt's blocks: with no measured copy cost it is not
    started while rows decode, whatever the budget left."""
    from concurrent.futures import Future

    store, ran = _store_with_job()
    head = store._queue[0]
    head.job = None
    head.request = SimpleNamespace(prompt_ids=(1,) * 500, request_id="r")  # type: ignore[assignment]
    head.render = Future()
    head.render.set_result(None)
    spare = _budget(2.0, rows=4)
    assert store.step(spare, spare.costs, True, lambda: False) == 0
    assert store.pending and head.job is None and not ran


def test_answer_blocks_reach_the_disk_tier(tmp_path) -> None:  # noqa: ANN001
    """A restarted engine on the same folder serves the next turn's prompt + answer from
    disk, and answers as the engine that computed them."""
    cache = CacheConfig(cache_dir=tmp_path)
    first = "Tell me a long story about a cat, a dog and a bird, please."
    h = EngineHarness("qwen2_vl", cache=cache, warmup=False)
    try:
        one = h.run(chat_body(first, max_tokens=40))
        settle(h, 1)
        follow = chat_body(first, max_tokens=8)
        follow["messages"] += [
            {"role": "assistant", "content": one.text},
            {"role": "user", "content": "More."},
        ]
        h.engine.loaded.cache_ops.disk.writer.flush()
    finally:
        h.close()
    again = EngineHarness("qwen2_vl", cache=cache, warmup=False)
    try:
        two = again.run(follow)
    finally:
        again.close()
    own = one.finish.usage.prompt_tokens // 32 * 32
    assert two.finish.usage.cached_tokens > own  # the answer's blocks, read from disk


def test_a_cache_clear_drops_the_answer_jobs_in_flight() -> None:
    """`clear_caches` (`POST /v1/cache/clear`) while an answer job waits for its render: the
    job is dropped, nothing it computes lands in the cleared cache, the repeat is cold."""
    import threading

    h = EngineHarness("qwen2_vl")
    store = h.engine.loaded.answers
    release = threading.Event()
    render = store._next_tokens

    def slow(*args):  # noqa: ANN002, ANN202
        release.wait(30)
        return render(*args)

    store._next_tokens = slow
    body = chat_body("Tell me a long story about a cat, a dog and a bird, please.", max_tokens=40)
    try:
        one = h.run(body)
        wait_until(lambda: answers_of(h)["offered"] == 1, 30)
        h.engine.clear_caches()
        release.set()
        wait_until(lambda: answers_of(h)["pending"] == 0, 30)
        assert answers_of(h)["done"] == 0 and answers_of(h)["dropped"] == 1
        again = h.run(body)
    finally:
        release.set()
        h.close()
    assert again.finish.usage.cached_tokens == 0
    assert again.token_ids == one.token_ids and again.logprobs == one.logprobs
