"""One Responses-API turn: the conversation it builds and stores, and the owner scope."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request
from support import decoded, noise_image

from gateway.api.keys import Keyring
from gateway.api.responses.store import HeldImage, ResponseStore, StoredResponse
from gateway.api.responses.turn import Turn
from gateway.config import ResponsesConfig, ServerConfig
from gateway.errors import APIError
from gateway.frontend.chat import ImagePart, TextPart


def _request(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})


class FakePipeline:
    """Loads new images by URL from a dict; records what it was asked to load."""

    def __init__(self, images: dict) -> None:
        self.images, self.loaded = images, []

    async def load_images(self, parts: list) -> list:
        self.loaded.extend(p.url for p in parts)
        return [self.images[p.url] for p in parts]


def test_owner_is_a_digest_of_the_presented_key() -> None:
    """Invariant: no server key -> one shared scope; with keys, the scope of stored responses
    (`Caller.owner`) follows the key presented (Bearer or x-api-key alike) and never contains
    it."""

    def owner(headers: dict[str, str], *keys: str) -> str:
        server = ServerConfig(api_key=keys[0] if keys else None)
        return Keyring(server).authorize(_request(headers), "chat").owner

    assert owner({"authorization": "Bearer k1"}) == ""
    bearer = owner({"authorization": "Bearer k1"}, "k1")
    assert bearer == owner({"x-api-key": "k1"}, "k1") and "k1" not in bearer
    assert bearer != owner({"authorization": "Bearer k2"}, "k2")


def test_conversation_holds_images_by_hash_and_continues_without_loading() -> None:
    """Invariant: a turn's stored conversation replaces its images by content hash; the next
    turn rebuilds the same messages, takes the image from the store's pool (the media loader
    is not asked) and puts only its own instructions first."""
    image = decoded(noise_image(4))
    store = ResponseStore(ResponsesConfig())
    pipeline = FakePipeline({"u1": image})
    first = Turn(pipeline, store, set(), "")  # type: ignore[arg-type]
    content = [{"type": "input_image", "image_url": "u1"}, {"type": "input_text", "text": "q1"}]
    chat = first.parse(
        {"model": "m", "instructions": "sys", "input": [{"role": "user", "content": content}]}
    )
    assert [m.role for m in chat.messages] == ["system", "user"]
    assert asyncio.run(first.resolve(chat)) == [image] and pipeline.loaded == ["u1"]
    messages = first.conversation("a1")
    held = messages[0].parts[0]
    assert isinstance(held, HeldImage) and held.content_hash == image.content_hash
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].parts == (TextPart("a1"),)
    said = {"type": "message", "id": "msg_out", "role": "assistant", "content": []}
    body = {"status": "incomplete", "output": [said]}
    store.put(StoredResponse("r1", "", body, messages, first.items), first.image_map())

    second = Turn(pipeline, store, set(), "")  # type: ignore[arg-type]
    chat2 = second.parse({"model": "m", "input": "q2", "previous_response_id": "r1"})
    assert [m.role for m in chat2.messages] == ["user", "assistant", "user"]
    assert asyncio.run(second.resolve(chat2)) == [image] and pipeline.loaded == ["u1"]
    assert isinstance(chat2.images[0], ImagePart)
    again = second.conversation("a2")
    assert len(again) == 4 and again[0].parts[0] == held


def test_continuation_lists_the_earlier_items_themselves() -> None:
    """Invariant: a continuation's input items are the previous response's input items and
    output items (the same objects, so the same ids), then the new input's; instructions
    are no item."""
    store = ResponseStore(ResponsesConfig())
    first = Turn(FakePipeline({}), store, set(), "")  # type: ignore[arg-type]
    first.parse({"model": "m", "instructions": "sys", "input": "q1"})
    (asked,) = first.items
    assert asked["role"] == "user" and asked["content"][0]["text"] == "q1"
    said = {"type": "message", "id": "msg_out", "role": "assistant", "content": []}
    body = {"status": "completed", "output": [said]}
    store.put(StoredResponse("r1", "", body, first.conversation("a1"), first.items), {})
    second = Turn(FakePipeline({}), store, set(), "")  # type: ignore[arg-type]
    second.parse({"model": "m", "input": "q2", "previous_response_id": "r1"})
    assert second.items[0] is asked and second.items[1] is said
    assert second.items[2]["content"][0]["text"] == "q2" and len(second.items) == 3


def test_continuation_refusals() -> None:
    """Invariant: another owner's, a missing, a running and a cancelled response cannot be
    continued (404, 404, 409, 409), all naming previous_response_id."""
    store = ResponseStore(ResponsesConfig())
    store.put(StoredResponse("mine", "a", {"status": "completed"}, ()), {})
    store.put(StoredResponse("stopped", "a", {"status": "cancelled"}, ()), {})
    cases = [
        ("mine", "b", set(), 404),
        ("nope", "a", set(), 404),
        ("run", "a", {"run"}, 409),
        ("stopped", "a", set(), 409),
    ]
    for rid, owner, running, status in cases:
        turn = Turn(FakePipeline({}), store, running, owner)  # type: ignore[arg-type]
        with pytest.raises(APIError) as info:
            turn.parse({"model": "m", "input": "x", "previous_response_id": rid})
        assert info.value.status == status and info.value.param == "previous_response_id"


def test_a_summary_asks_for_thinking_only_where_the_model_thinks() -> None:
    """Invariant: `reasoning.summary` without an effort asks for thinking optionally (a
    model that does not think answers without: no 400, no reasoning item; the front end's
    `thinking_optional`); an effort is the switch, required, whatever the summary."""
    store = ResponseStore(ResponsesConfig())
    turn = Turn(FakePipeline({}), store, set(), "")  # type: ignore[arg-type]
    chat = turn.parse({"model": "m", "input": "x", "reasoning": {"summary": "auto"}})
    assert (chat.thinking, chat.thinking_optional) == (True, True)
    for effort, switch in (("none", False), ("high", True)):
        reasoning = {"effort": effort, "summary": "auto"}
        chat = turn.parse({"model": "m", "input": "x", "reasoning": reasoning})
        assert (chat.thinking, chat.thinking_optional) == (switch, False)
        assert chat.thinking_field == "reasoning.effort"
    plain = turn.parse({"model": "m", "input": "x"})
    assert (plain.thinking, plain.thinking_optional) == (None, False)
