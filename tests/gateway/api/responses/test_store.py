"""The Responses API's store of conversations: bounded by count, bytes and age, LRU, scoped
to an owner, images pooled by content hash, input items pooled by id."""

from __future__ import annotations

from PIL import Image
from support import decoded, noise_image

from gateway.api.responses.store import (
    HeldImage,
    ResponseStore,
    StoredResponse,
    image_bytes,
    item_bytes,
)
from gateway.config import ResponsesConfig
from gateway.frontend.chat import ChatMessage, TextPart


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _entry(
    rid: str, owner: str = "", text: str = "hi", hashes: tuple[str, ...] = ()
) -> StoredResponse:
    parts = (*(HeldImage("", "p", h) for h in hashes), TextPart(text))
    messages = (ChatMessage("user", parts), ChatMessage("assistant", (TextPart("ok"),)))
    return StoredResponse(rid, owner, {"id": rid, "status": "completed"}, messages)


def _store(**kw: float) -> tuple[ResponseStore, Clock]:
    clock = Clock()
    return ResponseStore(ResponsesConfig(**kw), clock), clock  # type: ignore[arg-type]


def test_count_bound_evicts_least_recently_used() -> None:
    """Invariant: at most max_stored entries; a `get` refreshes an entry, so the oldest
    untouched one goes first."""
    store, _ = _store(max_stored=2)
    store.put(_entry("a"), {})
    store.put(_entry("b"), {})
    assert store.get("a", "") is not None
    store.put(_entry("c"), {})
    assert len(store) == 2 and store.get("b", "") is None
    assert store.get("a", "") is not None and store.get("c", "") is not None
    assert store.evictions == 1


def test_byte_bound_counts_pooled_images_once() -> None:
    """Invariant: bytes = texts + each distinct image once (3 bytes/pixel), shared by every
    response of the conversation; the image leaves the pool with its last response."""
    image = decoded(noise_image(1, 32, 32))
    store, _ = _store(max_mb=1)
    images = {image.content_hash: image}
    store.put(_entry("a", hashes=(image.content_hash,)), images)
    one = store.bytes
    store.put(_entry("b", hashes=(image.content_hash,)), images)
    assert store.stats()["images"] == 1
    assert store.bytes < 2 * one and store.bytes > one
    assert store.image(image.content_hash) is image
    store.delete("a", "")
    assert store.image(image.content_hash) is image
    store.delete("b", "")
    assert store.image(image.content_hash) is None and store.bytes == 0


def _item(item_id: str, url: str) -> dict:
    image = {"type": "input_image", "image_url": url, "detail": "auto", "file_id": None}
    return {"type": "message", "id": item_id, "role": "user", "content": [image]}


def test_input_items_counted_once_across_a_conversation() -> None:
    """Invariant: an input item (a data URI kept whole) counts its JSON bytes once however
    many responses of its conversation list it, and leaves the count with the last one."""
    store, _ = _store(max_mb=1)
    store.put(_entry("x"), {})  # an id as long as "a" and "b"
    bare = store.bytes
    store.delete("x", "")
    photo = _item("msg_1", "data:image/png;base64," + "A" * 100_000)
    first = _entry("a")
    first.items = (photo,)
    store.put(first, {})
    assert store.bytes == bare + item_bytes(photo) and item_bytes(photo) > 100_000
    later = _entry("b")
    later.items = (photo, _item("msg_2", "https://example.com/x.png"))
    store.put(later, {})
    assert store.bytes == 2 * bare + item_bytes(photo) + item_bytes(later.items[1])
    store.delete("a", "")
    assert store.bytes == bare + sum(map(item_bytes, later.items))
    store.delete("b", "")
    assert store.bytes == 0 and store.stats()["items"] == 0


def test_items_count_against_the_byte_bound() -> None:
    """Invariant: an entry whose items alone exceed the budget is not stored."""
    store, _ = _store(max_mb=0.1)
    entry = _entry("a")
    entry.items = (_item("msg_1", "data:image/png;base64," + "A" * 200_000),)
    assert not store.put(entry, {}) and store.bytes == 0 and len(store) == 0


def test_byte_bound_evicts_and_refuses_oversized() -> None:
    """Invariant: the store never holds more than max bytes; an entry larger than the
    whole budget is not stored, and evicting to fit drops the oldest first."""
    big = decoded(noise_image(2, 300, 300))  # 270 kB
    store, _ = _store(max_mb=0.5)
    store.put(_entry("a", hashes=(big.content_hash,)), {big.content_hash: big})
    other = decoded(Image.new("RGB", (300, 300), (1, 2, 3)))
    assert store.put(_entry("b", hashes=(other.content_hash,)), {other.content_hash: other})
    assert store.get("a", "") is None and store.bytes <= 0.5 * 2**20
    huge = decoded(noise_image(3, 500, 500))
    assert image_bytes(huge) > 0.5 * 2**20
    assert not store.put(_entry("c", hashes=(huge.content_hash,)), {huge.content_hash: huge})
    assert store.get("b", "") is not None and store.get("c", "") is None


def test_ttl_expires_entries() -> None:
    """Invariant: an entry older than ttl_s is gone (as if never stored); ttl 0 keeps it."""
    store, clock = _store(ttl_s=60)
    store.put(_entry("a"), {})
    clock.now += 59
    assert store.get("a", "") is not None
    clock.now += 2
    assert store.get("a", "") is None and len(store) == 0
    forever, clock = _store(ttl_s=0)
    forever.put(_entry("a"), {})
    clock.now += 1e9
    assert forever.get("a", "") is not None


def test_owner_scoping() -> None:
    """Invariant: another owner can neither read nor delete an entry (it looks missing)."""
    store, _ = _store()
    store.put(_entry("a", owner="k1"), {})
    assert store.get("a", "k2") is None and not store.delete("a", "k2")
    assert store.get("a", "k1") is not None and store.delete("a", "k1")


def test_zero_capacity_stores_nothing() -> None:
    """Invariant: --responses-max-stored 0 keeps nothing."""
    store, _ = _store(max_stored=0)
    assert not store.put(_entry("a"), {}) and len(store) == 0
