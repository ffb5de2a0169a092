"""Video chat end to end: the `openai` SDK against a live server, and hostile video input.

Pinned: a `video_url` part (data URI, allowed local path, or URL through the SSRF-safe
fetcher) is answered; a repeat question about the same clip, even re-encoded in another
container with the same frames, runs no tower and takes most of its prompt from the cache; a
clip with one changed sampled frame misses; every hostile
video (bad containers, zero length, huge frame counts, wrong media types, SSRF URLs, the
size, length and per-request limits) is a 4xx OpenAI error object, never a 5xx, and the
server keeps serving.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import ServerProcess, noise_png
from video_clips import clip_bytes, noise_frames

FRAMES = noise_frames(8, 112, 112, seed=31)


def _uri(data: bytes, mime: str = "video/quicktime") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _video(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


def _body(*parts: dict, question: str = "What happens?") -> dict:
    return {
        "model": "test",
        "max_tokens": 4,
        "temperature": 0,
        "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}],
    }


def _x_cache(headers: object) -> dict[str, int]:
    fields = dict(item.strip().split("=") for item in headers["x-cache"].split(";"))  # type: ignore[index]
    return {k: int(v) for k, v in fields.items()}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("video-media")
    (root / "clip.mkv").write_bytes(clip_bytes(FRAMES, 4, "mkv"))
    (root / "long.mov").write_bytes(clip_bytes(noise_frames(48, 16, 16), 4, "mov"))  # 12 s
    (root / "dense.mov").write_bytes(clip_bytes(noise_frames(400, 16, 16), 1000, "mov"))
    return root


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        "--allowed-media-dir", str(folder), "--max-video-seconds", "10",
        "--max-video-bytes", "300000", "--max-images-per-request", "2", "--kv-block-tokens", "8",
        "--no-warmup",
    )  # fmt: skip
    yield proc
    assert proc.stop(), proc.log()


def _ask(server: ServerProcess, url: str, question: str = "What happens?"):  # noqa: ANN202
    raw = server.client().chat.completions.with_raw_response.create(
        model="test",
        messages=[{"role": "user", "content": [_video(url), {"type": "text", "text": question}]}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
    )
    return _x_cache(raw.headers), raw.parse()


def test_openai_sdk_video_question_and_cached_repeat(server: ServerProcess, folder: Path) -> None:
    """Invariant: the repeat (another container, same frames) runs no tower and takes most of
    the prompt from the cache; its answer equals the first answer to the same question."""
    first_cache, first = _ask(server, _uri(clip_bytes(FRAMES, 4, "mov")))
    assert first.choices[0].finish_reason in ("length", "stop")
    assert first_cache["vision-misses"] == 1
    again_cache, again = _ask(server, str(folder / "clip.mkv"))  # MKV, same frames, a path
    # The stored prompt covers the whole clip: neither the tower nor the vision cache is asked.
    assert again_cache["vision-misses"] == 0
    assert again_cache["cached-tokens"] > again_cache["prompt-tokens"] // 2
    ids = [t.logprob for t in first.choices[0].logprobs.content]
    assert ids == [t.logprob for t in again.choices[0].logprobs.content]
    other_cache, _ = _ask(server, _uri(clip_bytes(FRAMES, 4, "mov")), "Another question?")
    assert other_cache["vision-misses"] == 0 and other_cache["cached-tokens"] > 0
    changed = FRAMES.copy()
    changed[4, 1, 1, 2] ^= 1  # a sampled frame (2 fps of 4 fps: even frames)
    changed_cache, _ = _ask(server, _uri(clip_bytes(changed, 4, "mov")))
    assert changed_cache["vision-misses"] == 1


def test_streaming_video_answer(server: ServerProcess) -> None:
    """Invariant: a streamed video answer ends with a finish reason (same request path)."""
    stream = server.client().chat.completions.create(
        stream=True, **_body(_video(_uri(clip_bytes(FRAMES[:2], 4, "mov"))))
    )
    reasons = [c.choices[0].finish_reason for c in stream if c.choices]
    assert reasons[-1] in ("length", "stop")


HOSTILE = [
    ("zero-length", _body(_video("data:video/mp4;base64,")), 400),
    ("garbage", _body(_video(_uri(b"not a video at all" * 20))), 400),
    ("truncated", _body(_video(_uri(clip_bytes(FRAMES[:2], 4, "mov")[:300]))), 400),
    ("image-as-video", _body(_video(_uri(noise_png(1, 28, 28), "image/png"))), 400),
    ("png-bytes-as-video", _body(_video(_uri(noise_png(1, 28, 28), "video/mp4"))), 400),
    ("video-as-image", _body({"type": "image_url", "image_url": {"url": _uri(b"x" * 99)}}), 400),
    ("not-base64", _body(_video("data:video/mp4;base64,!!!!")), 400),
    ("ssrf-loopback", _body(_video("http://127.0.0.1:1/a.mp4")), 400),
    ("ssrf-metadata", _body(_video("http://169.254.169.254/latest")), 400),
    ("ssrf-decimal", _body(_video("http://2130706433/a.mp4")), 400),
    ("ssrf-v6", _body(_video("http://[::1]/a.mp4")), 400),
    ("path-outside-root", _body(_video("/etc/passwd")), 400),
    ("ftp", _body(_video("ftp://example.com/a.mp4")), 400),
    ("no-url", _body({"type": "video_url", "video_url": {}}), 400),
    ("url-not-string", _body({"type": "video_url", "video_url": {"url": 7}}), 400),
    ("too-many", _body(*[_video("x")] * 3), 400),
    ("over-bytes", _body(_video(_uri(b"\x00" * 400_000, "video/mp4"))), 413),
]


@pytest.mark.parametrize(("name", "body", "status"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_video_gets_a_4xx_openai_error(
    server: ServerProcess, name: str, body: dict, status: int
) -> None:
    """Invariant: exact 4xx status, OpenAI error object with a message and a param."""
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == status, (name, r.text[:400])
    error = r.json()["error"]
    assert error["message"].strip() and error["type"] == "invalid_request_error", error


@pytest.mark.parametrize(
    ("name", "words"), [("long.mov", "--max-video-seconds"), ("dense.mov", "frames")]
)
def test_long_and_dense_clips_are_413(
    server: ServerProcess, folder: Path, name: str, words: str
) -> None:
    """Invariant: the length limit and the decoded-frame bound are 413s naming the limit."""
    r = httpx.post(
        server.base_url + "/v1/chat/completions", json=_body(_video(str(folder / name))), timeout=60
    )
    assert r.status_code == 413, r.text[:400]
    assert words in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "messages[0].content[0].video_url.url"


def test_refused_video_paths_speak_of_videos(server: ServerProcess, folder: Path) -> None:
    """Invariant: the shared local-file rules answer a video reference in video terms."""
    for path in ("/etc/passwd", str(folder / "missing.mp4")):
        r = httpx.post(server.base_url + "/v1/chat/completions", json=_body(_video(path)))
        assert r.status_code == 400
        message = r.json()["error"]["message"]
        assert "video path" in message and "image" not in message, message


def test_server_still_serves_after_hostile_video(server: ServerProcess) -> None:
    """Invariant: nothing above broke the server."""
    _, answer = _ask(server, _uri(clip_bytes(FRAMES[:4], 4, "mov")))
    assert answer.choices[0].finish_reason in ("length", "stop")
    assert "Traceback" not in server.log(200_000)
