"""Several requests' images through the vision tower together (tiny models, CPU).

Pinned: image requests arriving together at an idle engine are encoded as one group, and each
gets the tokens and logprobs it gets alone, bit for bit; while rows decode, each request's
images are a group of their own (no head-of-line blocking, issue 30), with the same answers,
unless the arrivals outnumber the decoding rows (a wave: one group, as when idle);
the same pixels in two requests waiting together are encoded once; a group's patch budget
splits a burst into several groups.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest
from support import EngineHarness, Run, chat_body, noise_image

from gateway.config import CacheConfig
from gateway.engine.request import FinishEvent, TokenEvent
from gateway.engine.scheduler import encode_group

ARCHS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


@pytest.fixture(scope="module", params=ARCHS)
def harness(request: pytest.FixtureRequest):
    h = EngineHarness(request.param, max_batch=8, cache=CacheConfig(prefix_enabled=False))
    yield h
    h.close()


def _watch_groups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    start = encode_group.start_group

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        group, failed = start(*args, **kwargs)
        if group is not None:
            sizes.append(len(group.images))
        return group, failed

    monkeypatch.setattr("gateway.engine.scheduler.scheduler.start_group", spy)
    return sizes


@contextmanager
def arriving_idle(harness: EngineHarness) -> Iterator[None]:
    """Requests submitted inside the block reach an idle engine (no row decoding) in one
    inbox drain, so one step admits them all: the inbox's puts are held (until the pixel
    preparer has forwarded every one) and land together."""
    deadline = time.monotonic() + 60
    while not harness.engine.idle:  # e.g. an earlier test's holder still decoding
        assert time.monotonic() < deadline, "the engine never went idle"
        time.sleep(0.01)
    inbox = harness.engine._inbox
    held: list[object] = []
    inbox.put = held.append  # type: ignore[method-assign]  # an instance attribute, undone below
    try:
        yield
        harness.engine._pixels.drain(60)
    finally:
        del inbox.put
        with inbox.mutex:
            inbox.queue.extend(held)
            inbox.unfinished_tasks += len(held)
            inbox.not_empty.notify()


REQUESTS = [(56, 56), (84, 56), (112, 112), (56, 140)]


def _requests() -> list[tuple[dict, list]]:
    return [
        (chat_body("what is this?", images=1, max_tokens=6), [noise_image(40 + i, w, h)])
        for i, (w, h) in enumerate(REQUESTS)
    ]


def test_images_arriving_together_encode_as_one_group_with_equal_output(
    harness: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: at an idle engine, images arriving together are one tower group, and
    grouped encoding gives each request the tokens and logprobs it gets when its image is
    encoded alone, bit for bit (an image's features do not depend on its group)."""
    harness.engine.clear_caches()
    requests = _requests()
    alone = [harness.run(body, images) for body, images in requests]
    harness.engine.clear_caches()
    sizes = _watch_groups(monkeypatch)
    with arriving_idle(harness):
        runs = [harness.submit(body, images) for body, images in requests]
    together = [run.wait() for run in runs]
    assert sizes == [4]
    for single, grouped in zip(alone, together, strict=True):
        assert grouped.token_ids == single.token_ids
        assert grouped.logprobs == single.logprobs


def test_while_rows_decode_each_request_is_its_own_group(
    harness: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant (issue 30): while rows decode, a group holds the oldest request's images
    only, so the first request's first token never waits for a later request's encode; the
    answers are those of each request alone, bit for bit."""
    harness.engine.clear_caches()
    requests = _requests()[:3]
    alone = [harness.run(body, images) for body, images in requests]
    harness.engine.clear_caches()
    # Four rows decode (three here, the holder below): three images are no wave.
    first_id = harness._ids + 1
    streams = [harness.submit(chat_body(f"story {i}", max_tokens=400)) for i in range(3)]
    for stream in streams:
        stream.wait_tokens(1)
    sizes = _watch_groups(monkeypatch)
    firsts: list[int] = []  # ids of runs, in the order their first token arrived
    sink = Run.sink

    def watch(run: Run, event: object) -> None:
        if isinstance(event, TokenEvent) and not run.token_ids:
            firsts.append(id(run))
        sink(run, event)

    monkeypatch.setattr(Run, "sink", watch)
    with harness.arriving_together():  # a running request holds a decoding row
        runs = [harness.submit(body, images) for body, images in requests]
    together = [run.wait() for run in runs]
    for k, stream in enumerate(streams):
        harness.engine.cancel(f"req-{first_id + k}")
        stream.wait()
    assert sizes == [1, 1, 1]
    assert firsts[-3:] == [id(run) for run in runs]  # oldest first (the streams came before)
    for single, grouped in zip(alone, together, strict=True):
        assert grouped.token_ids == single.token_ids
        assert grouped.logprobs == single.logprobs


def test_a_wave_while_a_row_decodes_is_one_group(
    harness: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: more requests arriving than rows decoding (a wave: 16 images at once whose
    first ones already decode) are encoded as one group, as at an idle engine, with the
    answers of each alone."""
    harness.engine.clear_caches()
    requests = _requests()
    alone = [harness.run(body, images) for body, images in requests]
    harness.engine.clear_caches()
    sizes = _watch_groups(monkeypatch)
    with harness.arriving_together():  # one row (the holder) decodes; four arrive
        runs = [harness.submit(body, images) for body, images in requests]
    together = [run.wait() for run in runs]
    assert sizes == [4]
    for single, grouped in zip(alone, together, strict=True):
        assert grouped.token_ids == single.token_ids
        assert grouped.logprobs == single.logprobs


def test_the_same_pixels_waiting_twice_are_encoded_once(
    harness: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: two requests with the same new image in one group share one tower pass."""
    harness.engine.clear_caches()
    image = noise_image(77, 84, 84)
    sizes = _watch_groups(monkeypatch)
    with arriving_idle(harness):
        runs = [harness.submit(chat_body(q, images=1, max_tokens=4), [image]) for q in "ab"]
    for run in runs:
        assert isinstance(run.wait().finish, FinishEvent)
    assert sizes == [1]


def test_the_patch_budget_splits_a_burst(
    harness: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: a group never exceeds its patch budget (but always takes one image)."""
    harness.engine.clear_caches()
    monkeypatch.setattr(encode_group, "MAX_GROUP_PATCHES", 40)
    sizes = _watch_groups(monkeypatch)
    with arriving_idle(harness):
        runs = [
            harness.submit(chat_body("x", images=1, max_tokens=3), [noise_image(90 + i, 112, 112)])
            for i in range(3)
        ]
    for run in runs:
        assert isinstance(run.wait().finish, FinishEvent)
    assert sizes == [1, 1, 1]  # 112 px = 64 patches each, over a 40-patch budget


def test_a_device_whose_groups_change_the_bits_encodes_one_image_per_call(
    harness: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: where the load-time check found grouped features differ from alone
    (gateway.engine.scheduler.group_check; an H200 in bf16), images arriving together at an
    idle engine are still encoded one per tower call, so a cached turn's features are the
    uncached turn's."""
    harness.engine.clear_caches()
    scheduler = harness.engine.scheduler
    monkeypatch.setattr(scheduler, "loaded", replace(scheduler.loaded, group_images=False))
    sizes = _watch_groups(monkeypatch)
    with arriving_idle(harness):
        runs = [harness.submit(body, images) for body, images in _requests()]
    for run in runs:
        assert isinstance(run.wait().finish, FinishEvent)
    assert sizes == [1, 1, 1, 1]


def test_a_failing_image_fails_only_its_own_request(harness: EngineHarness) -> None:
    """Invariant: if one request's image cannot be prepared for the tower, that request fails
    and the others in the same group are encoded and answered."""
    import dataclasses

    harness.engine.clear_caches()
    with harness.arriving_together():
        good = harness.submit(chat_body("fine", images=1, max_tokens=3), [noise_image(61, 56, 56)])
        bad_body = chat_body("broken", images=1, max_tokens=3)
        bad = harness.submit(bad_body, [noise_image(62, 56, 56)])
        harness.engine._pixels.drain(30)  # in the inbox now
        job = harness.engine.scheduler.jobs.get(f"req-{harness._ids}")
        if job is None:  # not yet drained into the engine: patch the queued message instead
            message = harness.engine._inbox.queue[-1]
            images = tuple(
                dataclasses.replace(i, pixel_values=None, image=None)
                for i in message.request.images
            )
            harness.engine._inbox.queue[-1] = dataclasses.replace(
                message, request=dataclasses.replace(message.request, images=images)
            )
    assert isinstance(good.wait().finish, FinishEvent)
    from gateway.engine.request import ErrorEvent

    assert isinstance(bad.wait().finish, ErrorEvent)
