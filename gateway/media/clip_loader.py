"""Clip references (http(s) URL, `data:<kind>/...` URI, local path) -> a decoded clip.

The video and audio halves of `MediaLoader` (which owns one `ClipLoader` per kind): the same
SSRF-safe fetcher rules as images (each kind its own `UrlFetcher`, capped at
`--max-<kind>-bytes`), the same local-path roots, and a memo keyed by the hash of the encoded
bytes (plus the decoding's `variant`, e.g. audio's sample rate), so a clip re-sent every turn
is decoded once. A memo hit returns the earlier decode; the identity of a clip is still the
hash of what decoding made of it (`video_decode`, `audio_decode`), so the same frames or
samples in another container share every cache below this one.

What a kind decodes to is the caller's: `load` takes the blocking decode function. Bound to
one event loop; not thread-safe. Decoding runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import Callable
from typing import Generic, Literal, Protocol, TypeVar

from caches.hashing import bytes_hash
from caches.lru import ByteLRU
from gateway.config import MediaConfig
from gateway.errors import invalid
from gateway.media.failures import as_client_error
from gateway.media.single_flight import SingleFlight
from gateway.media.sources import file_url_path, parse_data_uri, read_media_file
from gateway.media.url_fetch import TransportFactory, UrlFetcher
from gateway.media.url_policy import AddressPolicy, Resolver, shorten

ClipKind = Literal["video", "audio"]
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


class DecodedClip(Protocol):
    """What a clip decoder returns: a frozen dataclass with these fields."""

    source: str
    decode_seconds: float
    hash_seconds: float

    @property
    def nbytes(self) -> int: ...


ClipT = TypeVar("ClipT", bound=DecodedClip)
ClipDecoder = Callable[[bytes, str], ClipT]
"""(encoded bytes, source) -> decoded clip; blocking, raises APIError (4xx) for bad input."""


class ClipLoader(Generic[ClipT]):
    """Loads clips of one kind under the limits of a `MediaConfig` (see module docstring).

    `forms` is the sentence naming the accepted references, quoted in refusals; `memo_bytes`
    bounds the decoded clips kept (0 when the config turns the decode memo off).
    """

    def __init__(
        self,
        config: MediaConfig,
        kind: ClipKind,
        *,
        max_bytes: int,
        memo_bytes: int,
        forms: str,
        resolver: Resolver | None = None,
        transport_factory: TransportFactory | None = None,
        address_policy: AddressPolicy | None = None,
    ) -> None:
        self._config = config
        self._kind: ClipKind = kind
        self._max_bytes = max_bytes
        self._forms = forms
        self._fetcher = UrlFetcher(
            config,
            resolver=resolver,
            transport_factory=transport_factory,
            address_policy=address_policy,
            kind=kind,
        )
        self._memo: ByteLRU[str, ClipT] = ByteLRU(memo_bytes if config.decode_memo_mb else 0)
        self._decoding: SingleFlight[str, ClipT] = SingleFlight()
        self.counts = dict(decodes=0, memo_hits=0, unexpected_errors=0)

    async def aclose(self) -> None:
        """Cancel in-flight fetches and decodes, drop the memo; the loader stays usable."""
        await self._fetcher.aclose()
        await self._decoding.cancel_all()
        self._memo.clear()

    async def load(
        self, url: str, param: str, decode: ClipDecoder[ClipT], variant: str = ""
    ) -> ClipT:
        """One clip reference, decoded by `decode`; APIError (4xx, `param` set) for every
        failure. `variant` names what `decode` depends on beyond the bytes (memo key)."""
        load = self._load(url, decode, variant)
        return await as_client_error(load, self._kind, param, self.counts)

    async def _load(self, url: str, decode: ClipDecoder[ClipT], variant: str) -> ClipT:
        kind = self._kind
        if not isinstance(url, str):
            raise invalid(f"{kind} URL must be a string; {self._forms}")
        ref = url.strip()
        match = _SCHEME.match(ref)
        scheme = match.group(1).lower() if match else ""
        if scheme == "data":
            data = await asyncio.to_thread(parse_data_uri, ref, self._max_bytes, kind)
            return await self._decode(data, "data", decode, variant)
        if scheme in ("http", "https"):
            data = await self._fetcher.fetch(ref)
            return await self._decode(data, "url", decode, variant)
        if scheme == "file" or (not scheme and ref.startswith("/")):
            path = file_url_path(ref) if scheme == "file" else ref
            roots = self._config.allowed_media_dirs
            data = await asyncio.to_thread(read_media_file, path, roots, self._max_bytes, kind)
            return await self._decode(data, "path", decode, variant)
        what = f"scheme {scheme!r}" if scheme else f"reference {shorten(ref, 60)!r}"
        raise invalid(
            f"unsupported {kind} {what}; {self._forms}", code=f"unsupported_{kind}_source"
        )

    async def _decode(
        self, data: bytes, source: str, decode: ClipDecoder[ClipT], variant: str
    ) -> ClipT:
        if not data:
            raise invalid(f"the {self._kind} is empty (0 bytes)", code=f"empty_{self._kind}")
        start = time.perf_counter()
        key = f"{await asyncio.to_thread(bytes_hash, data)}{variant}"
        key_seconds = time.perf_counter() - start
        hit = self._memo.get(key)
        if hit is not None:
            self.counts["memo_hits"] += 1
            return dataclasses.replace(  # type: ignore[type-var]
                hit, source=source, decode_seconds=0.0, hash_seconds=key_seconds
            )

        async def begin() -> ClipT:
            self.counts["decodes"] += 1
            clip = await asyncio.to_thread(decode, data, source)
            self._memo.put(key, clip, clip.nbytes)
            return clip

        clip = await self._decoding.run(key, begin)
        # A load that joined another's decode of the same bytes keeps its own source.
        if clip.source == source:
            return clip
        return dataclasses.replace(clip, source=source)  # type: ignore[type-var]
