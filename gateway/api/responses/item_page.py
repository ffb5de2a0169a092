"""One page of a response's input items: the query of `GET /v1/responses/{id}/input_items`
and the list object it answers (pure).

    ?limit=1..100 (20) &order=asc|desc (desc) &after=<item id> &include[]=<value>...

`desc` lists the newest item first. `after` names an item of this listing: the page starts
with the item after it in the order asked; an id that is not one of the response's items is
a 400 naming `after` (OpenAI's cursor is an item id, and an unknown one cannot be placed).
The answer is `{"object": "list", "data", "first_id", "last_id", "has_more"}`, the ids those
of the page's first and last items (null for an empty page).

`include` (the `openai` SDK sends `include[]=...`; `include=...` is taken too) is the
Responses API's includable list: `message.input_image.image_url` shows each `input_image`
part's `image_url` as the client sent it (a data URI whole), null without it, as OpenAI
answers; `reasoning.encrypted_content` shows reasoning items' `encrypted_content` (null
without it). The other values are about built-in tools' items, which this server never
makes, and change nothing. Any other value is a 400 naming `include`, a bad `limit` or
`order` a 400 naming it. Unknown query parameters are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.errors import invalid

Item = dict[str, Any]

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
ORDERS = ("asc", "desc")
IMAGE_URL = "message.input_image.image_url"
ENCRYPTED = "reasoning.encrypted_content"
INCLUDABLE = (
    IMAGE_URL,
    ENCRYPTED,
    "message.output_text.logprobs",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
)
_INTEGER = re.compile(r"[+-]?[0-9]{1,6}")


@dataclass(frozen=True)
class ItemQuery:
    """The validated query of one listing."""

    limit: int = DEFAULT_LIMIT
    order: str = "desc"
    after: str | None = None
    include: frozenset[str] = frozenset()


def parse_item_query(params: Sequence[tuple[str, str]]) -> ItemQuery:
    """The query string's (name, value) pairs, in order (a repeated `limit`, `order` or
    `after`: the last one) -> an ItemQuery; a 400 naming the parameter for a bad value."""
    last: dict[str, str] = {}
    include: list[str] = []
    for name, value in params:
        if name in ("include", "include[]"):
            include.append(value)
        else:
            last[name] = value
    return ItemQuery(
        limit=_limit(last.get("limit")),
        order=_order(last.get("order")),
        after=last.get("after") or None,
        include=_include(include),
    )


def _limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    if not _INTEGER.fullmatch(raw) or not 1 <= int(raw) <= MAX_LIMIT:
        raise invalid(f"`limit` must be an integer from 1 to {MAX_LIMIT}", "limit")
    return int(raw)


def _order(raw: str | None) -> str:
    if raw is None:
        return "desc"
    if raw not in ORDERS:
        raise invalid("`order` must be 'asc' or 'desc'", "order")
    return raw


def _include(values: list[str]) -> frozenset[str]:
    for value in values:
        if value not in INCLUDABLE:
            raise invalid(
                f"`include` value {value[:80]!r} is not one of the Responses API's "
                f"includable values: {', '.join(INCLUDABLE)}",
                "include",
            )
    return frozenset(values)


def item_page(items: Sequence[Item], query: ItemQuery) -> dict[str, Any]:
    """The list object of `items` (the stored ones, oldest first; not modified) under
    `query`: at most `limit` items after `after` in `order`, each as `include` shows it."""
    ordered = list(items) if query.order == "asc" else list(reversed(items))
    start = 0
    if query.after is not None:
        at = next((i for i, item in enumerate(ordered) if item["id"] == query.after), None)
        if at is None:
            raise invalid(
                f"`after` {query.after[:80]!r} is not the id of an input item of this response",
                "after",
            )
        start = at + 1
    data = [_shown(item, query.include) for item in ordered[start : start + query.limit]]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + query.limit < len(ordered),
    }


def _shown(item: Item, include: frozenset[str]) -> Item:
    """`item` as the listing shows it under `include` (a copy where anything is hidden)."""
    if item["type"] == "reasoning" and ENCRYPTED not in include:
        return {**item, "encrypted_content": None}
    if IMAGE_URL in include:
        return item
    if item["type"] == "message" and item["role"] != "assistant":
        return {**item, "content": [_no_url(p) for p in item["content"]]}
    if item["type"] in ("function_call_output", "custom_tool_call_output") and isinstance(
        item["output"], list
    ):
        return {**item, "output": [_no_url(p) for p in item["output"]]}
    return item


def _no_url(part: Item) -> Item:
    return {**part, "image_url": None} if part["type"] == "input_image" else part
