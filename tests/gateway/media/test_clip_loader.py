"""Clip references (videos through `MediaLoader.load_videos`, audio through `load_audio`):
the same sources and SSRF rules as images, each kind's byte cap, and the memo.

Pinned: a clip fetched by URL (through the SSRF-safe fetcher, asking for `video/*`), sent as a
data URI, or read from an allowed path has one identity; the same bytes are decoded once (per
audio sample rate); a body over --max-video-bytes is a 413 naming that flag; a host resolving
to a private address is refused before any request; the first failing reference (in input
order) is the error; a refused audio path speaks of audio, not images.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import httpx
import pytest
from audio_clips import chirp, encode
from video_clips import clip_bytes, noise_frames

from gateway.config import MediaConfig
from gateway.errors import APIError
from gateway.media import MediaLoader

CLIP = clip_bytes(noise_frames(4), fps=4)


def _loader(root: Path, address: str = "93.184.216.34", body: bytes = CLIP, **config: object):
    seen: list[httpx.Request] = []

    async def resolver(host: str, port: int) -> list[str]:
        return [address]

    def transport(_backend: object) -> httpx.AsyncBaseTransport:
        def answer(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            headers = {"content-length": str(len(body))}
            return httpx.Response(200, headers=headers, stream=httpx.ByteStream(body))

        return httpx.MockTransport(answer)

    media = MediaConfig(allowed_media_dirs=(root,), **config)  # type: ignore[arg-type]
    return MediaLoader(media, resolver=resolver, transport_factory=transport), seen


def test_url_data_uri_and_path_are_one_video_decoded_once(tmp_path: Path) -> None:
    """Invariant: three sources, one content hash, one decode (the memo keys the bytes)."""
    (tmp_path / "c.mov").write_bytes(CLIP)
    loader, seen = _loader(tmp_path.resolve())
    uri = "data:video/quicktime;base64," + base64.b64encode(CLIP).decode()
    refs = [("https://videos.example/c.mov", "a"), (uri, "b"), (str(tmp_path / "c.mov"), "c")]
    videos = asyncio.run(loader.load_videos(refs))
    assert len({v.content_hash for v in videos}) == 1 and videos[0].num_frames == 2
    assert [v.source for v in videos] == ["url", "data", "path"]
    assert seen[0].headers["accept"] == "video/*"
    assert loader.stats()["videos"]["decodes"] == 1


def test_a_body_over_the_video_cap_is_413(tmp_path: Path) -> None:
    """Invariant: --max-video-bytes bounds the download, and the message names it."""
    loader, _ = _loader(tmp_path, max_video_bytes=1000)
    with pytest.raises(APIError) as caught:
        asyncio.run(loader.load_videos([("https://videos.example/c.mov", "p")]))
    assert caught.value.status == 413 and "--max-video-bytes" in caught.value.message
    assert caught.value.param == "p"


def test_a_private_address_is_refused_before_any_request(tmp_path: Path) -> None:
    """Invariant: video URLs follow the image URL's SSRF rules (resolve, check, pin)."""
    loader, seen = _loader(tmp_path, address="10.1.2.3")
    with pytest.raises(APIError) as caught:
        asyncio.run(loader.load_videos([("https://internal.example/c.mov", "p")]))
    assert caught.value.status == 400 and "video URL" in caught.value.message
    assert seen == []


def test_the_first_failure_in_input_order_is_raised(tmp_path: Path) -> None:
    """Invariant: of the references that have failed, the error names the first one's field
    (as for images)."""
    loader, _ = _loader(tmp_path)
    refs = [("ftp://x/y.mp4", "first"), ("gopher://x/y.mp4", "second")]
    with pytest.raises(APIError) as caught:
        asyncio.run(loader.load_videos(refs))
    assert caught.value.param == "first"


WAV = encode(chirp(0.5, 16000), 16000)


def test_audio_sources_are_one_clip_decoded_once_per_rate(tmp_path: Path) -> None:
    """Invariant: audio by URL, data URI and path has one content hash and one decode at a
    rate; the same bytes at another rate are another decode (the memo key holds the rate)."""
    (tmp_path / "a.wav").write_bytes(WAV)
    loader, seen = _loader(tmp_path.resolve(), body=WAV)
    uri = "data:audio/wav;base64," + base64.b64encode(WAV).decode()
    refs = [("https://audio.example/a.wav", "a"), (uri, "b"), (str(tmp_path / "a.wav"), "c")]
    clips = asyncio.run(loader.load_audio(refs, 16000))
    assert len({c.content_hash for c in clips}) == 1 and clips[0].rate == 16000
    assert [c.source for c in clips] == ["url", "data", "path"]
    assert seen[0].headers["accept"] == "audio/*"
    assert loader.stats()["audio"]["decodes"] == 1
    (slower,) = asyncio.run(loader.load_audio([(uri, "d")], 8000))
    assert slower.rate == 8000 and slower.content_hash != clips[0].content_hash
    assert loader.stats()["audio"]["decodes"] == 2


def test_a_refused_audio_path_speaks_of_audio(tmp_path: Path) -> None:
    """Invariant: the local-file rules are the images', their words the clip's kind (a path
    outside the roots, and paths with no root allowed at all)."""
    loader, _ = _loader(tmp_path.resolve())
    with pytest.raises(APIError) as outside:
        asyncio.run(loader.load_audio([("/etc/passwd", "p")], 16000))
    assert outside.value.status == 400 and outside.value.param == "p"
    assert "audio path" in outside.value.message and "image" not in outside.value.message
    closed = MediaLoader(MediaConfig())
    with pytest.raises(APIError) as disabled:
        asyncio.run(closed.load_audio([("/tmp/a.wav", "p")], 16000))
    assert "local audio paths are disabled" in disabled.value.message


def test_empty_audio_is_a_400(tmp_path: Path) -> None:
    """Invariant: zero bytes are refused before decoding, naming the problem."""
    (tmp_path / "empty.wav").write_bytes(b"")
    loader, _ = _loader(tmp_path.resolve())
    with pytest.raises(APIError) as caught:
        asyncio.run(loader.load_audio([(str(tmp_path / "empty.wav"), "p")], 16000))
    assert caught.value.status == 400 and caught.value.code == "empty_audio"
