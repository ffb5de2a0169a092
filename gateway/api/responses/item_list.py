"""A response's input items as `GET /v1/responses/{id}/input_items` lists them (pure).

The input items of a response are every item the model was given to make it, oldest first,
in the shapes of the `openai` SDK's `ResponseItem` union: with a `previous_response_id`, the
previous response's input items, then the previous response's output items (as its body has
them, ids included), then this request's `input`. So the listing of a turn is the whole
conversation before its output, as OpenAI lists it; `instructions` are not an item (they are
not carried over `previous_response_id` either).

Each item of `input` is given an id here, once, when the response is created: `msg_`,
`fc_`, `ctc_`, `fco_`, `ctco_` or `rs_` and 32 random hex digits. An `id` the client sent on
an item is not kept (Codex sends ids on the items it resends, and nothing makes a client's
ids unique: two items sharing one would make `after` ambiguous). A continuation reuses the
earlier items' objects, so every listing of every response of a conversation names an item
by the same id.

What the client sent is kept as sent, in the SDK's field names: message text parts,
`input_image` (`image_url` as sent, `detail` as sent or `auto`), `input_audio`,
`audio_url`, tool calls and their outputs, reasoning items (`summary`, `content` and
`encrypted_content`): strings only, each in the field the SDK reads (extra keys a client
put on an item or part are not kept). What a listing shows of them is gateway.api.
responses.item_page's. Built from an `input` that gateway.api.responses.input_items has
already accepted.
"""

from __future__ import annotations

import uuid
from typing import Any

from gateway.api.responses.input_items import CALLS, OUTPUTS

Item = dict[str, Any]

PREFIXES = {
    "message": "msg_",
    "function_call": "fc_",
    "custom_tool_call": "ctc_",
    "function_call_output": "fco_",
    "custom_tool_call_output": "ctco_",
    "reasoning": "rs_",
}
COMPLETED = "completed"
DETAILS = ("auto", "low", "high", "original")


def new_id(kind: str) -> str:
    return PREFIXES[kind] + uuid.uuid4().hex


def input_item_list(raw: Any) -> tuple[Item, ...]:
    """The items of a body's `input` (a string: one user message), each with its new id."""
    if isinstance(raw, str):
        return (_message({"role": "user", "content": raw}),)
    return tuple(_item(item) for item in raw)


def _item(item: dict[str, Any]) -> Item:
    kind = item.get("type", "message")
    if kind in CALLS:
        return _call(item, kind)
    if kind in OUTPUTS:
        output = item["output"]
        listed = output if isinstance(output, str) else [_part(p, "tool") for p in output]
        return {
            "type": kind,
            "id": new_id(kind),
            "call_id": item["call_id"],
            "output": listed,
            "status": COMPLETED,
        }
    if kind == "reasoning":
        blob = item.get("encrypted_content")
        return {
            "type": "reasoning",
            "id": new_id(kind),
            "summary": _texts(item.get("summary"), "summary_text"),
            "content": _texts(item.get("content"), "reasoning_text") or None,
            "encrypted_content": blob if isinstance(blob, str) else None,
            "status": COMPLETED,
        }
    return _message(item)


def _texts(parts: Any, kind: str) -> list[Item]:
    """A reasoning item's `summary` or `content` parts as the SDK's: their texts. (With an
    `encrypted_content` the parser reads neither, so they may be anything: only text parts
    are kept, and nothing but strings ever reaches the store's JSON size.)"""
    if not isinstance(parts, list):
        return []
    return [
        {"type": kind, "text": p["text"]}
        for p in parts
        if isinstance(p, dict) and isinstance(p.get("text"), str)
    ]


def _call(item: dict[str, Any], kind: str) -> Item:
    listed: Item = {"type": kind, "id": new_id(kind), "call_id": item["call_id"]}
    listed["name"] = item["name"]
    if kind == "custom_tool_call":
        listed["input"] = item["input"]
    else:
        listed["arguments"] = item["arguments"]
    if item.get("namespace") is not None:
        listed["namespace"] = item["namespace"]
    listed["status"] = COMPLETED
    return listed


def _message(item: dict[str, Any]) -> Item:
    """An input message (`ResponseInputMessageItem`: user, system or developer, its role as
    sent) or an assistant one (`ResponseOutputMessage`: its text as `output_text` parts)."""
    role, content = item["role"], item["content"]
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    listed = [_part(p, role) for p in parts]
    return {
        "type": "message",
        "id": new_id("message"),
        "role": role,
        "content": listed,
        "status": COMPLETED,
    }


def _part(part: dict[str, Any], role: str) -> Item:
    kind = part["type"]
    if kind in ("input_text", "output_text", "text"):
        if role == "assistant":
            return {"type": "output_text", "text": part["text"], "annotations": []}
        return {"type": "input_text", "text": part["text"]}
    if kind == "input_image":
        return {
            "type": "input_image",
            "image_url": part["image_url"],
            "detail": part.get("detail") if part.get("detail") in DETAILS else "auto",
            "file_id": None,
        }
    if kind == "input_audio":
        audio = part["input_audio"]
        return {
            "type": "input_audio",
            "input_audio": {"data": audio["data"], "format": audio["format"]},
        }
    value = part[kind]  # audio_url (vLLM's part): its URL, as sent
    return {"type": kind, kind: {"url": value.get("url") if isinstance(value, dict) else value}}
