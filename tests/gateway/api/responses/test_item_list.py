"""A response's input items as listed: every accepted kind of `input` item becomes the
`openai` SDK's own `ResponseItem` shape, with a fresh unique id, the client's content as
sent."""

from __future__ import annotations

from typing import Any

from openai.types.responses import (
    ResponseCustomToolCallItem,
    ResponseCustomToolCallOutputItem,
    ResponseFunctionToolCallItem,
    ResponseFunctionToolCallOutputItem,
    ResponseInputAudio,
    ResponseInputMessageItem,
    ResponseOutputMessage,
    ResponseReasoningItem,
)

from gateway.api.responses.input_items import parse_input
from gateway.api.responses.item_list import input_item_list
from gateway.api.responses.sealed import ReasoningSeal
from gateway.api.responses.store import item_bytes

IMAGE = "data:image/png;base64,iVBORw0KGgo="
INPUT: list[dict[str, Any]] = [
    {"role": "developer", "content": "Be terse."},
    {
        "type": "message",
        "id": "msg_client",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": IMAGE, "detail": "low"},
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        ],
    },
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]},
    {"role": "assistant", "content": "A test."},
    {"type": "function_call", "call_id": "call_1", "name": "look", "arguments": "{}"},
    {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": [{"type": "input_image", "image_url": IMAGE}],
    },
    {"type": "custom_tool_call", "call_id": "call_2", "name": "sh", "input": "ls"},
    {"type": "custom_tool_call_output", "call_id": "call_2", "output": "a b"},
]
EXPECTED = [
    ResponseInputMessageItem,
    ResponseInputMessageItem,
    ResponseReasoningItem,
    ResponseOutputMessage,
    ResponseFunctionToolCallItem,
    ResponseFunctionToolCallOutputItem,
    ResponseCustomToolCallItem,
    ResponseCustomToolCallOutputItem,
]


def test_every_kind_is_an_sdk_response_item() -> None:
    """Invariant: each item the parser accepts lists as the SDK's ResponseItem variant of
    its kind (validated by that SDK model), in input order. An input_audio part is the
    SDK's ResponseInputAudio, which its listed message content does not name (an extension
    the SDK's lenient parsing keeps)."""
    parse_input(INPUT)  # the listing is built only from an accepted input
    items = [dict(i) for i in input_item_list(INPUT)]
    audio = items[1]["content"].pop()
    ResponseInputAudio.model_validate(audio)
    for model, item in zip(EXPECTED, items, strict=True):
        model.model_validate(item)


def test_content_is_kept_as_sent() -> None:
    """Invariant: texts, the image's URL (a data URI whole) and detail, the audio, the
    calls and outputs are the client's; the developer role stays `developer`."""
    items = input_item_list(INPUT)
    assert items[0]["role"] == "developer"
    assert items[0]["content"] == [{"type": "input_text", "text": "Be terse."}]
    image = items[1]["content"][1]
    assert image == {"type": "input_image", "image_url": IMAGE, "detail": "low", "file_id": None}
    assert items[1]["content"][2]["input_audio"] == {"data": "UklGRg==", "format": "wav"}
    assert items[3]["content"] == [{"type": "output_text", "text": "A test.", "annotations": []}]
    assert items[4]["arguments"] == "{}" and items[4]["name"] == "look"
    assert items[5]["output"][0]["image_url"] == IMAGE
    assert items[5]["output"][0]["detail"] == "auto"
    assert items[6]["input"] == "ls" and items[7]["output"] == "a b"


def test_ids_are_fresh_unique_and_typed() -> None:
    """Invariant: every item gets a new id with its kind's prefix (the client's `id` is not
    kept: it could repeat one), and two listings of the same input never share an id."""
    first, second = input_item_list(INPUT), input_item_list(INPUT)
    ids = [i["id"] for i in first]
    assert len(set(ids)) == len(ids) and "msg_client" not in ids
    prefixes = ["msg_", "msg_", "rs_", "msg_", "fc_", "fco_", "ctc_", "ctco_"]
    assert all(i.startswith(p) for i, p in zip(ids, prefixes, strict=True))
    assert not set(ids) & {i["id"] for i in second}


def test_string_input_is_one_user_message() -> None:
    """Invariant: `input: "text"` lists as one user message of one input_text part."""
    (item,) = input_item_list("Hello")
    assert item["role"] == "user" and item["type"] == "message"
    assert item["content"] == [{"type": "input_text", "text": "Hello"}]


def test_only_the_sdks_string_fields_are_kept() -> None:
    """Invariant: what the parser does not read (a reasoning item's parts beside its
    `encrypted_content`, extra keys, a huge integer) never reaches the stored item: only the
    SDK's string fields, so its JSON size can always be measured."""
    seal = ReasoningSeal.for_folder(None, False)
    junk = {"type": "summary_text", "text": "s", "n": 10**30}
    raw = [
        {"type": "reasoning", "encrypted_content": seal.seal("t"), "summary": [junk, 5]},
        {"type": "reasoning", "encrypted_content": seal.seal("u"), "summary": "not a list"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": [{"type": "audio_url", "audio_url": {"url": "a.wav", "x": 1}}]},
    ]
    parse_input(raw, seal)
    first, second, _, audio = input_item_list(raw)
    assert first["summary"] == [{"type": "summary_text", "text": "s"}]
    assert second["summary"] == [] and second["content"] is None
    assert audio["content"] == [{"type": "audio_url", "audio_url": {"url": "a.wav"}}]
    assert all(item_bytes(i) > 0 for i in (first, second, audio))
