"""Video references (http(s) URL, `data:video/...` URI, local path) -> `DecodedVideo`.

The video half of `MediaLoader` (which owns one `VideoLoader` and exposes `load_video`):
the same SSRF-safe fetcher rules (its own `UrlFetcher`, capped at `--max-video-bytes`), the
same local-path roots, and a memo keyed by the hash of the encoded bytes, so a repeat question
about the same clip skips fetching nothing but decoding everything. A memo hit returns the
earlier frames and hash; the identity of a video is still the hash of its sampled pixels (see
`gateway.media.video_decode`), so the same frames in another container share every cache
below this one.

Bound to one event loop; not thread-safe. Decoding runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time

from caches.hashing import bytes_hash
from caches.lru import ByteLRU
from gateway.config import MIB, MediaConfig
from gateway.errors import APIError, invalid
from gateway.media.failures import as_client_error
from gateway.media.single_flight import SingleFlight
from gateway.media.sources import file_url_path, parse_data_uri, read_media_file
from gateway.media.url_fetch import TransportFactory, UrlFetcher
from gateway.media.url_policy import AddressPolicy, Resolver, shorten
from gateway.media.video_decode import DecodedVideo, VideoSampling, decode_video

SUPPORTED_VIDEO_FORMS = (
    "supported video references are http:// and https:// URLs, "
    "data:video/<type>;base64,<data> URIs, and absolute paths or file:// URLs under a "
    "directory allowed with --allowed-media-dir"
)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_MEMO_BYTES = 256 * MIB  # decoded frames of recent clips


class VideoLoader:
    """Loads videos under the limits of a `MediaConfig` (see module docstring)."""

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
            kind="video",
        )
        self.sampling = VideoSampling(
            fps=config.video_fps,
            max_frames=config.max_video_frames,
            max_seconds=config.max_video_seconds,
            max_pixels=config.max_image_pixels,
        )
        self._memo: ByteLRU[str, DecodedVideo] = ByteLRU(
            _MEMO_BYTES if config.decode_memo_mb else 0
        )
        self._decoding: SingleFlight[str, DecodedVideo] = SingleFlight()
        self.counts = dict(decodes=0, memo_hits=0, unexpected_errors=0)

    async def aclose(self) -> None:
        await self._fetcher.aclose()
        await self._decoding.cancel_all()
        self._memo.clear()

    async def load(self, url: str, param: str) -> DecodedVideo:
        """One video reference; APIError (4xx, `param` set) for every failure."""
        return await as_client_error(self._load(url), "video", param, self.counts)

    async def _load(self, url: str) -> DecodedVideo:
        if not isinstance(url, str):
            raise invalid(f"video URL must be a string; {SUPPORTED_VIDEO_FORMS}")
        ref = url.strip()
        match = _SCHEME.match(ref)
        scheme = match.group(1).lower() if match else ""
        cap = self._config.max_video_bytes
        if scheme == "data":
            data = await asyncio.to_thread(parse_data_uri, ref, cap, "video")
            return await self._decode(data, "data")
        if scheme in ("http", "https"):
            return await self._decode(await self._fetcher.fetch(ref), "url")
        if scheme == "file" or (not scheme and ref.startswith("/")):
            path = file_url_path(ref) if scheme == "file" else ref
            roots = self._config.allowed_media_dirs
            try:
                data = await asyncio.to_thread(read_media_file, path, roots, cap)
            except APIError as err:  # the file rules are shared; their words are the image's
                raise _in_video_terms(err) from None
            return await self._decode(data, "path")
        what = f"scheme {scheme!r}" if scheme else f"reference {shorten(ref, 60)!r}"
        raise invalid(
            f"unsupported video {what}; {SUPPORTED_VIDEO_FORMS}", code="unsupported_video_source"
        )

    async def _decode(self, data: bytes, source: str) -> DecodedVideo:
        start = time.perf_counter()
        key = await asyncio.to_thread(bytes_hash, data)
        key_seconds = time.perf_counter() - start
        hit = self._memo.get(key)
        if hit is not None:
            self.counts["memo_hits"] += 1
            return dataclasses.replace(
                hit, source=source, decode_seconds=0.0, hash_seconds=key_seconds
            )

        async def begin() -> DecodedVideo:
            self.counts["decodes"] += 1
            video = await asyncio.to_thread(decode_video, data, self.sampling, source)
            self._memo.put(key, video, video.nbytes)
            return video

        video = await self._decoding.run(key, begin)
        # A load that joined another's decode of the same bytes keeps its own source.
        return video if video.source == source else dataclasses.replace(video, source=source)


_VIDEO_WORDS = (
    ("local image paths", "local video paths"),
    ("image path", "video path"),
    ("image file", "video file"),
    ("per image", "per video"),
    ("--max-image-bytes", "--max-video-bytes"),
    ("serve images", "serve videos"),
)


def _in_video_terms(err: APIError) -> APIError:
    """A local-file refusal from `read_media_file`, reworded for a video reference."""
    message = err.message
    for image_words, video_words in _VIDEO_WORDS:
        message = message.replace(image_words, video_words)
    return dataclasses.replace(err, message=message)
