"""The prompt builder: image placeholders stay exactly where the user put them (so an image's
KV never depends on the question after it), one image span per image in order, never pixel
values (the engine prepares them); a prompt over the context refused with the field to fix,
and max_tokens over the room it leaves capped to that room."""

from __future__ import annotations

import pytest
from support import decoded, noise_image, tiny_model

from gateway.engine.families.qwen_vl import QwenVL
from gateway.errors import APIError
from gateway.frontend.chat import ChatMessage, ChatRequest, ImagePart, TextPart
from gateway.frontend.prompt import PromptBuilder, UnsupportedImage, template_messages


def _chat(*messages: ChatMessage, max_tokens: int | None = None) -> ChatRequest:
    return ChatRequest.greedy("m", messages, max_tokens)


IMAGE = ImagePart("x", "messages[0].content[1]")


def test_template_messages_keep_part_order_and_join_plain_text() -> None:
    """Invariant: text-only messages become one string; mixed ones keep the parts' order."""
    chat = _chat(
        ChatMessage("system", (TextPart("be "), TextPart("brief"))),
        ChatMessage("user", (TextPart("a"), IMAGE, TextPart("b"))),
    )
    assert template_messages(chat) == [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "a"},
                {"type": "image"},
                {"type": "text", "text": "b"},
            ],
        },
    ]


@pytest.fixture(scope="module")
def model() -> QwenVL:
    return QwenVL(str(tiny_model("qwen2_vl")))


def test_an_images_tokens_do_not_depend_on_the_question_after_it(
    model: QwenVL,
) -> None:
    """Invariant: two questions about one image share every prompt token up to the image's
    end, and the span covers exactly the image tokens."""
    builder = PromptBuilder(model, 4096, 16)
    image = decoded(noise_image(1))
    built = [
        builder.build(_chat(ChatMessage("user", (IMAGE, TextPart(q)))), [image], f"r{i}", 0.0)
        for i, q in enumerate(["what is this?", "describe the colours in detail"])
    ]
    first, second = (b.images[0].layout for b in built)
    assert (first.start, first.end) == (second.start, second.end)
    assert built[0].prompt_ids[: first.end] == built[1].prompt_ids[: first.end]
    span = built[0].prompt_ids[first.start : first.end]
    assert set(span) == {model.image_token_id} and len(span) == first.num_tokens


def test_the_prompt_side_does_no_pixel_work(model: QwenVL) -> None:
    """Invariant: the builder sends each image decoded with its grid and never pixel values
    (the engine is the one owner of preprocessing: `gateway.engine.pixels`)."""
    builder = PromptBuilder(model, 4096, 16)
    images = [decoded(noise_image(1)), decoded(noise_image(2))]
    message = ChatMessage("user", (IMAGE, IMAGE, TextPart("compare")))
    built = builder.build(_chat(message), images, "r", 0.0)
    assert all(i.pixel_values is None and i.image is not None for i in built.images)
    assert [i.grid_thw for i in built.images] == [model.image_grid(56, 56)] * 2
    assert [i.content_hash for i in built.images] == [i.content_hash for i in images]


def test_a_prompt_over_the_context_is_a_400_on_messages_counting_what_usage_counts(
    model: QwenVL,
) -> None:
    """Invariant: a prompt that leaves no room (context <= its tokens) is a 400
    `context_length_exceeded` on `messages` whose count is the prompt's length as built (what
    usage reports); one token more of context fits, with an answer of one token."""
    message = ChatMessage("user", (TextPart("hello " * 40),))
    fits = PromptBuilder(model, 10_000, 16).build(_chat(message), [], "r", 0.0)
    n = len(fits.prompt_ids)
    with pytest.raises(APIError) as info:
        PromptBuilder(model, n, 16).build(_chat(message), [], "r", 0.0)
    assert (info.value.status, info.value.param) == (400, "messages")
    assert info.value.code == "context_length_exceeded"
    assert f"the prompt is {n} tokens" in info.value.message
    edge = PromptBuilder(model, n + 1, 16).build(_chat(message), [], "r", 0.0)
    assert edge.sampling.max_tokens == 1


def test_max_tokens_over_the_room_left_is_capped_to_it(model: QwenVL) -> None:
    """Invariant: max_tokens (or the default) above the room the prompt leaves in the context
    is capped to that room, never refused; within it, it is kept."""
    message = ChatMessage("user", (TextPart("hello " * 40),))
    builder = PromptBuilder(model, 200, 500)
    built = builder.build(_chat(message), [], "r", 0.0)
    room = 200 - len(built.prompt_ids)
    assert built.sampling.max_tokens == room  # the default, capped
    for asked, granted in ((32_000, room), (room + 1, room), (room, room), (3, 3)):
        built = builder.build(_chat(message, max_tokens=asked), [], "r", 0.0)
        assert built.sampling.max_tokens == granted, asked


def test_min_tokens_over_the_capped_max_tokens_is_a_400_saying_why(model: QwenVL) -> None:
    """Invariant: min_tokens above what the answer may have is a 400 on `min_tokens`; when
    the context is the limit, the message says so (the room, the prompt, the context)."""
    message = ChatMessage("user", (TextPart("hello " * 40),))
    builder = PromptBuilder(model, 200, 500)
    room = 200 - builder.count(_chat(message), [])
    chat = ChatRequest.greedy("m", (message,), 32_000, min_tokens=room + 1)
    with pytest.raises(APIError) as info:
        builder.build(chat, [], "r", 0.0)
    assert info.value.param == "min_tokens"
    assert f"the {room} tokens the prompt" in info.value.message
    assert "context of 200" in info.value.message
    chat = ChatRequest.greedy("m", (message,), 4, min_tokens=5)
    with pytest.raises(APIError, match=r"exceeds max_tokens \(4\)"):
        builder.build(chat, [], "r", 0.0)
    built = builder.build(ChatRequest.greedy("m", (message,), 32_000, min_tokens=room), [], "r", 0)
    assert built.sampling.max_tokens == built.sampling.min_tokens == room


def test_an_image_the_processor_refuses_is_named_by_its_index(
    model: QwenVL,
) -> None:
    """Invariant: a 1x3000 image is refused in our words with its index (the pipeline turns
    the index into the image's field path), not as the processor's ValueError."""
    builder = PromptBuilder(model, 4096, 16)
    images = [decoded(noise_image(1)), decoded(noise_image(2, 1, 3000))]
    message = ChatMessage("user", (IMAGE, IMAGE, TextPart("compare")))
    with pytest.raises(UnsupportedImage) as info:
        builder.build(_chat(message), images, "r", 0.0)
    assert info.value.index == 1
    assert "1x3000" in str(info.value) and "200:1" in str(info.value)


def test_an_over_long_prompt_logs_no_tokenizer_warning(
    model: QwenVL, caplog: pytest.LogCaptureFixture
) -> None:
    """Invariant: tokenizing past the tokenizer's nominal maximum logs nothing (our own 400
    is the only word on it)."""
    with caplog.at_level("WARNING"):
        ids = model.tokenize("word " * 40_000)
    assert len(ids) > 32_768
    assert not [r for r in caplog.records if "sequence length" in r.getMessage()]
