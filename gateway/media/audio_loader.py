"""Audio references (`data:audio/...` URI, http(s) URL, local path) -> `DecodedAudio` at the
model's rate.

The audio half of `MediaLoader` (which owns one `AudioLoader`): the same SSRF-safe fetcher
rules (its own `UrlFetcher`, capped at `--max-audio-bytes`), the same local-path roots, and a
memo keyed by the hash of the encoded bytes and the rate, so a clip re-sent every turn is
decoded once. The identity of a clip is the hash of its decoded samples
(`gateway.media.audio_decode`), so the same samples as WAV, FLAC or a path share every
cache below this one.

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
from gateway.errors import invalid
from gateway.media.audio_decode import DecodedAudio, decode_audio
from gateway.media.failures import as_client_error
from gateway.media.single_flight import SingleFlight
from gateway.media.sources import file_url_path, parse_data_uri, read_media_file
from gateway.media.url_fetch import TransportFactory, UrlFetcher
from gateway.media.url_policy import AddressPolicy, Resolver, shorten

SUPPORTED_AUDIO_FORMS = (
    "audio is sent as an `input_audio` part (base64 `data` and its `format`) or an "
    "`audio_url` part: http:// and https:// URLs, data:audio/<type>;base64,<data> URIs, and "
    "absolute paths or file:// URLs under a directory allowed with --allowed-media-dir"
)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_MEMO_BYTES = 128 * MIB  # decoded samples of recent clips


class AudioLoader:
    """Loads audio clips under the limits of a `MediaConfig` (see module docstring)."""

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
            kind="audio",
        )
        self._memo: ByteLRU[str, DecodedAudio] = ByteLRU(
            _MEMO_BYTES if config.decode_memo_mb else 0
        )
        self._decoding: SingleFlight[str, DecodedAudio] = SingleFlight()
        self.counts = dict(decodes=0, memo_hits=0, unexpected_errors=0)

    async def aclose(self) -> None:
        await self._fetcher.aclose()
        await self._decoding.cancel_all()
        self._memo.clear()

    async def load(self, url: str, param: str, rate: int) -> DecodedAudio:
        """One audio reference, decoded to mono at `rate` Hz; APIError (4xx, `param` set)
        for every failure."""
        return await as_client_error(self._load(url, rate), "audio", param, self.counts)

    async def _load(self, url: str, rate: int) -> DecodedAudio:
        if not isinstance(url, str):
            raise invalid(f"audio URL must be a string; {SUPPORTED_AUDIO_FORMS}")
        ref = url.strip()
        match = _SCHEME.match(ref)
        scheme = match.group(1).lower() if match else ""
        cap = self._config.max_audio_bytes
        if scheme == "data":
            data = await asyncio.to_thread(parse_data_uri, ref, cap, "audio")
            return await self._decode(data, "data", rate)
        if scheme in ("http", "https"):
            return await self._decode(await self._fetcher.fetch(ref), "url", rate)
        if scheme == "file" or (not scheme and ref.startswith("/")):
            path = file_url_path(ref) if scheme == "file" else ref
            roots = self._config.allowed_media_dirs
            data = await asyncio.to_thread(read_media_file, path, roots, cap)
            return await self._decode(data, "path", rate)
        what = f"scheme {scheme!r}" if scheme else f"reference {shorten(ref, 60)!r}"
        raise invalid(
            f"unsupported audio {what}; {SUPPORTED_AUDIO_FORMS}", code="unsupported_audio_source"
        )

    async def _decode(self, data: bytes, source: str, rate: int) -> DecodedAudio:
        if not data:
            raise invalid("the audio is empty (0 bytes)", code="empty_audio")
        start = time.perf_counter()
        key = f"{await asyncio.to_thread(bytes_hash, data)}@{rate}"
        key_seconds = time.perf_counter() - start
        hit = self._memo.get(key)
        if hit is not None:
            self.counts["memo_hits"] += 1
            return dataclasses.replace(
                hit, source=source, decode_seconds=0.0, hash_seconds=key_seconds
            )
        seconds = self._config.max_audio_seconds

        async def begin() -> DecodedAudio:
            self.counts["decodes"] += 1
            clip = await asyncio.to_thread(decode_audio, data, rate, seconds, source)
            self._memo.put(key, clip, clip.nbytes)
            return clip

        clip = await self._decoding.run(key, begin)
        return clip if clip.source == source else dataclasses.replace(clip, source=source)
