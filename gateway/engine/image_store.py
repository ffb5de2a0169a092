"""Decoded images the engine process already holds, mirrored in the HTTP process, so a
repeated image crosses the pipe once.

A warm turn of a conversation re-sends its image with every request; pickling a 1024x1024 RGB
image and pushing 3 MB through the pipe cost most of the split's admission round trip
(8-17 ms for image turns against ~1.4 ms for text). The engine process keeps the last images
it received (an LRU by content hash and byte budget); the HTTP process keeps the same LRU of
hashes and sizes only and omits the pixels of any image the engine holds. Both sides apply the
same operations in the same order (the pipe preserves order and each side handles submits one
at a time), so the two LRUs never disagree: an omitted image is always there when the engine
looks for it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from typing import Any

from gateway.engine.request import EngineRequest

DEFAULT_BUDGET_BYTES = 256 * 2**20


class ImageStore:
    """LRU of content hash -> decoded image (or only its size, `keep_images=False`).
    Not thread-safe: one owner calls `outgoing` or `incoming`, in submit order."""

    def __init__(self, keep_images: bool, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self._keep = keep_images
        self._budget = budget_bytes
        self._entries: OrderedDict[str, tuple[int, Any]] = OrderedDict()
        self._bytes = 0

    def _size(self, image: Any) -> int:
        nbytes = getattr(image, "nbytes", None)  # a video's frames (VideoFrames)
        return int(nbytes) if nbytes is not None else int(image.width) * int(image.height) * 3

    def _record(self, content_hash: str, image: Any) -> bool:
        """Touch or insert; returns True if the hash was already held."""
        if content_hash in self._entries:
            self._entries.move_to_end(content_hash)
            return True
        size = self._size(image)
        self._entries[content_hash] = (size, image if self._keep else None)
        self._bytes += size
        while self._bytes > self._budget and len(self._entries) > 1:
            _, (dropped, _) = self._entries.popitem(last=False)
            self._bytes -= dropped
        return False

    def outgoing(self, request: EngineRequest) -> EngineRequest:
        """HTTP side: the request with the pixels of images the engine holds left out."""
        if not request.images:
            return request
        images = tuple(
            replace(i, image=None)
            if i.image is not None and self._record(i.content_hash, i.image)
            else i
            for i in request.images
        )
        return replace(request, images=images)

    def incoming(self, request: EngineRequest) -> EngineRequest:
        """Engine side: the request with every left-out image restored."""
        if not request.images:
            return request
        images = []
        for i in request.images:
            if i.image is None:
                entry = self._entries.get(i.content_hash)
                if entry is not None:  # (the mirrors agree by construction; a request that
                    # arrives without pixels anyway fails later only if the tower needs them)
                    self._entries.move_to_end(i.content_hash)
                    i = replace(i, image=entry[1])
                images.append(i)
            else:
                self._record(i.content_hash, i.image)
                images.append(i)
        return replace(request, images=tuple(images))
