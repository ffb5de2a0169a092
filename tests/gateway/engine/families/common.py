"""Engine-level checks that every family's tests make in the same shape (importable as
`tests.gateway.engine.families.common`; the per-family modules import it).

Each helper runs one invariant and fails with an AssertionError; what differs per family
(questions, images, block sizes, where a hit may end) stays in the family's own module,
which passes it in and asserts its family-specific facts on what the helper returns.
Everything here drives `support.EngineHarness` (the engine thread, no HTTP); a helper that
opens harnesses closes them before it returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from PIL import Image
from reference import reference_generate
from support import EngineHarness, Run, assert_same_answers, decoded

from gateway.api.openai.parse import parse_chat_request
from gateway.config import CacheConfig

# A request as the engine-level tests send it: an OpenAI chat body and its images in order.
Request = tuple[dict, Sequence[Image.Image]]
NO_CACHES = CacheConfig(prefix_enabled=False, vision_enabled=False)


def reference_messages(question: str, images: int, head: Sequence[dict] = ()) -> list[dict]:
    """The reference's messages for a chat body of `images` image parts then `question`
    (`{"type": "image"}` parts, as mlx-vlm's `apply_chat_template` takes them), after
    `head` (e.g. a system message)."""
    parts = [{"type": "image"}] * images + [{"type": "text", "text": question}]
    return [*head, {"role": "user", "content": parts if images else question}]


def engine_request(h: EngineHarness, body: dict, images: Sequence[Image.Image]) -> Any:
    """The EngineRequest the prompt builder makes for `body` (prompt ids, image spans),
    without submitting it."""
    chat = parse_chat_request(body)
    media = [decoded(i) if isinstance(i, Image.Image) else i for i in images]
    return h.prompts.build(chat, media, "probe", 0.0)


def assert_reference_answer(
    h: EngineHarness,
    model_dir: Path,
    body: dict,
    images: Sequence[Image.Image],
    messages: list[dict],
    template_kwargs: dict | None = None,
) -> Run:
    """Invariant: the engine's greedy answer to `body` equals the reference library's own
    generate on `messages` (tests/reference.py; `template_kwargs` to its chat template):
    prompt ids, token ids, logprobs. Returns the engine's run."""
    ref = reference_generate(
        model_dir, messages, images, max_tokens=body["max_tokens"], template_kwargs=template_kwargs
    )
    assert list(engine_request(h, body, images).prompt_ids) == list(ref.prompt_ids)
    run = h.run(body, images)
    assert run.token_ids == list(ref.token_ids)
    assert run.logprobs == list(ref.logprobs)  # tolerance zero
    return run


def conversation(
    h: EngineHarness,
    first: Request,
    turns: int,
    follow_up: Callable[[int], str],
    then: Sequence[Request] = (),
) -> list[Run]:
    """`turns` greedy turns starting from `first`, each resending the history (the answer,
    then `follow_up(turn)` as the next user message, turn counted from 2), then each request
    of `then` on its own (new questions about the same image hit inside it)."""
    body, images = first
    runs = []
    for turn in range(turns):
        run = h.run(body, images)
        runs.append(run)
        reply = {"role": "assistant", "content": run.text}
        follow = {"role": "user", "content": follow_up(turn + 2)}
        body = {**body, "messages": [*body["messages"], reply, follow]}
    runs.extend(h.run(b, i) for b, i in then)
    return runs


@contextlib.contextmanager
def cached_and_plain(model_dir: Path, **engine: Any) -> Iterator[tuple[EngineHarness, ...]]:
    """Two engines on one checkpoint: every cache on, and both memory caches off."""
    cached = EngineHarness(path=model_dir, **engine)
    plain = EngineHarness(path=model_dir, cache=NO_CACHES, **engine)
    try:
        yield cached, plain
    finally:
        cached.close()
        plain.close()


def assert_cached_equals_uncached(
    model_dir: Path,
    talk: Callable[[EngineHarness], list[Run]],
    check: Callable[[EngineHarness, list[Run]], None] = lambda h, runs: None,
    **engine: Any,
) -> None:
    """Invariant: `talk` answers the same (ids and logprobs) with the caches as without, and
    the engine without caches read nothing from them. `check(cached engine, cached runs)`
    then asserts the family's own facts of where the hits fell (the engine still open)."""
    with cached_and_plain(model_dir, **engine) as (cached, plain):
        with_cache, without = talk(cached), talk(plain)
        assert_same_answers(with_cache, without)
        assert all(r.finish.usage.cached_tokens == 0 for r in without)
        assert all(r.finish.usage.vision_hits == 0 for r in without)
        check(cached, with_cache)


def assert_batched_equals_alone(
    h: EngineHarness, requests: Sequence[Request], clear_caches: bool = False
) -> None:
    """Invariant: `requests` admitted in one engine step (prefilled and decoded together:
    other prompt lengths, left padding, image and text rows) answer as each does alone.
    `clear_caches`: empty the caches before each pass, so neither reads the other's KV."""
    if clear_caches:
        h.engine.clear_caches()
    alone = [h.run(b, i) for b, i in requests]
    if clear_caches:
        h.engine.clear_caches()
    with h.arriving_together():
        runs = [h.submit(b, i) for b, i in requests]
    assert_same_answers(alone, [r.wait() for r in runs])


def one_pixel_changed(image: Image.Image, xy: tuple[int, int]) -> Image.Image:
    """A copy of `image` with the red channel of the pixel at `xy` moved by one."""
    changed = image.convert("RGB").copy()
    r, g, b = changed.getpixel(xy)  # type: ignore[misc]
    changed.putpixel(xy, ((r + 1) % 256, g, b))
    return changed


def assert_one_pixel_misses(
    h: EngineHarness, body: dict, image: Image.Image, xy: tuple[int, int]
) -> tuple[Run, Run]:
    """Invariant: after `body` about `image` ran (so the image is cached), the same body
    about `image` one pixel away gets no vision hit and no prefix block from its image
    span's start on. Returns both runs (for the family's own checks of the answers)."""
    first = h.run(body, [image])
    changed = one_pixel_changed(image, xy)
    second = h.run(body, [changed])
    assert second.finish.usage.vision_hits == 0 and second.finish.usage.vision_misses == 1
    image_start = engine_request(h, body, [changed]).images[0].layout.start
    assert second.finish.usage.cached_tokens <= image_start  # nothing from the image on
    return first, second
