"""Thinking markers, the template's thinking switch and how a prompt leaves the answer (pure).

Pinned: Qwen3's and Gemma 4's templates are detected by their markers and a template without
any is not; a prompt that closed the thinking (the switch off) needs no split, one that
opened it starts inside, one that left it to the model lets a first `<think>` open it; a
grammar waits for the thinking only when the thinking was asked for or the prompt opened it;
asking a model that does not think to think, and setting the server's own template
arguments, are 400s naming the field; switching thinking off is honoured by any model.
"""

from __future__ import annotations

import jinja2
import pytest

from gateway.errors import APIError
from gateway.frontend.chat import ChatMessage, ChatRequest, TextPart
from gateway.frontend.reasoning import CHANNEL, THINK, Reasoning, detect, template_kwargs
from gateway.offline_model.chat_templates import gemma4, qwen3

QWEN = Reasoning(THINK, 1, 2)


def _chat(**fields: object) -> ChatRequest:
    user = ChatMessage("user", (TextPart("hi"),))
    return ChatRequest.greedy("m", (user,), 8, **fields)


def _render(template: str, **kwargs: object) -> str:
    env = jinja2.Environment()
    return env.from_string(template).render(
        messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True, **kwargs
    )


def test_templates_are_detected_by_their_markers() -> None:
    assert detect(qwen3.TEMPLATE) is THINK
    assert detect(qwen3.THINKING_TEMPLATE) is THINK
    assert detect(gemma4.TEMPLATE) is CHANNEL
    assert detect("{{ messages }}") is None and detect(None) is None


def test_the_prompt_decides_where_the_answer_starts() -> None:
    chat = _chat()
    assert QWEN.params(_render(qwen3.TEMPLATE, enable_thinking=False), chat) is None
    hybrid = QWEN.params(_render(qwen3.TEMPLATE), chat)
    assert hybrid is not None and not hybrid.inside and not hybrid.grammar_waits
    opened = QWEN.params(_render(qwen3.THINKING_TEMPLATE), chat)
    assert opened is not None and opened.inside and opened.grammar_waits
    asked = QWEN.params(_render(qwen3.TEMPLATE, enable_thinking=True), _chat(thinking=True))
    assert asked is not None and asked.grammar_waits and asked.budget is None
    budget = QWEN.params(_render(qwen3.TEMPLATE), _chat(thinking=True, thinking_budget=7))
    assert budget is not None and budget.budget == 7


def test_gemma4_thinks_in_a_channel_with_a_header() -> None:
    gemma = Reasoning(CHANNEL, 5, 6)
    off = _render(gemma4.TEMPLATE, bos_token="<bos>")
    assert gemma.params(off, _chat()) is None  # the empty channel closes it
    on = gemma.params(_render(gemma4.TEMPLATE, bos_token="<bos>", enable_thinking=True), _chat())
    assert on is not None and not on.inside and on.header == "thought\n"


def test_the_switch_and_its_errors() -> None:
    assert template_kwargs(_chat(), QWEN) == {}
    assert template_kwargs(_chat(thinking=False), None) == {"enable_thinking": False}
    kwargs = (("enable_thinking", True), ("x", 1))
    assert template_kwargs(_chat(template_kwargs=kwargs, thinking=False), QWEN) == {
        "enable_thinking": False,
        "x": 1,
    }
    with pytest.raises(APIError) as asked:
        template_kwargs(_chat(thinking=True, thinking_field="reasoning_effort"), None)
    assert asked.value.status == 400 and asked.value.param == "reasoning_effort"
    with pytest.raises(APIError) as kw:
        template_kwargs(_chat(template_kwargs=(("enable_thinking", True),)), None)
    assert kw.value.param == "chat_template_kwargs.enable_thinking"
    with pytest.raises(APIError) as reserved:
        template_kwargs(_chat(template_kwargs=(("add_generation_prompt", False),)), QWEN)
    assert reserved.value.param == "chat_template_kwargs.add_generation_prompt"


def test_a_prefill_continues_the_thinking_or_the_answer() -> None:
    """An Anthropic prefill after the template: one that opens a thinking starts the answer
    inside it, one that closes it (or plain text after a hybrid opening) leaves none."""
    hybrid, opened = _render(qwen3.TEMPLATE), _render(qwen3.THINKING_TEMPLATE)
    inside = QWEN.params(hybrid, _chat(prefill="<think>\nLet me"))
    assert inside is not None and inside.inside and inside.header == ""
    assert QWEN.params(opened, _chat(prefill="hmm</think>\n\nYes")) is None
    assert QWEN.params(hybrid, _chat(prefill="Yes")) is None
    still = QWEN.params(opened, _chat(prefill="hmm"))
    assert still is not None and still.inside
