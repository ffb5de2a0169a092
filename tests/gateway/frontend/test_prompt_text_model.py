"""The prompt builder over a text model (families/text.py).

Pinned: a text-only chat renders with the checkpoint's own template into the ids mlx-lm's
tokenizer gives; an image or a video part is refused as `UnsupportedImage` naming its place
among the request's media, before any pixel work.
"""

from __future__ import annotations

import pytest
from support import decoded, noise_image, tiny_model

from gateway.api.openai.parse import parse_chat_request
from gateway.engine.families import load_model
from gateway.frontend.prompt import PromptBuilder, UnsupportedImage


@pytest.fixture(scope="module")
def builder() -> PromptBuilder:
    model = load_model(str(tiny_model("qwen3")), lazy=True)
    return PromptBuilder(model, 4096, 16)


def test_text_prompt_is_the_templates_ids(builder: PromptBuilder) -> None:
    from mlx_lm.tokenizer_utils import load as load_tokenizer  # mlx-lm's own tokenizer

    chat = parse_chat_request(
        {"model": "t", "messages": [{"role": "user", "content": "Hello there"}]}
    )
    request = builder.build(chat, [], "r1", 0.0)
    tokenizer = load_tokenizer(tiny_model("qwen3"))
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello there"}], add_generation_prompt=True
    )
    assert list(request.prompt_ids) == list(expected)
    assert request.images == ()


def test_an_image_part_is_refused_by_its_index(builder: PromptBuilder) -> None:
    chat = parse_chat_request(
        {
            "model": "t",
            "messages": [
                {"role": "user", "content": "first"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": "x"}},
                    ],
                },
            ],
        }
    )
    with pytest.raises(UnsupportedImage) as err:
        builder.build(chat, [decoded(noise_image(1))], "r2", 0.0)
    assert err.value.index == 0
    assert chat.media[0].param == "messages[1].content[1].image_url.url"
    assert "qwen3" in str(err.value) and "does not take image input" in str(err.value)
