"""End to end: the real `anthropic` SDK against `vision-gateway serve` on 127.0.0.1.

Pinned: plain and streamed answers are equal and the stream has the documented event
sequence; usage splits the prompt into computed and cache-read tokens, which add up to
count_tokens; a repeat question about an image reads most of its prompt from the cache;
system prompts, multi-turn, prefill and stop sequences work; errors are Anthropic error
objects (x-api-key auth, 404 model, 400 unsupported features, 529 when overloaded).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import anthropic
import httpx
import pytest
from support import ImageServer, ServerProcess, noise_png


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("media")
    (root / "a.png").write_bytes(noise_png(11))
    return root


@pytest.fixture(scope="module")
def images(media_dir: Path):
    server = ImageServer(media_dir)
    yield server
    server.close()


@pytest.fixture(scope="module")
def server():
    # Exact-reuse blocks of 8 tokens: these prompts are a few dozen tokens, hits whole blocks.
    proc = ServerProcess(
        "--allow-private-urls", "--api-key", "sesame", "--no-warmup", "--kv-block-tokens", "8"
    )
    yield proc
    assert proc.stop(), proc.log()


def _client(server: ServerProcess, key: str = "sesame") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=key, max_retries=0, timeout=300)


def _image_block(seed: int = 11) -> dict:
    data = base64.b64encode(noise_png(seed)).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def _ask(client: anthropic.Anthropic, content: object, **kw: object) -> anthropic.types.Message:
    kw.setdefault("max_tokens", 8)
    return client.messages.create(
        model="test",
        messages=[{"role": "user", "content": content}],  # type: ignore[list-item]
        extra_body={"temperature": 0},
        **kw,  # type: ignore[arg-type]
    )


def test_plain_message_shape_and_usage(server: ServerProcess) -> None:
    """Invariant: a `message` with one text block; input + cache-read tokens == count_tokens;
    output_tokens == max_tokens when the budget ends it."""
    client = _client(server)
    r = _ask(client, "Hello, who are you?", system="You are terse.", metadata={"user_id": "u1"})
    assert r.type == "message" and r.role == "assistant" and r.model == "test"
    assert r.id.startswith("msg_") and [b.type for b in r.content] == ["text"]
    assert r.stop_reason == "max_tokens" and r.stop_sequence is None
    assert r.usage.output_tokens == 8
    counted = client.messages.count_tokens(
        model="test",
        system="You are terse.",
        messages=[{"role": "user", "content": "Hello, who are you?"}],
    )
    assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) == counted.input_tokens


def test_streaming_equals_plain_with_the_documented_events(server: ServerProcess) -> None:
    """Invariant: the SDK's stream accumulates to the plain answer; the raw event sequence is
    message_start, content_block_start, ping, deltas, content_block_stop, message_delta,
    message_stop."""
    client = _client(server)
    content = [_image_block(), {"type": "text", "text": "Describe."}]
    whole = _ask(client, content, max_tokens=12)
    with client.messages.stream(
        model="test",
        max_tokens=12,
        messages=[{"role": "user", "content": content}],  # type: ignore[list-item]
        extra_body={"temperature": 0},
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens

    body = {
        "model": "test",
        "max_tokens": 5,
        "stream": True,
        "temperature": 0,
        "messages": [{"role": "user", "content": "count"}],
    }
    r = httpx.post(
        server.base_url + "/v1/messages", json=body, headers={"x-api-key": "sesame"}, timeout=60
    )
    names = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    head, deltas, tail = names[:3], names[3:-3], names[-3:]
    assert head == ["message_start", "content_block_start", "ping"]
    assert set(deltas) <= {"content_block_delta"}
    assert tail == ["content_block_stop", "message_delta", "message_stop"]
    data = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert data[-2]["delta"]["stop_reason"] == "max_tokens"
    assert data[-2]["usage"]["output_tokens"] == 5


def test_a_repeat_question_about_an_image_reads_its_prompt_from_the_cache(
    server: ServerProcess, media_dir: Path, images: ImageServer
) -> None:
    """Invariant: the second ask about one image (URL source, then base64 of the same pixels)
    reports most of its prompt as cache_read_input_tokens and answers the same text."""
    client = _client(server)
    httpx.post(server.base_url + "/v1/cache/clear", headers={"x-api-key": "sesame"})
    url = {"type": "image", "source": {"type": "url", "url": f"{images.url}/a.png"}}
    first = _ask(client, [url, {"type": "text", "text": "What is it?"}])
    second = _ask(client, [_image_block(11), {"type": "text", "text": "What is it?"}])
    total = second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert first.usage.cache_read_input_tokens == 0
    assert first.usage.input_tokens == total
    assert second.usage.cache_read_input_tokens > 0.8 * total
    assert second.content[0].text == first.content[0].text


def test_multi_turn_prefill_and_stop_sequences(server: ServerProcess) -> None:
    """Invariant: a stop sequence ends the text before it and is reported; a final assistant
    message is continued (not repeated) and counts as prompt."""
    client = _client(server)
    probe = _ask(client, "Say something.", max_tokens=16).content[0].text
    assert len(probe) >= 2
    stop = probe[1:3] if probe[1:3].strip() else probe[1]
    stopped = _ask(client, "Say something.", max_tokens=16, stop_sequences=[stop, "zzz-never"])
    assert stopped.stop_reason == "stop_sequence", (probe, stop)
    assert stopped.stop_sequence == stop and stopped.content[0].text == probe[: probe.find(stop)]
    turns = [
        {"role": "user", "content": "Say something."},
        {"role": "assistant", "content": probe},
        {"role": "user", "content": "Again?"},
    ]
    second = client.messages.create(model="test", max_tokens=4, messages=turns)  # type: ignore[arg-type]
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens > 10
    prefilled = client.messages.create(
        model="test",
        max_tokens=4,
        messages=[*turns, {"role": "assistant", "content": "Well,"}],  # type: ignore[list-item]
    )
    total = prefilled.usage.input_tokens + prefilled.usage.cache_read_input_tokens
    assert total > second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert not prefilled.content[0].text.startswith("Well,")


def test_errors_are_anthropic_error_objects(server: ServerProcess) -> None:
    """Invariant: x-api-key and Bearer both authenticate; a wrong key is 401
    authentication_error; unknown model 404; unsupported features 400 naming the field."""
    with pytest.raises(anthropic.AuthenticationError) as auth:
        _ask(_client(server, "wrong"), "hi")
    assert auth.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    bearer = httpx.post(
        server.base_url + "/v1/messages",
        json={"model": "test", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]},
        headers={"authorization": "Bearer sesame"},
        timeout=60,
    )
    assert bearer.status_code == 200 and bearer.json()["type"] == "message"
    with pytest.raises(anthropic.NotFoundError) as missing:
        _client(server).messages.create(
            model="claude-x", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert missing.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": missing.value.body["error"]["message"]},  # type: ignore[index]
    }
    tool = {"name": "f", "input_schema": {"type": "object"}}
    with pytest.raises(anthropic.BadRequestError) as tools:  # a named choice not among tools
        _ask(_client(server), "hi", tools=[tool], tool_choice={"type": "tool", "name": "g"})
    assert "tool_choice" in tools.value.body["error"]["message"]  # type: ignore[index]
    assert tools.value.body["type"] == "error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        _ask(_client(server), "hi", thinking={"type": "enabled", "budget_tokens": 1024})


def test_overloaded_is_529(tmp_path: Path) -> None:
    """Invariant: with every row and queue slot taken, a Messages request gets 529
    overloaded_error (the OpenAI endpoint says 429), and the next one after it is served."""
    proc = ServerProcess(
        "--max-batch", "1", "--max-waiting", "0", "--no-warmup", "--max-context", "200000"
    )  # fmt: skip
    try:
        hold = {
            "model": "test",
            "max_tokens": 190_000,  # still running while we ask (closing cancels it)
            "ignore_eos": True,
            "stream": True,
            "messages": [{"role": "user", "content": "hold"}],
        }
        with httpx.stream(
            "POST", proc.base_url + "/v1/chat/completions", json=hold, timeout=120
        ) as held:
            lines = held.iter_lines()  # kept: a dropped iterator closes the response
            assert next(lines).startswith("data: ")  # admitted: the one row is taken
            client = anthropic.Anthropic(base_url=proc.base_url, api_key="x", max_retries=0)
            with pytest.raises(anthropic.APIStatusError) as busy:
                _ask(client, "hi")
            assert busy.value.status_code == 529
            assert busy.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
            assert busy.value.response.headers["retry-after"] == "1"
        r = _ask(anthropic.Anthropic(base_url=proc.base_url, api_key="x", max_retries=3), "hi")
        assert r.stop_reason == "max_tokens"
    finally:
        assert proc.stop(), proc.log()
