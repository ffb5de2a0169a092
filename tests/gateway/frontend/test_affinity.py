"""The affinity key: same image or same conversation -> same key, cheap, no tokenizer."""

from __future__ import annotations

from gateway.api.openai.parse import parse_chat_request
from gateway.engine.request import EngineRequest, ImageInput, SamplingParams
from gateway.frontend.affinity import affinity_key
from gateway.processors.positions import ImageLayout


def _request(*hashes: str) -> EngineRequest:
    images = tuple(ImageInput(h, ImageLayout(0, 1, 2, 2), (1, 4, 4)) for h in hashes)
    return EngineRequest("r", (1, 2, 3), images, SamplingParams(max_tokens=4), 0.0)


def _chat(messages):
    return parse_chat_request({"model": "m", "messages": messages})


def test_image_requests_key_by_their_first_image():
    """Any question about an image keys by that image's hash, whatever the text."""
    a = affinity_key(_chat([{"role": "user", "content": "what?"}]), _request("h1", "h2"))
    b = affinity_key(_chat([{"role": "user", "content": "colour?"}]), _request("h1"))
    c = affinity_key(_chat([{"role": "user", "content": "what?"}]), _request("h2"))
    assert a == b == "media:h1" and c == "media:h2"


def test_turns_of_one_conversation_share_a_key():
    """Every turn of a text conversation keys by its opening (system + first user message);
    another opening gives another key."""
    opening = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    turn2 = [
        *opening,
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "more"},
    ]
    k1 = affinity_key(_chat(opening), _request())
    k2 = affinity_key(_chat(turn2), _request())
    other = affinity_key(_chat([{"role": "user", "content": "hi!"}]), _request())
    assert k1 == k2 and k1.startswith("text:")
    assert other != k1
    assert affinity_key(_chat([{"role": "user", "content": "hi"}]), _request()) != k1
