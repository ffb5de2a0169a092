"""Stored Responses-API conversations: bounded, owner-scoped, in memory.

A stored response keeps what a continuation (`previous_response_id`) needs to rebuild the
whole conversation without the client resending it: the messages so far (its input, its
output and everything before it), with every image held by content hash, and the decoded
image itself in a pool shared by all the responses that mention it. So a five-turn
conversation about one picture holds the picture once, and a continuation never reads,
decodes or hashes it again; when the image's KV or features are still cached the engine
needs no pixels at all, and when they have been evicted the kept pixels are encoded again.
It also keeps the response's input items as `GET /v1/responses/{id}/input_items` lists them
(gateway.api.responses.item_list: the client's items as sent, images' URLs included), each
item pooled by its id: a continuation's items are the earlier ones' own objects, so a
conversation's items are counted once however many of its responses list them.

Bounds (`ResponsesConfig`): at most `max_stored` responses and `max_mb` (their texts,
rendered bodies, the pooled input items at their JSON size and the pooled images at 3 bytes
per pixel), least recently used first out;
entries older than `ttl_s` are gone. Nothing survives a restart (there is no disk tier yet).

Owned by the event loop thread (no locks): every method is called from it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.config import ResponsesConfig
from gateway.frontend.chat import AudioPart, ChatMessage, ImagePart, TextPart
from gateway.media import DecodedImage


@dataclass(frozen=True)
class HeldImage(ImagePart):
    """An image of a stored conversation, by the content hash of its decoded pixels (its
    source is not fetched again: the pool of the store holds the decoded image)."""

    content_hash: str = ""


@dataclass
class StoredResponse:
    """One response as GET returns it (`body`), plus the conversation it ends (`messages`:
    every turn up to and including its own output, instructions excluded) and its input
    items as listed (`items`: every item before its output, oldest first, each with a
    unique `id`)."""

    response_id: str
    owner: str
    body: dict[str, Any]
    messages: tuple[ChatMessage, ...]
    items: tuple[dict[str, Any], ...] = ()
    created: float = field(default_factory=time.monotonic)

    @property
    def image_hashes(self) -> set[str]:
        return {p.content_hash for m in self.messages for p in m.parts if isinstance(p, HeldImage)}

    def text_bytes(self) -> int:
        """Estimated bytes of the texts (UTF-8) and the rendered body (its output text)."""
        size = 512
        for message in self.messages:
            for part in message.parts:
                # An audio part keeps its reference (a data URI's text) for the continuation.
                size += len(part.text.encode("utf-8")) if isinstance(part, TextPart) else 64
                size += len(part.url) if isinstance(part, AudioPart) else 0
        return size + sum(len(str(v)) for v in self.body.values())


def image_bytes(image: DecodedImage) -> int:
    return image.width * image.height * 3


def item_bytes(item: dict[str, Any]) -> int:
    """An input item's size: its JSON (a data URI it keeps counts whole)."""
    return len(orjson.dumps(item))


class ResponseStore:
    """LRU of response id -> StoredResponse plus refcounted pools of their images and of
    their input items' sizes."""

    def __init__(
        self, config: ResponsesConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._images: dict[str, tuple[DecodedImage, int]] = {}  # hash -> (image, references)
        self._items: dict[str, tuple[int, int]] = {}  # item id -> (bytes, references)
        self._bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, entry: StoredResponse, images: dict[str, DecodedImage]) -> bool:
        """Store `entry` (its images taken from the pool or `images`); returns False when it
        alone is over the byte bound (it is not stored). Evicts LRU entries to fit."""
        self._expire()
        if self.config.max_stored == 0:
            return False
        self.delete(entry.response_id, entry.owner)
        new_images = {h: images[h] for h in entry.image_hashes if h not in self._images}
        new_items = {i["id"]: item_bytes(i) for i in entry.items if i["id"] not in self._items}
        size = entry.text_bytes()
        added = size + sum(map(image_bytes, new_images.values())) + sum(new_items.values())
        if added > self.config.max_bytes:
            return False
        entry.created = self._clock()
        for item in entry.items:
            bytes_, refs = self._items.get(item["id"]) or (new_items[item["id"]], 0)
            if refs == 0:
                self._bytes += bytes_
            self._items[item["id"]] = (bytes_, refs + 1)
        for content_hash in entry.image_hashes:
            image, refs = self._images.get(content_hash) or (new_images[content_hash], 0)
            if refs == 0:
                self._bytes += image_bytes(image)
            self._images[content_hash] = (image, refs + 1)
        self._entries[entry.response_id] = entry
        self._sizes[entry.response_id] = size
        self._bytes += size
        while self._entries and (
            len(self._entries) > self.config.max_stored or self._bytes > self.config.max_bytes
        ):
            self._drop(next(iter(self._entries)))
            self.evictions += 1
        return entry.response_id in self._entries

    def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The entry if it exists, has not expired and belongs to `owner` (another owner's
        entry looks exactly like a missing one); touches it."""
        self._expire()
        entry = self._entries.get(response_id)
        if entry is None or entry.owner != owner:
            return None
        self._entries.move_to_end(response_id)
        return entry

    def image(self, content_hash: str) -> DecodedImage | None:
        held = self._images.get(content_hash)
        return None if held is None else held[0]

    def delete(self, response_id: str, owner: str) -> bool:
        entry = self._entries.get(response_id)
        if entry is None or entry.owner != owner:
            return False
        self._drop(response_id)
        return True

    def _drop(self, response_id: str) -> None:
        entry = self._entries.pop(response_id)
        self._bytes -= self._sizes.pop(response_id)
        for content_hash in entry.image_hashes:
            image, refs = self._images[content_hash]
            if refs == 1:
                del self._images[content_hash]
                self._bytes -= image_bytes(image)
            else:
                self._images[content_hash] = (image, refs - 1)
        for item in entry.items:
            bytes_, refs = self._items[item["id"]]
            if refs == 1:
                del self._items[item["id"]]
                self._bytes -= bytes_
            else:
                self._items[item["id"]] = (bytes_, refs - 1)

    def _expire(self) -> None:
        if self.config.ttl_s <= 0:
            return
        deadline = self._clock() - self.config.ttl_s
        # Insertion order is not creation order after a touch, so scan; the store is small
        # (bounded by max_entries) and this runs once per request.
        for response_id in [k for k, e in self._entries.items() if e.created < deadline]:
            self._drop(response_id)

    def stats(self) -> dict[str, int]:
        return {
            "entries": len(self._entries),
            "bytes": self._bytes,
            "images": len(self._images),
            "items": len(self._items),
            "evictions": self.evictions,
        }
