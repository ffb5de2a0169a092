"""The start-up warm-up (gateway.warmup) on the tiny model.

Pinned here: the warm-up drives every decode path that builds kernels of its own on first
use (greedy, log-probabilities with alternatives, seeded sampling, a grammar) and prompts of
every padded final-block size, without a failure; and afterwards the caches are empty with zeroed
counters, so nothing synthetic is served or counted. Its requests are built without the HTTP
edge, yet are the chat completions the OpenAI parser makes of the same messages and options.
"""

from __future__ import annotations

import dataclasses

import pytest
from support import EngineHarness, wait_until

from gateway.api.openai.parse import parse_chat_request
from gateway.frontend.chat import ChatRequest, ImagePart
from gateway.structured.response_format import response_format_grammar
from gateway.warmup import Warmup, warmup_request


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
        # The reset is applied in the engine's inbox order: wait until it has been.
        stats = wait_until(
            lambda: (s := h.engine.cache_stats())["prefix"]["entries"] == 0 and s,
            30,
            message=lambda: f"entries left after the warm-up: {h.engine.cache_stats()}",
        )
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


def _body(turns: list[str], max_tokens: int, image_at: int | None, options: dict) -> dict:
    """The chat-completions body the warm-up's requests stand for."""
    messages: list[dict] = []
    for k, text in enumerate(turns):
        content: object = text
        if k == image_at:
            image = {"type": "image_url", "image_url": {"url": "warm-up"}}
            content = [image, {"type": "text", "text": text}]
        if k:
            messages.append({"role": "assistant", "content": "ok"})
        messages.append({"role": "user", "content": content})
    base = {"model": "warm-up", "temperature": 0, "max_tokens": max_tokens, "ignore_eos": True}
    return {**base, "messages": messages, **options}


def _unplaced(chat: ChatRequest) -> ChatRequest:
    """`chat` with image parts' `param` (the field an error would name) blanked."""
    messages = tuple(
        dataclasses.replace(
            m,
            parts=tuple(
                dataclasses.replace(p, param="") if isinstance(p, ImagePart) else p for p in m.parts
            ),
        )
        for m in chat.messages
    )
    return dataclasses.replace(chat, messages=messages)


@pytest.mark.parametrize(
    ("turns", "max_tokens", "image_at", "options", "wire"),
    [
        (["warm-up 0 "], 2, None, {}, {}),
        (
            ["warm-up 1 word "],
            3,
            None,
            {"logprobs": True, "top_logprobs": 5},
            {"logprobs": True, "top_logprobs": 5},
        ),
        (
            ["warm-up 2 word word "],
            4,
            None,
            {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 1},
            {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 1},
        ),
        (
            ["warm-up json"],
            4,
            None,
            {"grammar": response_format_grammar({"type": "json_object"}), "ignore_eos": False},
            {"response_format": {"type": "json_object"}, "ignore_eos": False},
        ),
        (["warm-up 0 ", "and a follow-up"], 2, None, {}, {}),
        (["Describe the picture."], 2, 0, {}, {}),
        (["Look:", "Describe the picture."], 2, 1, {}, {}),
    ],
)
def test_warmup_requests_are_the_chat_completions_they_stand_for(
    turns: list[str], max_tokens: int, image_at: int | None, options: dict, wire: dict
) -> None:
    """Invariant: a warm-up request equals what the OpenAI parser makes of the same messages
    and options (so the warm-up builds the prompts and sampling paths users will send), up to
    the field name an image error would quote."""
    built = warmup_request(turns, max_tokens, image_at, options)
    parsed = parse_chat_request(_body(turns, max_tokens, image_at, wire))
    assert _unplaced(built) == _unplaced(parsed)
    assert len(built.images) == (image_at is not None)
