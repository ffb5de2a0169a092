"""The prompt builder: image placeholders stay exactly where the user put them (so an image's
KV never depends on the question after it), one image span per image in order, pixels only
for images the engine will encode, and context limits refused with the field to fix."""

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
    builder = PromptBuilder(model, lambda ids, spans: [True] * len(spans), 4096, 16)
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
    assert built[0].images[0].pixel_values is not None


def test_pixels_are_prepared_only_for_images_the_engine_will_encode(
    model: QwenVL,
) -> None:
    """Invariant: `needs_pixels` False -> no pixel preprocessing for that image."""
    builder = PromptBuilder(model, lambda ids, spans: [False, True], 4096, 16)
    images = [decoded(noise_image(1)), decoded(noise_image(2))]
    message = ChatMessage("user", (IMAGE, IMAGE, TextPart("compare")))
    built = builder.build(_chat(message), images, "r", 0.0)
    assert [i.pixel_values is None for i in built.images] == [True, False]
    assert [i.content_hash for i in built.images] == [i.content_hash for i in images]


def test_context_limits_name_the_field_to_fix(model: QwenVL) -> None:
    """Invariant: a prompt over the context is a 400 on `messages`; max_tokens over the room
    left is a 400 on `max_tokens` that says how many fit; the default fits the room."""
    message = ChatMessage("user", (TextPart("hello " * 40),))
    with pytest.raises(APIError) as info:
        PromptBuilder(model, lambda i, s: [], 20, 16).build(_chat(message), [], "r", 0.0)
    assert (info.value.status, info.value.param) == (400, "messages")
    assert info.value.code == "context_length_exceeded"
    builder = PromptBuilder(model, lambda i, s: [], 200, 500)
    built = builder.build(_chat(message), [], "r", 0.0)
    room = 200 - len(built.prompt_ids)
    assert built.sampling.max_tokens == room
    with pytest.raises(APIError) as info:
        builder.build(_chat(message, max_tokens=room + 1), [], "r", 0.0)
    assert info.value.param == "max_tokens" and f"at most {room}" in info.value.message


def test_an_image_the_processor_refuses_is_named_by_its_index(
    model: QwenVL,
) -> None:
    """Invariant: a 1x3000 image is refused in our words with its index (the pipeline turns
    the index into the image's field path), not as the processor's ValueError."""
    builder = PromptBuilder(model, lambda ids, spans: [True] * len(spans), 4096, 16)
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
