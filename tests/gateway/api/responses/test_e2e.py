"""End to end: the real `openai` SDK's `responses` against `vision-gateway serve`.

Pinned: the response object and the documented stream events (plain == streamed); a 5-turn
conversation about one image through `previous_response_id` reads the conversation's KV from
the cache on turns 2-5, never encodes the image again, and gives exactly the tokens and
logprobs of the same conversation sent in full through Chat Completions with every cache
off; a continuation after the caches were cleared re-encodes the kept image and still
answers the same; stored state: GET, DELETE, `store: false`, cancel, key scoping; errors are
OpenAI error objects; `text.format` is structured output.
"""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest
from support import ServerProcess, data_uri, noise_png

KEY = "sesame"
IMAGE = data_uri(noise_png(5))
QUESTIONS = [
    "What is in this picture?",
    "Tell me more about the colours.",
    "And the corners?",
    "Is anything written on it?",
    "Sum it up in one word.",
]


@pytest.fixture(scope="module")
def server():
    # Exact-reuse blocks of 8 tokens: these prompts are a few dozen tokens, hits whole blocks.
    proc = ServerProcess("--api-key", KEY, "--no-warmup", "--kv-block-tokens", "8")
    yield proc
    assert proc.stop(), proc.log()


@pytest.fixture(scope="module")
def cold():
    """The same model with every cache off: the reference for exactness."""
    proc = ServerProcess(
        "--no-warmup", "--kv-block-tokens", "8", "--no-prefix-cache", "--no-vision-cache"
    )
    yield proc
    assert proc.stop(), proc.log()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return server.client(api_key=KEY)


def _create(client: openai.OpenAI, **kw: object):  # noqa: ANN202
    kw.setdefault("max_output_tokens", 8)
    return client.responses.create(model="test", temperature=0, **kw)  # type: ignore[arg-type]


def _first_turn() -> list[dict]:
    content = [
        {"type": "input_image", "image_url": IMAGE},
        {"type": "input_text", "text": QUESTIONS[0]},
    ]
    return [{"role": "user", "content": content}]


def _tokens(entries: list) -> list[tuple[str, list[int], float]]:  # noqa: ANN001
    return [(e.token, list(e.bytes or []), e.logprob) for e in entries]


def test_plain_response_shape(client: openai.OpenAI) -> None:
    """Invariant: a `response` with one assistant message of one output_text part; usage
    counts input, cached and output tokens; max_output_tokens ends it as `incomplete`; GET
    returns the stored body."""
    r = _create(client, input="Hello, who are you?", instructions="Be terse.")
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "test"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["message"] and r.output[0].role == "assistant"
    assert r.output[0].content[0].type == "output_text"
    assert r.output_text == r.output[0].content[0].text
    assert r.usage.output_tokens == 8 and r.usage.input_tokens > 8
    assert r.usage.total_tokens == r.usage.input_tokens + 8
    assert r.usage.input_tokens_details.cached_tokens >= 0
    assert client.responses.retrieve(r.id).model_dump() == r.model_dump()


def test_stream_events_match_plain(client: openai.OpenAI) -> None:
    """Invariant: the stream is response.created, in_progress, output_item.added,
    content_part.added, deltas, output_text.done, content_part.done, output_item.done and a
    terminal event, numbered 0..n-1; its text equals the plain answer's."""
    plain = _create(client, input="Stream this, please.")
    events = list(_create(client, input="Stream this, please.", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-4].text == plain.output_text
    final = events[-1].response
    assert final.output_text == text and final.usage.output_tokens == 8


def _decodes(server: ServerProcess) -> float:
    headers = {"authorization": f"Bearer {KEY}"}
    return server.metrics(headers)["vision_gateway_image_decode_seconds_count"]


def test_five_turns_through_previous_response_id(
    client: openai.OpenAI, server: ServerProcess, cold: ServerProcess
) -> None:
    """Invariant: turns 2-5 continue by id only (no image resent, none decoded), read cached
    tokens, encode no image, and match token for token (and logprob for logprob) the same
    conversation sent in full through Chat Completions to a server with every cache off."""
    reference = cold.client()
    messages: list[dict] = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": IMAGE}},
                {"type": "text", "text": QUESTIONS[0]},
            ],
        }
    ]
    previous, previous_input = None, 0
    include = ["message.output_text.logprobs"]
    for turn, question in enumerate(QUESTIONS):
        if previous is None:
            r = _create(client, input=_first_turn(), include=include)
            decodes = _decodes(server)
        else:
            r = _create(client, input=question, previous_response_id=previous, include=include)
            messages.append({"role": "user", "content": question})
        full = reference.chat.completions.create(
            model="test", messages=messages, max_tokens=8, temperature=0, logprobs=True
        )
        got = _tokens(r.output[0].content[0].logprobs)
        assert got == _tokens(full.choices[0].logprobs.content), f"turn {turn + 1}"
        assert r.output_text == full.choices[0].message.content
        assert r.usage.input_tokens == full.usage.prompt_tokens
        details = r.usage.input_tokens_details
        if previous is not None:
            # Exact reuse hits whole 8-token blocks that a prefill computed: the previous
            # turn's prompt up to the block holding its last token (fed by decode).
            assert details.cached_tokens >= 8 * ((previous_input - 1) // 8), f"turn {turn + 1}"
            assert details.cached_tokens % 8 == 0
            assert details.images_encoded == 0  # type: ignore[attr-defined]
        messages.append({"role": "assistant", "content": r.output_text})
        previous, previous_input = r.id, r.usage.input_tokens
    assert _decodes(server) == decodes  # turns 2-5 decoded (and hashed) no image


def test_continuation_after_caches_cleared(client: openai.OpenAI, server: ServerProcess) -> None:
    """Invariant: when the image's features and KV have left the caches, a continuation
    re-encodes the kept decoded image (usage says so) and answers as it would have warm."""
    first = _create(client, input=_first_turn())
    warm = _create(client, input="Again?", previous_response_id=first.id)
    headers = {"authorization": f"Bearer {KEY}"}
    assert httpx.post(server.base_url + "/v1/cache/clear", headers=headers).status_code == 200
    again = _create(client, input="Again?", previous_response_id=first.id)
    assert again.output_text == warm.output_text
    assert again.usage.input_tokens_details.images_encoded == 1  # type: ignore[attr-defined]
    assert again.usage.input_tokens_details.cached_tokens == 0


def test_delete_store_false_and_scoping(client: openai.OpenAI, server: ServerProcess) -> None:
    """Invariant: a deleted or unstored (`store: false`) response is a 404 to GET and to
    `previous_response_id`; a wrong key is a 401 before anything is looked up."""
    r = _create(client, input="Remember me.")
    deleted = client.responses.delete(r.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.retrieve(r.id)
    assert info.value.body["code"] == "response_not_found"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as info:
        _create(client, input="and?", previous_response_id=r.id)
    assert info.value.body["param"] == "previous_response_id"  # type: ignore[index]
    unstored = _create(client, input="Forget me.", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    kept = _create(client, input="Mine.")
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").responses.retrieve(kept.id)


def test_cancel_running_response(client: openai.OpenAI) -> None:
    """Invariant: cancel stops a running response (status cancelled, its stream ends) and
    it then cannot be continued; cancelling a finished one is a 409."""
    stream = _create(client, input="Talk for a long time.", max_output_tokens=2000, stream=True)
    events = iter(stream)
    created = next(events).response
    started = threading.Event()
    seen: list[str] = []

    def read() -> None:
        for event in events:
            seen.append(event.type)
            started.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert started.wait(120)
    cancelled = client.responses.cancel(created.id)
    reader.join(60)
    assert not reader.is_alive() and cancelled.status == "cancelled"
    assert client.responses.retrieve(created.id).status == "cancelled"
    with pytest.raises(openai.ConflictError):
        _create(client, input="go on", previous_response_id=created.id)
    done = _create(client, input="short")
    with pytest.raises(openai.ConflictError):
        client.responses.cancel(done.id)


def test_errors_are_openai_error_objects(client: openai.OpenAI) -> None:
    """Invariant: an unknown tool type, a required choice among built-in tools only (left
    out: nothing could be called), a named tool_choice not among the tools, file ids and
    unknown models are 4xx OpenAI errors naming the field."""
    with pytest.raises(openai.BadRequestError) as info:
        _create(client, input="x", tools=[{"type": "wbe_search"}])
    assert info.value.body["param"] == "tools[0].type"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as info:
        _create(client, input="x", tools=[{"type": "web_search"}], tool_choice="required")
    assert info.value.body["param"] == "tool_choice"  # type: ignore[index]
    fn = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    with pytest.raises(openai.BadRequestError) as info:
        _create(client, input="x", tools=[fn], tool_choice={"type": "function", "name": "g"})
    assert info.value.body["param"] == "tool_choice.name"  # type: ignore[index]
    part = {"type": "input_image", "file_id": "file-123"}
    with pytest.raises(openai.BadRequestError) as info:
        _create(client, input=[{"role": "user", "content": [part]}])
    assert info.value.body["param"] == "input[0].content[0].file_id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="nope", input="x")
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_text_format_json_schema(client: openai.OpenAI) -> None:
    """Invariant: text.format json_schema constrains the answer to the schema."""
    schema = {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "flag", "schema": schema, "strict": True}
    r = _create(client, input="Answer in JSON.", text={"format": fmt}, max_output_tokens=40)
    assert r.status == "completed" and r.text.format.type == "json_schema"
    value = json.loads(r.output_text)
    assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool)
