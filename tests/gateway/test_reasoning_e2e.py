"""End to end: thinking through the real `openai` and `anthropic` SDKs against
`vision-gateway serve` on the tiny Qwen3, with Qwen3's Thinking template (the prompt opens
`<think>`: every answer starts inside the thinking) and with its hybrid template (the
`enable_thinking` switch).

Pinned: Chat Completions' `message.reasoning_content` / `delta.reasoning_content`, Messages'
`thinking` blocks and `thinking_delta` events (`budget_tokens` ends the thinking, the rest is
a text block), Responses' `reasoning` item and its reasoning-text and summary events, each
plain == streamed; the thinking never shows in the answer's text; a thinking block sent back
is dropped by the template as Qwen3 drops earlier turns' thinking (the prompt is the same
without it) and the next turn reads the conversation's prefix from the cache;
`chat_template_kwargs.enable_thinking` and `reasoning_effort: "none"` switch the hybrid
template's thinking off (its empty think block is in the prompt).
"""

from __future__ import annotations

import anthropic
import openai
import pytest
from support import LocalServer, thinking_model, tiny_model

ASK = [{"role": "user", "content": "why is the sky blue?"}]


def _serve(path: object) -> LocalServer:
    args = ["--model", str(path), "--served-model-name", "test", "--no-warmup"]
    return LocalServer([*args, "--kv-block-tokens", "8"])


@pytest.fixture(scope="module")
def thinking():
    proc = _serve(thinking_model())
    yield proc
    assert proc.stop(), proc.log()


@pytest.fixture(scope="module")
def hybrid():
    proc = _serve(tiny_model("qwen3"))
    yield proc
    assert proc.stop(), proc.log()


def _anthropic(server: LocalServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0, timeout=300)


def test_chat_completions_reasoning_content(thinking: LocalServer) -> None:
    client = thinking.client()
    kw = {"model": "test", "messages": ASK, "max_tokens": 10, "temperature": 1.0, "seed": 4}
    plain = client.chat.completions.create(**kw, reasoning_effort="high")  # type: ignore[arg-type]
    message = plain.choices[0].message
    thought = message.reasoning_content  # type: ignore[attr-defined]
    assert thought and "<think>" not in thought and message.content == ""
    assert plain.usage and plain.usage.completion_tokens_details
    assert plain.usage.completion_tokens_details.reasoning_tokens == 10  # all of it
    stream = client.chat.completions.create(**kw, reasoning_effort="high", stream=True)  # type: ignore[arg-type]
    deltas = [c.choices[0].delta for c in stream if c.choices]
    streamed = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    assert streamed == thought
    assert "".join(d.content or "" for d in deltas) == ""


def test_messages_thinking_blocks_and_budget(thinking: LocalServer) -> None:
    client = _anthropic(thinking)
    kw = {
        "model": "test",
        "messages": ASK,
        "max_tokens": 12,
        "thinking": {"type": "enabled", "budget_tokens": 4},
        "extra_body": {"temperature": 1.0},  # greedy, the tiny model thinks only newlines
    }
    for answer in (
        client.messages.create(**kw),  # type: ignore[arg-type]
        client.messages.stream(**kw).__enter__().get_final_message(),  # type: ignore[arg-type]
    ):
        assert [b.type for b in answer.content] == ["thinking", "text"], answer.content
        thought, text = answer.content
        assert thought.thinking and thought.signature == ""  # type: ignore[union-attr]
        assert text.text and "think>" not in text.text  # type: ignore[union-attr]
    plain = answer
    # The thinking goes back in the history; Qwen3's template drops it for an earlier turn.
    turn2 = [*ASK, {"role": "assistant", "content": plain.content}, ASK[0]]
    without = [*ASK, {"role": "assistant", "content": [plain.content[-1]]}, ASK[0]]
    count = client.messages.count_tokens(model="test", messages=turn2)  # type: ignore[arg-type]
    bare = client.messages.count_tokens(model="test", messages=without)  # type: ignore[arg-type]
    assert count.input_tokens == bare.input_tokens
    again = client.messages.create(**{**kw, "messages": turn2})  # type: ignore[arg-type]
    assert again.usage.cache_read_input_tokens and again.usage.cache_read_input_tokens > 0


def test_messages_stream_has_thinking_deltas(thinking: LocalServer) -> None:
    client = _anthropic(thinking)
    with client.messages.stream(
        model="test",
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=10,
        thinking={"type": "enabled", "budget_tokens": 3},
        extra_body={"temperature": 1.0},
    ) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
    assert "thinking_delta" in deltas and "signature_delta" in deltas


def test_responses_reasoning_item(thinking: LocalServer) -> None:
    client = thinking.client()
    kw = {
        "model": "test",
        "input": "why?",
        "max_output_tokens": 8,
        "temperature": 1.0,
        "reasoning": {"effort": "low", "summary": "auto"},
        "store": False,
    }
    plain = client.responses.create(**kw)  # type: ignore[arg-type]
    item = plain.output[0]
    assert item.type == "reasoning" and item.content and item.content[0].text  # type: ignore[union-attr]
    assert item.summary[0].text == item.content[0].text  # type: ignore[union-attr]
    events = list(client.responses.create(**kw, stream=True))  # type: ignore[arg-type]
    kinds = {e.type for e in events}
    assert {"response.reasoning_text.delta", "response.reasoning_summary_text.done"} <= kinds
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output[0].type == "reasoning"


def test_hybrid_switch_closes_the_thinking(hybrid: LocalServer) -> None:
    """The hybrid template with `enable_thinking: false` (or `reasoning_effort: "none"`)
    writes `<think>\\n\\n</think>\\n\\n` into the prompt: 4 more tokens, and no thinking."""
    client = hybrid.client()
    kw = {"model": "test", "messages": ASK, "max_tokens": 4, "temperature": 0}
    base = client.chat.completions.create(**kw)  # type: ignore[arg-type]
    off = client.chat.completions.create(
        **kw, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )  # type: ignore[arg-type]
    none = client.chat.completions.create(**kw, reasoning_effort="none")  # type: ignore[arg-type]
    assert base.usage and off.usage and none.usage
    assert off.usage.prompt_tokens == none.usage.prompt_tokens == base.usage.prompt_tokens + 4
    assert getattr(off.choices[0].message, "reasoning_content", None) is None
    for extra in ({"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
                  {"reasoning_effort": "none"}):  # fmt: skip
        chunks = list(
            client.chat.completions.create(
                **kw, **extra, stream=True, stream_options={"include_usage": True}
            )  # type: ignore[arg-type]
        )
        assert chunks[-1].usage and chunks[-1].usage.prompt_tokens == off.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            **kw, extra_body={"chat_template_kwargs": {"add_generation_prompt": False}}
        )  # type: ignore[arg-type]
    assert bad.value.body["param"] == "chat_template_kwargs.add_generation_prompt"  # type: ignore[index]
