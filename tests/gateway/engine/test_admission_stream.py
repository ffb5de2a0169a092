"""`--admission-stream` (gateway.engine.core `Engine._step_overlapped`): the decode first,
the image work on a stream of its own after it. Invariant: the answers are the serial
step's, bit for bit (token ids and logprobs), with caches cold and warm, for requests
arriving while rows decode and alone."""

from __future__ import annotations

from support import EngineHarness, assert_same_answers, chat_body, noise_image

from gateway.config import CacheConfig


def _session(h: EngineHarness) -> list:
    """A text row decoding; two image requests arriving while it does (one a repeat of the
    other's image: a cache hit); then the first image asked again alone."""
    image, other = noise_image(31, 224, 224), noise_image(32, 160, 224)
    runs = []
    with h.arriving_together():
        runs.append(h.submit(chat_body("Tell me a story.", max_tokens=24)))
    with h.arriving_together():
        runs.append(h.submit(chat_body("What is this?", images=1, max_tokens=8), [image]))
        runs.append(h.submit(chat_body("And this one?", images=1, max_tokens=8), [other]))
    done = [r.wait() for r in runs]
    done.append(h.run(chat_body("What is this, again?", images=1, max_tokens=8), [image]))
    return done


def test_the_admission_stream_changes_no_answer() -> None:
    overlapped = EngineHarness("qwen2_vl", max_batch=4, admission_stream=True)
    serial = EngineHarness(
        "qwen2_vl", max_batch=4, cache=CacheConfig(vision_enabled=False, prefix_enabled=False)
    )
    assert overlapped.engine._admission_stream is not None  # the overlapped step runs
    try:
        ours, reference = _session(overlapped), _session(serial)
    finally:
        overlapped.close()
        serial.close()
    assert_same_answers(ours, reference)  # token ids and logprobs, tolerance zero
    assert ours[-1].finish.usage.cached_tokens > 0  # the repeat was a hit
