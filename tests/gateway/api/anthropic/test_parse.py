"""Anthropic Messages request parsing: every field validated with a message naming it;
unsupported features that would change the answer refused; unknown fields ignored and named
for the x-ignored-fields header; valid requests become the same `ChatRequest` parts an OpenAI
request would (so the same prompt, caches and batch)."""

from __future__ import annotations

import pytest

from gateway.api.anthropic.parse import parse_messages_request
from gateway.api.openai.parse import parse_chat_request
from gateway.errors import APIError
from gateway.frontend.chat import ImagePart, TextPart
from gateway.frontend.prompt import template_messages

BASE = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
PNG_B64 = "iVBORw0KGgo="


def _with(**fields: object) -> dict:
    return {**BASE, **fields}


def _user(*blocks: object) -> dict:
    return _with(messages=[{"role": "user", "content": list(blocks)}])


def test_defaults_and_sampling_fields() -> None:
    r = parse_messages_request(_with(temperature=0, top_p=0.5, top_k=7, stop_sequences=["x"]))
    assert (r.max_tokens, r.temperature, r.top_p, r.top_k, r.stop) == (5, 0.0, 0.5, 7, ("x",))
    assert not r.stream and r.prefill == ""
    assert parse_messages_request(BASE).temperature == 1.0


def test_the_same_conversation_templates_like_openai() -> None:
    """Invariant: system + text + image blocks become the template messages the OpenAI
    request with the same content gives (image sources become data URIs / URLs)."""
    anthropic = {
        "model": "m",
        "max_tokens": 5,
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64},
                    },
                    {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
                ],
            },
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "and?"},
        ],
    }
    openai = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
                    {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
                ],
            },
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "and?"},
        ],
    }
    a, o = parse_messages_request(anthropic), parse_chat_request(openai)
    assert template_messages(a) == template_messages(o)
    assert [i.url for i in a.images] == [i.url for i in o.images]
    assert a.images[0].param == "messages[0].content[1].source.data"


def test_a_final_assistant_message_is_a_prefill() -> None:
    r = parse_messages_request(
        _with(
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "Sure,"}]},
            ]
        )
    )
    assert r.prefill == "Sure," and [m.role for m in r.messages] == ["user"]
    assert r.messages[0].parts == (TextPart("hi"),)


def test_count_only_bodies_need_no_max_tokens() -> None:
    body = {k: v for k, v in BASE.items() if k != "max_tokens"}
    assert parse_messages_request(body, count_only=True).max_tokens is None
    with pytest.raises(APIError) as info:
        parse_messages_request(body)
    assert info.value.param == "max_tokens"


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A"}}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], None),
        ({"max_tokens": 5, "messages": BASE["messages"]}, "model"),
        (_with(max_tokens=0), "max_tokens"),
        (_with(max_tokens="5"), "max_tokens"),
        (_with(messages=[]), "messages"),
        (_with(messages=[{"role": "assistant", "content": "x"}]), "messages"),
        (_with(messages=[{"role": "system", "content": "x"}]), "messages"),
        (_with(messages=[{"role": "developer", "content": "x"}]), "messages[0].role"),
        (_with(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
        (_user({"type": "text"}), "messages[0].content[0].text"),
        (_user({"type": "audio"}), "messages[0].content[0].type"),
        (_user({"type": []}), "messages[0].content[0].type"),
        (_user({"type": {"a": 1}}), "messages[0].content[0].type"),
        (_user({"type": "document", "source": {}}), "messages[0].content[0].type"),
        (_user({"type": "tool_result", "tool_use_id": "x"}), "messages[0].content[0].tool_use_id"),
        (_user({"type": "tool_result"}), "messages[0].content[0].tool_use_id"),
        (_user({"type": "image", "source": {"type": "file", "file_id": "f"}}),
         "messages[0].content[0].source.type"),
        (_user({"type": "image", "source": {"type": "base64", "media_type": "image/bmp",
                                            "data": "A"}}),
         "messages[0].content[0].source.media_type"),
        (_user({"type": "image", "source": {"type": "base64", "media_type": "image/png"}}),
         "messages[0].content[0].source.data"),
        # a PNG sent as a JPEG: Anthropic's API refuses it, so code written here works there
        (_user({"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                            "data": PNG_B64}}),
         "messages[0].content[0].source.media_type"),
        (_user({"type": "image", "source": {"type": "url"}}), "messages[0].content[0].source.url"),
        (_user({"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                            "data": "data:image/png;base64," + PNG_B64}}),
         "messages[0].content[0].source.data"),
        (_user({"type": "image", "source": "x"}), "messages[0].content[0].source.type"),
        (_with(messages=[{"role": "user", "content": "q"},
                         {"role": "assistant", "content": [IMAGE]}]),
         "messages[1].content[0]"),
        (_with(system=5), "system"),
        (_with(system=[{"type": "image"}]), "system[0]"),
        (_with(temperature=1.5), "temperature"),
        (_with(top_p=0), "top_p"),
        (_with(top_k=-1), "top_k"),
        (_with(stop_sequences="x"), "stop_sequences"),
        (_with(stop_sequences=[""]), "stop_sequences"),
        (_with(stream="yes"), "stream"),
        (_with(metadata="u"), "metadata"),
        (_with(tools=[{"name": "f"}]), "tools[0]"),
        (_with(tools=[{"name": "f", "input_schema": {}}], tool_choice={"type": "tool"}),
         "tool_choice.name"),
        (_with(tool_choice={"type": "auto"}), "tool_choice"),
        (_with(thinking={"type": "enabled", "budget_tokens": 1024}), "thinking.budget_tokens"),
        (_with(thinking={"type": "enabled"}), "thinking.budget_tokens"),
        (_with(thinking={"type": "on"}), "thinking.type"),
        (_with(thinking=True), "thinking"),
        (_with(mcp_servers=[{"type": "url", "url": "https://x.test", "name": "x"}]),
         "mcp_servers"),
        (_with(container="c"), "container"),
        (_with(compaction={"type": "summarize"}), "compaction"),
        (_with(thread={"type": "create"}), "thread"),
        (_with(metadata={"user_id": 5}), "metadata.user_id"),
        (_with(messages=[{"role": "user", "content": "\ud800"}]), "messages[0].content"),
    ],
)  # fmt: skip
def test_invalid_fields_name_the_field(body: object, param: str | None) -> None:
    with pytest.raises(APIError) as info:
        parse_messages_request(body)
    assert info.value.status == 400
    assert info.value.param == param


def test_images_keep_their_place_among_text_blocks() -> None:
    r = parse_messages_request(_user({"type": "text", "text": "a"}, IMAGE))
    assert [type(p) for p in r.messages[0].parts] == [TextPart, ImagePart]


@pytest.mark.parametrize(
    ("data", "media_type"),
    [
        (PNG_B64, "image/png"),
        ("/9j/4AAQSkZJRgABAQ==", "image/jpeg"),
        ("R0lGODlhAQABAIAAAP///w==", "image/gif"),
        ("UklGRiQAAABXRUJQVlA4IA==", "image/webp"),
        ("not really an image", "image/png"),  # left to the decoder, which names the problem
    ],
)
def test_an_image_whose_bytes_match_its_media_type_is_taken(data: str, media_type: str) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    chat = parse_messages_request(_user(image))
    assert isinstance(chat.messages[0].parts[0], ImagePart)


def test_an_error_names_its_field_in_the_message() -> None:
    """Invariant: Anthropic's error object has no `param`, so the field at fault leads the
    message when the message does not name it already (which of several images to fix); a
    data URI where bare base64 belongs says to drop the prefix."""
    from gateway.api.anthropic.render import error_body

    body = error_body(APIError(400, "could not decode image", param="messages[0].content[1]"))
    assert body["error"]["message"] == "`messages[0].content[1]`: could not decode image"
    named = error_body(APIError(400, "`max_tokens` must be >= 1", param="max_tokens"))
    assert named["error"]["message"] == "`max_tokens` must be >= 1"
    uri = {"type": "base64", "media_type": "image/png", "data": "data:image/png;base64,AA"}
    with pytest.raises(APIError, match="bare base64: remove the `data:...;base64,` prefix"):
        parse_messages_request(_user({"type": "image", "source": uri}))


USE = {"type": "tool_use", "id": "toolu_a", "name": "f", "input": {}}
CALL = {"role": "assistant", "content": [USE]}
OK = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a"}]}


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([CALL, {"role": "user", "content": "and?"}], "messages[2]"),
        ([CALL], "messages[1]"),
        ([CALL, OK, {"role": "assistant", "content": "ok"}, OK],
         "messages[4].content[0].tool_use_id"),
        ([CALL, {"role": "user", "content": [*OK["content"], *OK["content"]]}],
         "messages[2].content[1].tool_use_id"),
        ([CALL, {"role": "user", "content": [{"type": "text", "text": "x"}, *OK["content"]]}],
         "messages[2].content[1]"),
        ([{"role": "assistant", "content": [USE, USE]}], "messages[1].content[1].id"),
    ],
)  # fmt: skip
def test_a_tool_use_is_answered_in_the_next_message(messages: list, param: str) -> None:
    """Invariant: as on Anthropic's API, every tool_use block gets one tool_result in the next
    message, before its other content, a tool_result answers only the message just before
    it, and tool_use ids are unique: else a 400 naming the message, the block or the id; a
    complete exchange parses."""
    body = _with(messages=[{"role": "user", "content": "go"}, *messages])
    with pytest.raises(APIError) as info:
        parse_messages_request(body)
    assert info.value.param == param, info.value.message
    more = {"role": "user", "content": [*OK["content"], {"type": "text", "text": "so?"}]}
    done = [{"role": "user", "content": "go"}, CALL, more]
    assert parse_messages_request(_with(messages=done)).messages[-1].role == "user"


def test_unknown_fields_are_ignored_and_named() -> None:
    """Invariant: a field no table lists (a typo, a newer API's field) is accepted and named
    for the x-ignored-fields header, as the OpenAI parsers do; documented fields that change
    nothing (`metadata.user_id`, `speed`, `inference_geo`, ...) are accepted unnamed, other
    `metadata` keys named."""
    r = parse_messages_request(
        _with(n=2, max_token=3, speed="fast", inference_geo="us", metadata={"user_id": "u", "a": 1})
    )
    assert r.ignored_fields == ("max_token", "n", "metadata.a")
    assert parse_messages_request(BASE).ignored_fields == ()
