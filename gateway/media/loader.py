"""Image sources (http(s) URL, base64 data URI, local path) -> decoded, hashed RGB images.

`MediaLoader.load` is the one entry point: for ANY input string it returns a `DecodedImage` or
raises `APIError` with a 4xx status whose `param` is the field the string came from. URL rules
live in `gateway.media.url_fetch`, decoding rules in `gateway.media.image_decode`.

Reading data URIs and local files lives in `gateway.media.sources`.

Memo: decoded images are keyed by the hash of their encoded bytes; data URIs also by the hash
of their text, so re-sending an image every turn costs one xxh3 pass (< 1 ms for 4 MB), not
base64 validation and decoding. A first delivery is validated in full; only successes are kept.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from PIL import Image

from caches.hashing import bytes_hash
from caches.lru import ByteLRU
from gateway.config import MIB, MediaConfig
from gateway.errors import invalid, too_large
from gateway.media.audio_decode import DecodedAudio, decode_audio
from gateway.media.clip_loader import ClipLoader
from gateway.media.failures import as_client_error
from gateway.media.image_decode import decode_and_hash, raise_pillow_pixel_limit
from gateway.media.single_flight import SingleFlight
from gateway.media.sources import file_url_path, parse_data_uri, read_media_file
from gateway.media.url_fetch import TransportFactory, UrlFetcher
from gateway.media.url_policy import AddressPolicy, Resolver, shorten
from gateway.media.video_decode import DecodedVideo, VideoSampling, decode_video

SUPPORTED_FORMS = (
    "supported image references are http:// and https:// URLs, "
    "data:image/<type>;base64,<data> URIs, and absolute paths or file:// URLs under a "
    "directory allowed with --allowed-media-dir"
)
SUPPORTED_VIDEO_FORMS = (
    "supported video references are http:// and https:// URLs, "
    "data:video/<type>;base64,<data> URIs, and absolute paths or file:// URLs under a "
    "directory allowed with --allowed-media-dir"
)
SUPPORTED_AUDIO_FORMS = (
    "audio is sent as an `input_audio` part (base64 `data` and its `format`) or an "
    "`audio_url` part: http:// and https:// URLs, data:audio/<type>;base64,<data> URIs, and "
    "absolute paths or file:// URLs under a directory allowed with --allowed-media-dir"
)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_T = TypeVar("_T")
_Clip = TypeVar("_Clip")
_THREAD_THRESHOLD = 1 * MIB  # base64/hash larger inputs off the event loop
# Encoding + xxh3 of a data URI's text runs at several GB/s: ~1 ms on the loop at this size,
# cheaper than the hop to a worker thread that a warm turn would otherwise wait for.
_INLINE_TEXT_HASH = 8 * MIB
# Data-URI index entries (two 32-char strings) are bounded by count: a nominal size each.
_URI_INDEX_ENTRIES = 4096
_URI_INDEX_ENTRY_BYTES = 256
_VIDEO_MEMO_BYTES = 256 * MIB  # decoded frames of recent clips
_AUDIO_MEMO_BYTES = 128 * MIB  # decoded samples of recent clips


@dataclass(frozen=True)
class DecodedImage:
    """A decoded image and its identity.

    `image` is RGB, EXIF orientation applied, fully loaded; it may be shared (memo), so treat
    it as immutable. `content_hash` is `pixel_hash("RGB", width, height, image.tobytes())`.
    `source` is "url", "data" or "path". `decode_seconds` is 0.0 when the memo supplied the
    image; `hash_seconds` covers hashing the memo keys (a data URI's text, the encoded bytes)
    and, on a miss, the pixels.
    """

    image: Image.Image
    content_hash: str
    width: int
    height: int
    source: str
    decode_seconds: float
    hash_seconds: float


class MediaLoader:
    """Loads images for requests under the limits of a `MediaConfig`.

    Bound to one event loop (in-flight maps hold its futures); not thread-safe. Decoding runs
    in worker threads. `resolver`, `transport_factory` and `address_policy` are passed to
    `UrlFetcher` (tests inject fakes so nothing leaves loopback).
    """

    def __init__(
        self,
        config: MediaConfig,
        *,
        resolver: Resolver | None = None,
        transport_factory: TransportFactory | None = None,
        address_policy: AddressPolicy | None = None,
    ) -> None:
        self._config = config
        self._fetcher = UrlFetcher(
            config,
            resolver=resolver,
            transport_factory=transport_factory,
            address_policy=address_policy,
        )
        self._memo: ByteLRU[str, DecodedImage] = ByteLRU(config.decode_memo_mb * MIB)
        # Data URI text hash -> `_memo` key; no pixels: once `_memo` evicts, the full path runs.
        index_bytes = _URI_INDEX_ENTRIES * _URI_INDEX_ENTRY_BYTES if config.decode_memo_mb else 0
        self._data_uris: ByteLRU[str, str] = ByteLRU(index_bytes)
        self._decoding: SingleFlight[str, DecodedImage] = SingleFlight()
        fetching = dict(
            resolver=resolver, transport_factory=transport_factory, address_policy=address_policy
        )
        self.videos: ClipLoader[DecodedVideo] = ClipLoader(
            config,
            "video",
            max_bytes=config.max_video_bytes,
            memo_bytes=_VIDEO_MEMO_BYTES,
            forms=SUPPORTED_VIDEO_FORMS,
            **fetching,
        )
        self.video_sampling = VideoSampling(
            fps=config.video_fps,
            max_frames=config.max_video_frames,
            max_seconds=config.max_video_seconds,
            max_pixels=config.max_image_pixels,
        )
        self.audio: ClipLoader[DecodedAudio] = ClipLoader(
            config,
            "audio",
            max_bytes=config.max_audio_bytes,
            memo_bytes=_AUDIO_MEMO_BYTES,
            forms=SUPPORTED_AUDIO_FORMS,
            **fetching,
        )
        self._counts = dict(decodes=0, unexpected_errors=0, data_uri_memo_hits=0)
        self._sources = dict(url=0, data=0, path=0)
        raise_pillow_pixel_limit(config.max_image_pixels)

    def stats(self) -> dict[str, object]:
        """A snapshot of memo and loader counters (plain ints, JSON-ready)."""
        memo = self._memo.stats()
        return {
            "memo_hits": memo.hits,
            "memo_misses": memo.misses,
            "memo_entries": memo.entries,
            "memo_bytes": memo.bytes,
            "memo_capacity_bytes": memo.capacity_bytes,
            "memo_evictions": memo.evictions,
            **self._counts,
            "decode_joined": self._decoding.joined,
            "loads_by_source": dict(self._sources),
            "fetch": self._fetcher.stats(),
            "videos": dict(self.videos.counts),
            "audio": dict(self.audio.counts),
        }

    async def aclose(self) -> None:
        """Cancel in-flight fetches and drop the memo. The loader stays usable afterwards."""
        await self._fetcher.aclose()
        await self.videos.aclose()
        await self.audio.aclose()
        await self._decoding.cancel_all()
        self._memo.clear()
        self._data_uris.clear()

    async def load(self, url: str, param: str = "image_url.url") -> DecodedImage:
        """Load one image reference; APIError (4xx, `param` set) for every failure."""
        return await as_client_error(self._load(url), "image", param, self._counts)

    async def load_all(self, urls: Sequence[tuple[str, str]]) -> list[DecodedImage]:
        """Load (url, param) pairs concurrently; results in input order.

        Enforces `max_images_per_request` (400) before loading and `max_request_pixels` (413)
        as images complete. On the first failure the remaining loads are cancelled and, of the
        pairs that have failed by then, the error of the first in input order is raised.
        """
        self.check_media_count(len(urls))
        tasks = [asyncio.ensure_future(self.load(u, p)) for u, p in urls]
        pending: set[asyncio.Future[DecodedImage]] = set(tasks)
        total = 0
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                failed = [t for t in tasks if t in done and t.exception() is not None]
                if failed:
                    raise failed[0].exception()  # type: ignore[misc]
                total += sum(t.result().width * t.result().height for t in done)
                if total > self._config.max_request_pixels:
                    raise too_large(
                        f"the request's images have at least {total} pixels together, "
                        f"over the limit of {self._config.max_request_pixels} "
                        "(the limit is set by --max-request-pixels)"
                    )
        finally:
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        return [t.result() for t in tasks]

    async def load_videos(self, urls: Sequence[tuple[str, str]]) -> list[DecodedVideo]:
        """Load (url, param) video pairs concurrently, in input order (as `_load_clips`).
        Videos count against `max_images_per_request` together with the request's images
        (checked by the caller through `check_media_count`)."""
        sampling = self.video_sampling

        def decode(data: bytes, source: str) -> DecodedVideo:
            return decode_video(data, sampling, source)

        return await _load_clips([self.videos.load(u, p, decode) for u, p in urls])

    async def load_audio(self, urls: Sequence[tuple[str, str]], rate: int) -> list[DecodedAudio]:
        """Load (url, param) audio pairs concurrently, decoded to mono at `rate` Hz, in input
        order (as `_load_clips`)."""
        seconds = self._config.max_audio_seconds

        def decode(data: bytes, source: str) -> DecodedAudio:
            return decode_audio(data, rate, seconds, source)

        return await _load_clips([self.audio.load(u, p, decode, f"@{rate}") for u, p in urls])

    def check_media_count(self, images: int, videos: int = 0, audio: int = 0) -> None:
        """400 when a request carries more media parts (images, videos and audio clips) than
        `max_images_per_request`, before any is fetched or decoded."""
        limit = self._config.max_images_per_request
        if images + videos + audio <= limit:
            return
        if videos or audio:
            has = f"{images} images, {videos} videos and {audio} audio clips"
            per = "media parts per request"
        else:
            has, per = f"{images} images", "per request"
        raise invalid(
            f"the request has {has}, over the limit of {limit} {per} "
            "(the limit is set by --max-images-per-request)",
            code="too_many_images",
        )

    async def _load(self, url: str) -> DecodedImage:
        if not isinstance(url, str):
            raise invalid(
                f"image URL must be a string; {SUPPORTED_FORMS}", code="invalid_image_url"
            )
        ref = url.strip()
        match = _SCHEME.match(ref)
        scheme = match.group(1).lower() if match else ""
        if scheme == "data":
            self._sources["data"] += 1
            return await self._load_data_uri(ref)
        if scheme in ("http", "https"):
            self._sources["url"] += 1
            return await self._decode(await self._fetcher.fetch(ref), "url")
        if scheme == "file" or (not scheme and ref.startswith("/")):
            self._sources["path"] += 1
            path = file_url_path(ref) if scheme == "file" else ref
            roots = self._config.allowed_media_dirs
            data = await asyncio.to_thread(read_media_file, path, roots, self._cap)
            return await self._decode(data, "path")
        if scheme:
            raise invalid(
                f"unsupported image URL scheme {scheme!r}; {SUPPORTED_FORMS}",
                code="unsupported_image_source",
            )
        raise invalid(
            f"unsupported image reference {shorten(ref, 60)!r}; {SUPPORTED_FORMS}",
            code="unsupported_image_source",
        )

    @property
    def _cap(self) -> int:
        return self._config.max_image_bytes

    @staticmethod
    async def _off_loop(size: int, fn: Callable[[], _T], threshold: int = _THREAD_THRESHOLD) -> _T:
        """Run `fn` in a worker thread when the input is big enough to stall the loop."""
        return await asyncio.to_thread(fn) if size > threshold else fn()

    async def _load_data_uri(self, ref: str) -> DecodedImage:
        """A data URI, looked up by its text first so that a repeat skips base64 and decoding.

        The result is a pure function of the text (limits are fixed per loader), so the same
        text may reuse an earlier success; anything else takes the full path, raising every
        invalid-URI error and 413 exactly as on a first delivery."""
        start = time.perf_counter()
        # surrogatepass: JSON may carry lone surrogates; the text -> bytes map stays 1:1.
        uri_key = await self._off_loop(
            len(ref), lambda: bytes_hash(ref.encode("utf-8", "surrogatepass")), _INLINE_TEXT_HASH
        )
        bytes_key = self._data_uris.get(uri_key) or ""
        hit = self._memo.peek(bytes_key)  # peek: a miss is counted once, by _decode_keyed
        uri_seconds = time.perf_counter() - start
        if hit is not None:
            self._memo.touch(bytes_key)
            self._memo.record(True)
            self._counts["data_uri_memo_hits"] += 1
            return dataclasses.replace(
                hit, source="data", decode_seconds=0.0, hash_seconds=uri_seconds
            )
        data = await self._off_loop(len(ref), lambda: parse_data_uri(ref, self._cap))
        decoded, key = await self._decode_keyed(data, "data", uri_seconds)
        if key is not None:
            self._data_uris.put(uri_key, key, _URI_INDEX_ENTRY_BYTES)
        return decoded

    async def _decode(self, data: bytes, source: str) -> DecodedImage:
        return (await self._decode_keyed(data, source, 0.0))[0]

    async def _decode_keyed(
        self, data: bytes, source: str, extra_seconds: float
    ) -> tuple[DecodedImage, str | None]:
        """Memo lookup by encoded-bytes hash, then a (deduplicated) decode in a thread; also
        returns the memo key (None: memo off). `extra_seconds` is added to `hash_seconds`."""
        if self._memo.capacity_bytes == 0:
            return await self._decode_uncached(data, source, extra_seconds, None), None
        start = time.perf_counter()
        key = await self._off_loop(len(data), lambda: bytes_hash(data))
        key_seconds = time.perf_counter() - start + extra_seconds
        hit = self._memo.get(key)
        if hit is None:
            leader = False

            def begin() -> Awaitable[DecodedImage]:
                nonlocal leader  # called synchronously by run() only when no decode is running
                leader = True
                return self._decode_uncached(data, source, key_seconds, key)

            hit = await self._decoding.run(key, begin)
            if leader:
                return hit, key
        reused = dataclasses.replace(
            hit, source=source, decode_seconds=0.0, hash_seconds=key_seconds
        )
        return reused, key

    async def _decode_uncached(
        self, data: bytes, source: str, key_seconds: float, memo_key: str | None
    ) -> DecodedImage:
        self._counts["decodes"] += 1
        image, digest, decode_s, hash_s = await asyncio.to_thread(
            decode_and_hash, data, self._config.max_image_pixels
        )
        decoded = DecodedImage(
            image=image,
            content_hash=digest,
            width=image.width,
            height=image.height,
            source=source,
            decode_seconds=decode_s,
            hash_seconds=hash_s + key_seconds,
        )
        if memo_key is not None:
            self._memo.put(memo_key, decoded, decoded.width * decoded.height * 3)
        return decoded


async def _load_clips(loads: Sequence[Awaitable[_Clip]]) -> list[_Clip]:
    """Run `loads` concurrently; results in input order. On the first failure the other loads
    are cancelled and, of those that failed by then, the error of the first in input order is
    raised (as `MediaLoader.load_all`)."""
    tasks = [asyncio.ensure_future(load) for load in loads]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        failed = [t for t in tasks if not t.cancelled() and t.exception() is not None]
        if failed:
            raise failed[0].exception() from None  # type: ignore[misc]
        raise
    return [t.result() for t in tasks]
