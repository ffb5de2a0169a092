"""End to end: `GET /v1/responses/{id}/input_items` through the real `openai` SDK's
`responses.input_items.list` against `vision-gateway serve` (two tenants' keys).

Pinned: after a create, the listing is the request's input items in the SDK's shapes, with
ids that stay the same on every listing; after a continuation it is the whole conversation
before the answer (earlier input, the earlier output under its own ids, the new input), tool
calls and outputs included; `limit` / `after` walk every item exactly once in both orders
(the SDK's auto-pagination too); `include=message.input_image.image_url` shows the image as
sent; a running response lists its input; a deleted, unstored, unknown or other tenant's
response is a 404; bad query values are 400s naming the parameter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.responses import (
    ResponseFunctionToolCallItem,
    ResponseFunctionToolCallOutputItem,
    ResponseInputMessageItem,
    ResponseOutputMessage,
)
from support import ServerProcess, data_uri, noise_png

KEYS = {"alice": "sk-alice-1111", "bob": "sk-bob-2222"}
IMAGE = data_uri(noise_png(7))
INCLUDE_IMAGES: Any = ["message.input_image.image_url"]
CLICK = {
    "type": "object",
    "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["x"],
    "additionalProperties": False,
}
TOOLS: Any = [{"type": "function", "name": "click", "parameters": CLICK}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    keys: Path = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text("".join(f"{name} {key}\n" for name, key in KEYS.items()))
    keys.chmod(0o600)
    proc = ServerProcess("--api-keys-file", str(keys), "--no-warmup", "--kv-block-tokens", "8")
    yield proc
    assert proc.stop(), proc.log()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return server.client(api_key=KEYS["alice"])


def _create(client: openai.OpenAI, **kw: Any):  # noqa: ANN202
    kw.setdefault("max_output_tokens", 4)
    return client.responses.create(model="test", temperature=0, **kw)


def _ids(page: Any) -> list[str]:
    return [item.id for item in page.data]


def test_list_after_create(client: openai.OpenAI) -> None:
    """Invariant: a response's listing is its input items (instructions are none) in the
    SDK's shapes; the image's URL is null unless included, then the data URI as sent; the
    ids are the same on every listing."""
    content = [
        {"type": "input_image", "image_url": IMAGE, "detail": "low"},
        {"type": "input_text", "text": "What is this?"},
    ]
    r = _create(client, input=[{"role": "user", "content": content}], instructions="Be terse.")
    page = client.responses.input_items.list(r.id)
    (item,) = page.data
    assert isinstance(item, ResponseInputMessageItem) and item.role == "user"
    assert item.id.startswith("msg_") and item.status == "completed"
    image, text = item.content
    assert image.type == "input_image" and image.image_url is None and image.detail == "low"
    assert text.type == "input_text" and text.text == "What is this?"
    assert page.first_id == page.last_id == item.id and page.has_more is False  # type: ignore[attr-defined]
    shown = client.responses.input_items.list(r.id, include=INCLUDE_IMAGES)
    assert shown.data[0].content[0].image_url == IMAGE  # type: ignore[union-attr]
    assert _ids(shown) == _ids(page)


def test_list_after_continuation_is_the_whole_conversation(client: openai.OpenAI) -> None:
    """Invariant: a continued response lists the earlier input items (same ids as the
    earlier listing), the earlier output items (their ids in the earlier response), then
    the new input: oldest first with `asc`, newest first by default."""
    first = _create(client, input="Hello there.")
    second = _create(client, input="And then?", previous_response_id=first.id)
    earlier = client.responses.input_items.list(first.id).data
    listed = client.responses.input_items.list(second.id, order="asc").data
    assert [type(i) for i in listed] == [
        ResponseInputMessageItem,
        ResponseOutputMessage,
        ResponseInputMessageItem,
    ]
    assert listed[0].id == earlier[0].id and listed[1].id == first.output[0].id
    assert listed[1].content[0].text == first.output_text  # type: ignore[union-attr]
    assert listed[2].content[0].text == "And then?"  # type: ignore[union-attr]
    default = client.responses.input_items.list(second.id).data
    assert [i.id for i in default] == [i.id for i in reversed(listed)]


def test_tool_calls_and_outputs_are_listed(client: openai.OpenAI) -> None:
    """Invariant: a continuation answering a call lists the call (its id in the earlier
    response) and the output as the SDK's function call items."""
    called = _create(
        client,
        input="click it",
        tools=TOOLS,
        tool_choice="required",
        max_output_tokens=60,
        extra_body={"seed": 1},
    )
    (call,) = called.output
    assert call.type == "function_call", called
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "done"}
    after = _create(client, input=[output], previous_response_id=called.id, tools=TOOLS)
    listed = client.responses.input_items.list(after.id, order="asc").data
    assert [i.type for i in listed] == ["message", "function_call", "function_call_output"]
    made, answered = listed[1], listed[2]
    assert isinstance(made, ResponseFunctionToolCallItem) and made.id == call.id
    assert made.call_id == call.call_id and made.arguments == call.arguments
    assert isinstance(answered, ResponseFunctionToolCallOutputItem)
    assert answered.call_id == call.call_id and answered.output == "done"


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_pages_walk_every_item_once(client: openai.OpenAI, order: Any) -> None:
    """Invariant: pages of `limit` followed by `after` = the last id give every item once
    in the order asked, `has_more` false on the last; the SDK's auto-pagination agrees."""
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(7)
    ]
    r = _create(client, input=turns)
    every = client.responses.input_items.list(r.id, order="asc", limit=100).data
    texts = [i.content[0].text for i in every]  # type: ignore[union-attr]
    assert texts == [f"turn {i}" for i in range(7)]
    expected = [i.id for i in every] if order == "asc" else [i.id for i in reversed(every)]
    seen: list[str] = []
    after: Any = openai.omit
    while True:
        page = client.responses.input_items.list(r.id, order=order, limit=3, after=after)
        assert len(page.data) <= 3
        seen += _ids(page)
        if not page.has_more:
            break
        after = page.last_id  # type: ignore[attr-defined]
    assert seen == expected
    assert [i.id for i in client.responses.input_items.list(r.id, order=order, limit=2)] == expected


def test_running_response_lists_its_input(client: openai.OpenAI) -> None:
    """Invariant: while a stored response runs its input items are listed already (it was
    running: the cancel after the listing finds it running)."""
    stream = _create(client, input="Talk for a long time.", max_output_tokens=2000, stream=True)
    created = next(iter(stream)).response
    try:
        (item,) = client.responses.input_items.list(created.id).data
        assert item.content[0].text == "Talk for a long time."  # type: ignore[union-attr]
    finally:
        assert client.responses.cancel(created.id).status == "cancelled"
        stream.close()


def test_missing_responses_are_404s(client: openai.OpenAI, server: ServerProcess) -> None:
    """Invariant: an unknown, a deleted, an unstored (`store: false`) response and another
    tenant's are all 404 response_not_found, as GET /v1/responses/{id} answers."""
    kept = _create(client, input="Mine.")
    gone = _create(client, input="Delete me.")
    client.responses.delete(gone.id)
    unstored = _create(client, input="Forget me.", store=False)
    bob = server.client(api_key=KEYS["bob"])
    for who, rid in (
        (client, "resp_unknown"),
        (client, gone.id),
        (client, unstored.id),
        (bob, kept.id),
    ):
        with pytest.raises(openai.NotFoundError) as info:
            who.responses.input_items.list(rid)
        assert info.value.body["code"] == "response_not_found"  # type: ignore[index]
    assert client.responses.input_items.list(kept.id).data


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"order": "sideways"}, "order"),
        ({"include": ["message.input_image"]}, "include"),
        ({"after": "msg_nothing"}, "after"),
    ],
)
def test_bad_query_values_are_400s(client: openai.OpenAI, query: Any, param: str) -> None:
    """Invariant: each bad query value is a 400 OpenAI error object naming its parameter."""
    r = _create(client, input="Query me.")
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.input_items.list(r.id, **query)
    assert info.value.body["param"] == param  # type: ignore[index]
    assert info.value.body["type"] == "invalid_request_error"  # type: ignore[index]
