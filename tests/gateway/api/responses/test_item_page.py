"""A page of input items: `limit`/`order`/`after` walk every item exactly once in either
order, `include` shows image URLs and encrypted reasoning only when asked, and each bad
query value is a 400 naming its parameter."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.api.responses.item_page import ItemQuery, item_page, parse_item_query
from gateway.errors import APIError

URL = "data:image/png;base64,AAAA"


def _items(n: int) -> list[dict[str, Any]]:
    return [
        {"type": "message", "id": f"msg_{i}", "role": "user", "content": [], "status": "completed"}
        for i in range(n)
    ]


@pytest.mark.parametrize("order", ["asc", "desc"])
@pytest.mark.parametrize("limit", [1, 2, 3, 7, 100])
def test_pages_walk_every_item_once(order: str, limit: int) -> None:
    """Invariant: following `after` = the last id while `has_more` yields every item once,
    oldest first for asc and newest first for desc; first_id / last_id are the page's ends."""
    items, seen, after = _items(7), [], None
    while True:
        page = item_page(items, ItemQuery(limit=limit, order=order, after=after))
        ids = [i["id"] for i in page["data"]]
        assert len(ids) <= limit and page["object"] == "list"
        assert (page["first_id"], page["last_id"]) == (ids[0], ids[-1])
        seen += ids
        if not page["has_more"]:
            break
        after = page["last_id"]
    expected = [f"msg_{i}" for i in range(7)]
    assert seen == (expected if order == "asc" else expected[::-1])


def test_after_the_last_item_is_an_empty_page() -> None:
    """Invariant: an empty page has no first or last id and no more items."""
    page = item_page(_items(2), ItemQuery(order="asc", after="msg_1"))
    assert page == {"object": "list", "data": [], "first_id": None, "last_id": None,
                    "has_more": False}  # fmt: skip


def test_include_shows_image_urls_and_encrypted_reasoning() -> None:
    """Invariant: without `message.input_image.image_url` every input_image's URL (in a
    message or a tool output) is null, with it the URL as sent; `encrypted_content` likewise
    under `reasoning.encrypted_content`; the stored items are never changed."""
    image = {"type": "input_image", "image_url": URL, "detail": "auto", "file_id": None}
    items = [
        {"type": "message", "id": "msg_a", "role": "user", "content": [image]},
        {"type": "function_call_output", "id": "fco_a", "call_id": "c", "output": [image]},
        {"type": "reasoning", "id": "rs_a", "summary": [], "encrypted_content": "blob"},
    ]
    bare = item_page(items, ItemQuery(order="asc"))["data"]
    assert bare[0]["content"][0]["image_url"] is None
    assert bare[1]["output"][0]["image_url"] is None
    assert bare[2]["encrypted_content"] is None
    full = {"message.input_image.image_url", "reasoning.encrypted_content"}
    shown = item_page(items, ItemQuery(order="asc", include=frozenset(full)))["data"]
    assert shown[0]["content"][0]["image_url"] == URL
    assert shown[1]["output"][0]["image_url"] == URL
    assert shown[2]["encrypted_content"] == "blob"
    assert image["image_url"] == URL and items[2]["encrypted_content"] == "blob"


def test_query_defaults_and_sdk_spelling() -> None:
    """Invariant: defaults are limit 20, order desc, no cursor; the SDK's `include[]` and a
    plain `include` are both read; the last of a repeated parameter wins."""
    assert parse_item_query([]) == ItemQuery(20, "desc", None, frozenset())
    query = parse_item_query(
        [
            ("limit", "5"),
            ("limit", "100"),
            ("order", "asc"),
            ("after", "msg_1"),
            ("include[]", "message.input_image.image_url"),
            ("include", "reasoning.encrypted_content"),
            ("before", "ignored"),
        ]
    )
    assert query == ItemQuery(
        100,
        "asc",
        "msg_1",
        frozenset({"message.input_image.image_url", "reasoning.encrypted_content"}),
    )


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ([("limit", "0")], "limit"),
        ([("limit", "101")], "limit"),
        ([("limit", "ten")], "limit"),
        ([("limit", "2.5")], "limit"),
        ([("order", "newest")], "order"),
        ([("include[]", "message.input_image")], "include"),
    ],
)
def test_bad_query_values_are_400s_naming_them(params: list[tuple[str, str]], param: str) -> None:
    """Invariant: each bad value is a 400 whose `param` is the query parameter."""
    with pytest.raises(APIError) as info:
        parse_item_query(params)
    assert info.value.status == 400 and info.value.param == param


def test_unknown_after_is_a_400_naming_after() -> None:
    """Invariant: a cursor that is no item of the response cannot be placed: 400 `after`."""
    with pytest.raises(APIError) as info:
        item_page(_items(3), ItemQuery(after="msg_9"))
    assert info.value.status == 400 and info.value.param == "after"
