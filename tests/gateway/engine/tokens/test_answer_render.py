"""What the next turn's prompt holds after a finished answer (tokens/answer_render.py).

Pinned, with each family's real template and the real prompt builder (an image turn where
the family takes images; a system prompt): the tokens `AnswerTemplate.tail` predicts
(this prompt less its dropped end, then the tail) are a prefix of the next turn's prompt
as the front end builds it, for answers whose re-tokenization differs from any generation
(leading newlines, spaces, unicode, a `<think>` part Qwen3's template strips), and reach
past the answer's text; a prompt that does not end with the generation prompt (an
Anthropic-style prefill) is not a chat turn.
"""

from __future__ import annotations

import pytest
from support import decoded, noise_image, tiny_model

from gateway.api.openai.parse import parse_chat_request
from gateway.engine.families import load_model
from gateway.engine.tokens.answer_render import AnswerTemplate
from gateway.frontend.prompt import PromptBuilder

FAMILIES = ["qwen2_vl", "qwen3_vl", "smolvlm", "gemma3", "mistral3", "gemma4", "llama", "qwen3"]
TEXT_ONLY = {"llama", "qwen3"}
ANSWERS = [
    "A red square on a blue field.",
    "\n\nTwo lines,\n  indented  and spaced. ",
    "Ünïcödé — ✓ 日本語 🙂",
    "<think>\nLet me look.\n</think>\n\nA cat.",
]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> tuple[str, PromptBuilder, AnswerTemplate]:
    model = load_model(str(tiny_model(request.param)), lazy=True)
    builder = PromptBuilder(model, 8192, 16)
    return request.param, builder, AnswerTemplate(model)


def _user(arch: str, text: str) -> dict:
    if arch in TEXT_ONLY:
        return {"role": "user", "content": text}
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}, text]}


def _build(builder: PromptBuilder, arch: str, messages: list[dict]):  # noqa: ANN202
    for m in messages:  # the image part's text as a part
        if isinstance(m["content"], list):
            m["content"] = [
                p if isinstance(p, dict) else {"type": "text", "text": p} for p in m["content"]
            ]
    chat = parse_chat_request({"model": "t", "messages": messages})
    images = [] if arch in TEXT_ONLY else [decoded(noise_image(5, 112, 112))]
    return builder.build(chat, images, "r", 0.0)


@pytest.mark.parametrize("answer", ANSWERS, ids=range(len(ANSWERS)))
def test_the_predicted_tokens_begin_the_next_prompt(family, answer: str) -> None:  # noqa: ANN001
    arch, builder, template = family
    first = [{"role": "system", "content": "Be brief."}, _user(arch, "What is this?")]
    turn1 = _build(builder, arch, [dict(m) for m in first])
    assert template.ends_turn(turn1.prompt_ids)
    rendered = template.tail(answer)
    assert rendered is not None
    drop, tail = rendered
    predicted = [*turn1.prompt_ids[: len(turn1.prompt_ids) - drop], *tail]
    follow = [
        *[dict(m) for m in first],
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And then?"},
    ]
    turn2 = _build(builder, arch, follow)
    assert list(turn2.prompt_ids[: len(predicted)]) == predicted
    assert len(predicted) > len(turn1.prompt_ids) - drop  # the answer (and its turn end)


def test_a_prompt_that_does_not_end_with_the_generation_prompt_is_no_chat_turn() -> None:
    model = load_model(str(tiny_model("qwen2_vl")), lazy=True)
    template = AnswerTemplate(model)
    builder = PromptBuilder(model, 8192, 16)
    turn = _build(builder, "llama", [{"role": "user", "content": "Hi"}])
    assert template.ends_turn(turn.prompt_ids)
    prefilled = [*turn.prompt_ids, *model.tokenize("Sure, the answer is")]
    assert not template.ends_turn(prefilled)
