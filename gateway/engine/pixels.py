"""Pixel preparation: the one owner of image preprocessing before a request reaches the
engine thread.

The prompt side (the HTTP process's `PromptBuilder`) sends decoded images and their layouts,
never pixel values. `Engine.submit` hands each request here: a small pool of worker threads
asks the engine's caches which images the tower will run on (`needs_pixels`: neither covered
by a prefix-cache hit nor in the vision cache), preprocesses only those (numpy and Pillow,
mostly outside the GIL) and forwards the request to the engine thread's inbox. Requests are
forwarded in arrival order. The engine thread still preprocesses an image itself when a cache
entry counted on here is evicted before admission (`scheduler/encode_group.py`), so a wrong
guess here costs time, never an answer.

Thread contract: `submit`, `cancel` and `close` run on any thread; the callbacks run on a
worker thread (or the caller's, for a request with nothing to prepare and nothing ahead of
it). A preprocessing failure is logged and the request forwarded unprepared: the engine's
own attempt fails that request alone, through its normal failure path.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from caches.prefix import ImageSpan
from gateway.engine.request import EngineRequest, Sink

log = logging.getLogger(__name__)

NeedsPixels = Callable[[Sequence[int], Sequence[ImageSpan]], list[bool]]


class PixelPreparer:
    """Prepares the pixels of the images the engine will encode, then forwards requests in
    arrival order. See the module doc."""

    def __init__(
        self,
        needs_pixels: NeedsPixels,
        preprocess: Callable[[Any], Any],
        forward: Callable[[EngineRequest, Sink], None],
        cancel: Callable[[str], None],
        workers: int = 4,
    ) -> None:
        """`preprocess(image)` gives an image's pixel values; `forward` puts a prepared
        request in the engine's inbox (never blocks); `cancel` cancels one there."""
        self._needs_pixels = needs_pixels
        self._preprocess = preprocess
        self._forward = forward
        self._cancel = cancel
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pixels")
        self._lock = threading.Lock()  # the sets below, and forwarding (ordered with cancel)
        self._preparing: set[str] = set()  # submitted here, not yet forwarded
        self._cancelled: set[str] = set()  # cancelled while preparing
        self._previous: Future[None] | None = None  # the last request's task
        self._closed = False

    def submit(self, request: EngineRequest, sink: Sink) -> None:
        """Prepare `request` (in the pool when it has images, or when a request ahead of it
        is still being prepared) and forward it after every request submitted before it."""
        with self._lock:
            self._preparing.add(request.request_id)
            previous = self._previous
            idle = previous is None or previous.done()
            if self._closed or (not request.images and idle):  # closed: the engine stops it
                self._forward_locked(request, sink)
                return
            self._previous = self._pool.submit(self._prepare, request, sink, previous)

    def cancel(self, request_id: str) -> None:
        """Cancel a request wherever it is: still being prepared here (it is cancelled right
        after it is forwarded), or in the engine."""
        with self._lock:
            if request_id in self._preparing:
                self._cancelled.add(request_id)
                return
        self._cancel(request_id)

    def drain(self, timeout: float | None = None) -> None:
        """Wait until every request submitted so far is forwarded (tasks chain in arrival
        order, so the last one's end is everyone's)."""
        with self._lock:
            previous = self._previous
        if previous is not None:
            previous.result(timeout)

    def close(self) -> None:
        """Finish preparing and forwarding what was submitted; later submits are forwarded
        unprepared (the stopping engine answers them)."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True)

    def _prepare(self, request: EngineRequest, sink: Sink, previous: Future[None] | None) -> None:
        if request.images and request.request_id not in self._cancelled:
            try:
                request = self._with_pixels(request)
            except Exception:  # noqa: BLE001 - the engine retries, and fails this request only
                log.exception("preprocessing the images of %s failed", request.request_id)
        if previous is not None:
            previous.result()  # arrival order (a task never raises: see below)
        with self._lock:
            self._forward_locked(request, sink)

    def _with_pixels(self, request: EngineRequest) -> EngineRequest:
        """`request` with pixel values for the images the engine will encode."""
        spans = [ImageSpan(i.layout.start, i.layout.end, i.content_hash) for i in request.images]
        needed = self._needs_pixels(request.prompt_ids, spans)
        images = tuple(
            replace(i, pixel_values=self._preprocess(i.image))
            if need and i.pixel_values is None and i.image is not None
            else i
            for i, need in zip(request.images, needed, strict=True)
        )
        return replace(request, images=images)

    def _forward_locked(self, request: EngineRequest, sink: Sink) -> None:
        """Forward (lock held: a `cancel` racing with it lands after it, never before)."""
        request_id = request.request_id
        self._preparing.discard(request_id)
        cancelled = request_id in self._cancelled
        self._cancelled.discard(request_id)
        try:
            self._forward(request, sink)
        except Exception:  # noqa: BLE001 - the inbox is a queue: this is a bug, logged
            log.exception("forwarding %s to the engine failed", request_id)
            return
        if cancelled:
            self._cancel(request_id)
