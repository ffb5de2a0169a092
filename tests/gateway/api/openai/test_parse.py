"""Request parsing: every field validated with a message naming it; valid requests become a
typed ChatRequest with OpenAI's defaults."""

from __future__ import annotations

import pytest

from gateway.api.openai.parse import parse_chat_request
from gateway.errors import APIError
from gateway.frontend.chat import ImagePart, TextPart

BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _with(**fields: object) -> dict:
    return {**BASE, **fields}


def _call(call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _history(*messages: dict) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "go"}, *messages]}


def test_defaults_follow_openai() -> None:
    r = parse_chat_request(BASE)
    assert r.temperature == 1.0 and r.top_p == 1.0 and r.max_tokens is None
    assert not r.stream and not r.logprobs and r.stop == ()


def test_content_parts_keep_their_order() -> None:
    content = [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
        {"type": "text", "text": "b"},
    ]
    r = parse_chat_request(_with(messages=[{"role": "user", "content": content}]))
    parts = r.messages[0].parts
    assert [type(p) for p in parts] == [TextPart, ImagePart, TextPart]
    assert parts[1].param == "messages[0].content[1].image_url.url"


def test_max_completion_tokens_wins_and_developer_is_system() -> None:
    r = parse_chat_request(
        _with(
            max_tokens=5, max_completion_tokens=7, messages=[{"role": "developer", "content": "x"}]
        )
    )
    assert r.max_tokens == 7 and r.messages[0].role == "system"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], None),
        ({"messages": BASE["messages"]}, "model"),
        (_with(messages=[]), "messages"),
        (_with(messages=[1]), "messages[0]"),
        (_with(messages=[{"role": "robot", "content": "x"}]), "messages[0].role"),
        (_with(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
        (
            _with(messages=[{"role": "user", "content": [{"type": "audio"}]}]),
            "messages[0].content[0].type",
        ),
        (
            _with(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]),
            "messages[0].content[0].text",
        ),
        (
            _with(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
            "messages[0].content[0].image_url.url",
        ),
        (
            _with(
                messages=[
                    {
                        "role": "assistant",
                        "content": [{"type": "image_url", "image_url": {"url": "x"}}],
                    }
                ]
            ),
            "messages[0].content[0]",
        ),
        (_with(max_tokens=0), "max_tokens"),
        (_with(max_tokens="7"), "max_tokens"),
        (_with(max_tokens=True), "max_tokens"),
        (_with(temperature=-1), "temperature"),
        (_with(temperature=float("nan")), "temperature"),
        (_with(top_p=0), "top_p"),
        (_with(top_p=1.5), "top_p"),
        (_with(stop=""), "stop"),
        (_with(stop=["a"] * 17), "stop"),
        (_with(stop=[1]), "stop"),
        (_with(n=0), "n"),
        (_with(n=129), "n"),
        (_with(seed="x"), "seed"),
        (_with(logprobs="yes"), "logprobs"),
        (_with(top_logprobs=3), "top_logprobs"),
        (_with(logprobs=True, top_logprobs=21), "top_logprobs"),
        (_with(stream=1), "stream"),
        (_with(stream=True, stream_options=[]), "stream_options"),
        (_with(stream_options={"include_usage": True}), "stream_options"),  # without stream
        (
            _with(
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "x.png", "detail": "bogus"}}
                        ],
                    }
                ]
            ),
            "messages[0].content[0].image_url.detail",
        ),  # fmt: skip
        (
            _with(
                messages=[
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}}]}
                ]
            ),
            "messages[0].content[0].image_url.url",
        ),  # fmt: skip
        (_with(presence_penalty=2.5), "presence_penalty"),
        (_with(frequency_penalty="x"), "frequency_penalty"),
        (_with(repetition_penalty=0), "repetition_penalty"),
        (_with(logit_bias=[1]), "logit_bias"),
        (_with(logit_bias={"x": 1}), "logit_bias.x"),
        (_with(logit_bias={"5": 101}), "logit_bias.5"),
        (_with(min_tokens=-1), "min_tokens"),
        (_with(max_tokens=3, min_tokens=4), "min_tokens"),
        (_with(audio={"voice": "alloy"}), "audio"),
        (_with(modalities=["text", "audio"]), "modalities"),
        (_with(min_p=0.1), "min_p"),
        (_with(tools=[{"type": "function"}]), "tools[0].function"),
        (
            _with(tools=[{"type": "function", "function": {"name": "f"}}] * 2),
            "tools[1].function.name",
        ),  # fmt: skip
        (
            _history({"role": "assistant", "tool_calls": [{**_call("a"), "type": "custom"}]}),
            "messages[1].tool_calls[0].type",
        ),  # fmt: skip
        (
            _history(
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "a",
                            "type": "function",
                            "function": {"name": "f", "arguments": {"x": 1}},
                        }
                    ],
                }
            ),
            "messages[1].tool_calls[0].function.arguments",
        ),  # fmt: skip
        (_with(tool_choice="auto"), "tool_choice"),
        (_with(response_format={"type": "xml"}), "response_format.type"),
    ],
)
def test_invalid_fields_name_the_field(body: object, param: str | None) -> None:
    with pytest.raises(APIError) as info:
        parse_chat_request(body)
    assert info.value.status == 400
    assert info.value.param == param
    assert info.value.message


def test_video_url_parts_keep_their_place_among_images() -> None:
    """Invariant: `video_url` parts become VideoParts in content order (prompt order), with the
    field path for errors; only user messages may carry them."""
    from gateway.frontend.chat import VideoPart

    content = [
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AA=="}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
        {"type": "text", "text": "q"},
        {"type": "video_url", "video_url": {"url": "https://example.com/b.mp4"}},
    ]
    r = parse_chat_request(_with(messages=[{"role": "user", "content": content}]))
    assert [type(p) for p in r.media] == [VideoPart, ImagePart, VideoPart]
    assert r.videos[1] == VideoPart(
        "https://example.com/b.mp4", "messages[0].content[3].video_url.url"
    )
    assert len(r.images) == 1
    for message, param in [
        ({"role": "assistant", "content": content[:1]}, "messages[0].content[0]"),
        ({"role": "user", "content": [{"type": "video_url", "video_url": {"url": 3}}]},
         "messages[0].content[0].video_url.url"),
        ({"role": "user", "content": [{"type": "video_url"}]},
         "messages[0].content[0].video_url.url"),
    ]:  # fmt: skip
        with pytest.raises(APIError) as caught:
            parse_chat_request(_with(messages=[message]))
        assert caught.value.status == 400 and caught.value.param == param


def test_an_integer_beyond_64_bits_gets_the_range_not_a_type_error() -> None:
    """Invariant: a seed too large for the JSON parser's integers (it arrives as a float) is
    refused with the allowed range, not with 'must be an integer'; a fraction still is."""
    for too_big in (float(2**64), 1e23):
        with pytest.raises(APIError) as caught:
            parse_chat_request(
                {"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": too_big}
            )
        assert caught.value.param == "seed" and "between" in caught.value.message
    with pytest.raises(APIError) as caught:
        parse_chat_request(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": 0.5}
        )
    assert caught.value.message == "`seed` must be an integer"


def test_shaping_fields_and_n_reach_the_request() -> None:
    """Invariant: penalties, logit_bias (sorted integer ids), min_tokens and n are typed
    into the ChatRequest; absent, they are the neutral defaults."""
    r = parse_chat_request(
        _with(
            presence_penalty=0.5,
            frequency_penalty=-1,
            repetition_penalty=1.3,
            logit_bias={"9": -100, "2": 5.5},
            min_tokens=3,
            max_tokens=10,
            n=4,
        )
    )
    assert (r.presence_penalty, r.frequency_penalty, r.repetition_penalty) == (0.5, -1.0, 1.3)
    assert r.logit_bias == ((2, 5.5), (9, -100.0)) and r.min_tokens == 3 and r.n == 4
    plain = parse_chat_request(BASE)
    assert (plain.presence_penalty, plain.frequency_penalty, plain.repetition_penalty) == (
        0.0,
        0.0,
        1.0,
    )
    assert plain.logit_bias == () and plain.min_tokens == 0 and plain.n == 1


CALLED = {"role": "assistant", "content": None, "tool_calls": [_call("a"), _call("b")]}


A1 = {"role": "tool", "tool_call_id": "a", "content": "1"}
B2 = {"role": "tool", "tool_call_id": "b", "content": "2"}
AND = {"role": "user", "content": "and?"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_history(CALLED, AND), "messages[1].tool_calls[0].id"),
        (_history(CALLED, A1, AND), "messages[1].tool_calls[1].id"),
        (_history(CALLED, A1), "messages[1].tool_calls[1].id"),
        (_history(CALLED, A1, A1), "messages[3].tool_call_id"),
        (_history(CALLED, A1, B2, AND, B2), "messages[5].tool_call_id"),
        (
            _history(CALLED, A1, B2, {**CALLED, "tool_calls": [_call("a")]}, A1),
            "messages[4].tool_calls[0].id",
        ),  # fmt: skip
    ],
)
def test_a_tool_history_follows_openais_rules(body: dict, param: str) -> None:
    """Invariant: as on OpenAI's API, every call of an assistant message is answered by one
    tool message before the next other message (or the end), a tool message answers an open
    call of the assistant message before it, and call ids are unique: else a 400 naming the
    unanswered call's id, the tool message or the duplicate id; a complete history parses."""
    with pytest.raises(APIError) as info:
        parse_chat_request(body)
    assert (info.value.status, info.value.param) == (400, param), info.value.message
    done = _history(CALLED, {"role": "tool", "tool_call_id": "b", "content": "2"},
                    {"role": "tool", "tool_call_id": "a", "content": "1"},
                    {"role": "user", "content": "and?"})  # fmt: skip
    assert len(parse_chat_request(done).messages) == 5


def test_hints_pass_and_outputs_this_server_cannot_make_are_refused() -> None:
    """Invariant (the field policy): hints and bookkeeping that change no answer here
    (predicted outputs, verbosity, store, metadata, prompt_cache_key) parse to the same
    request and are no unknown fields; asking for audio, an audio modality or a web search,
    which this server cannot do and whose absence the client would not see, is a 400 naming
    the field and saying what is missing."""
    hints = {
        "prediction": {"type": "content", "content": "def f(): pass"},
        "verbosity": "low",
        "store": True,
        "metadata": {"run": "1"},
        "prompt_cache_key": "session-1",
    }
    assert parse_chat_request(_with(**hints)) == parse_chat_request(_with())
    for name, value, says in (
        ("audio", {"voice": "alloy", "format": "wav"}, "audio"),
        ("modalities", ["text", "audio"], "audio"),
        ("web_search_options", {"search_context_size": "low"}, "search"),
    ):
        with pytest.raises(APIError) as info:
            parse_chat_request(_with(**{name: value}))
        assert info.value.param == name and says in info.value.message
