"""End to end, with the real `openai` and `anthropic` SDKs against `vision-gateway serve`: the
context the server runs with, and requests that ask for more than it leaves.

Pinned: /v1/models reports the context (`max_model_len`, `context_length`): the checkpoint's
own by default, `--max-context` when given; a max_tokens (max_output_tokens) far above the
room the prompt leaves is capped to that room, answered 200 with `x-max-tokens-capped`, and an
answer that runs to it ends with the API's length reason; a prompt that does not fit is a 400
`context_length_exceeded` whose token count is the one usage reports for the same prompt on a
server where it fits.
"""

from __future__ import annotations

import re

import anthropic
import httpx
import openai
import pytest
from support import ServerProcess

CONTEXT = 96
QUESTION = "Tell me a long story about a lighthouse keeper and the sea."


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--no-warmup", "--max-context", str(CONTEXT))
    yield proc
    assert proc.stop(), proc.log()


def _anthropic(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0, timeout=300)


def _capped(header: str) -> dict[str, int]:
    pairs = dict(item.split("=") for item in header.split("; "))
    return {key: int(value) for key, value in pairs.items()}


def test_models_report_the_context(server: ServerProcess) -> None:
    card = httpx.get(server.base_url + "/v1/models").json()["data"][0]
    assert card["max_model_len"] == card["context_length"] == CONTEXT
    assert "--max-context" in server.log(200_000) and f"context: {CONTEXT} tokens" in server.log(
        200_000
    )


def test_chat_max_tokens_far_above_the_room_is_capped_and_runs_to_length(
    server: ServerProcess,
) -> None:
    """Invariant: max_tokens 32000 with a prompt of p tokens in a 96-token context is a 200
    whose answer has 96 - p tokens, finish_reason length, and the header saying so; streamed
    alike."""
    raw = server.client().chat.completions.with_raw_response.create(
        model="test",
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=32_000,
        temperature=0,
        extra_body={"ignore_eos": True},  # run to the cap whatever the random weights say
    )
    answer = raw.parse()
    capped = _capped(raw.headers["x-max-tokens-capped"])
    usage = answer.usage
    assert capped == {
        "requested": 32_000,
        "capped": CONTEXT - usage.prompt_tokens,
        "prompt-tokens": usage.prompt_tokens,
        "context": CONTEXT,
    }
    assert usage.completion_tokens == capped["capped"]
    assert answer.choices[0].finish_reason == "length"
    with server.client().chat.completions.with_streaming_response.create(
        model="test",
        messages=[{"role": "user", "content": QUESTION}],
        max_completion_tokens=32_000,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    ) as stream:
        assert _capped(stream.headers["x-max-tokens-capped"]) == capped
        reasons = [c.choices[0].finish_reason for c in stream.parse() if c.choices]
    assert reasons[-1] == "length"


def test_anthropic_and_responses_cap_theirs_too(server: ServerProcess) -> None:
    """Invariant: Anthropic's max_tokens and Responses' max_output_tokens are capped the same
    way (a 200 with the header); an answer that reaches the cap ends with the API's own
    length reason (`max_tokens`, `incomplete`)."""
    raw = _anthropic(server).messages.with_raw_response.create(
        model="test",
        max_tokens=32_000,
        messages=[{"role": "user", "content": QUESTION}],
        extra_body={"temperature": 0},
    )
    message, capped = raw.parse(), _capped(raw.headers["x-max-tokens-capped"])
    assert capped["requested"] == 32_000 and capped["context"] == CONTEXT
    assert message.usage.output_tokens <= capped["capped"]
    if message.usage.output_tokens == capped["capped"]:
        assert message.stop_reason == "max_tokens"
    raw = server.client().responses.with_raw_response.create(
        model="test", input=QUESTION, max_output_tokens=32_000, temperature=0
    )
    response, capped = raw.parse(), _capped(raw.headers["x-max-tokens-capped"])
    assert capped["requested"] == 32_000 and capped["context"] == CONTEXT
    assert response.usage.output_tokens <= capped["capped"]
    if response.usage.output_tokens == capped["capped"]:
        assert response.status == "incomplete"


def test_a_prompt_over_the_context_counts_what_usage_counts(server: ServerProcess) -> None:
    """Invariant: a prompt of n tokens (usage's count where it fits) is refused on a server
    whose context is n with that same n, in every API; Anthropic's usage splits the same n
    into computed and cache-read input tokens."""
    messages = [{"role": "user", "content": QUESTION}]
    fits = server.client().chat.completions.create(
        model="test", messages=messages, max_tokens=1, temperature=0
    )
    n = fits.usage.prompt_tokens
    assert n >= 16  # (the smallest context the flag takes)
    usage = _anthropic(server).messages.create(model="test", max_tokens=1, messages=messages).usage
    assert usage.input_tokens + usage.cache_read_input_tokens == n
    tight = ServerProcess("--no-warmup", "--max-context", str(n))
    try:
        with pytest.raises(openai.BadRequestError) as refused:
            tight.client().chat.completions.create(model="test", messages=messages, max_tokens=1)
        error = refused.value.body
        assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
        assert re.search(rf"the prompt is {n} tokens .* context is {n} tokens", error["message"])
        with pytest.raises(anthropic.BadRequestError) as refused_anthropic:
            _anthropic(tight).messages.create(model="test", max_tokens=1, messages=messages)
        assert f"the prompt is {n} tokens" in str(refused_anthropic.value)
        with pytest.raises(openai.BadRequestError) as refused_responses:
            tight.client().responses.create(model="test", input=messages, max_output_tokens=1)
        refused = refused_responses.value.body
        assert (refused["code"], refused["param"]) == ("context_length_exceeded", "input")
    finally:
        assert tight.stop(), tight.log()


def test_the_default_context_is_the_checkpoints_own() -> None:
    """Invariant: without --max-context the tiny qwen3 serves its config's 40960 tokens (its
    tokenizer's model_max_length says 131072: the config wins), logged at start-up."""
    with ServerProcess("--no-warmup", arch="qwen3") as proc:
        card = httpx.get(proc.base_url + "/v1/models").json()["data"][0]
        assert card["max_model_len"] == 40960
        assert "context: 40960 tokens (the checkpoint's own" in proc.log(200_000)
