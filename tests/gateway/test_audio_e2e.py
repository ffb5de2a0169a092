"""Audio chat end to end: a live server on the tiny Gemma 4 checkpoint (it has an audio tower)
and one on a model without one.

Pinned: an OpenAI `input_audio` part (WAV or FLAC base64), an `audio_url` part (an allowed
local path) and a Responses `input_audio` item are answered; the same samples in another
container or delivery answer the same (logprobs equal) from the cache: one audio-feature
entry, the prompt's blocks reused; hostile audio (not audio, truncated, empty, too long for
the model, a bad format name) is a 400 naming the part, never a 5xx; a model without an audio
tower refuses audio with a 400 naming the part.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from audio_clips import chirp, encode
from support import ServerProcess

SAMPLES = chirp(1.5, 44100, 350.0)
WAV = encode(SAMPLES, 44100, "wav")
FLAC = encode(SAMPLES, 44100, "flac")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _audio(data: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": _b64(data), "format": fmt}}


def _body(*parts: dict, question: str = "What is said?") -> dict:
    return {
        "model": "test",
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "messages": [{"role": "user", "content": [{"type": "text", "text": question}, *parts]}],
    }


def _x_cache(headers: httpx.Headers) -> dict[str, int]:
    fields = dict(item.strip().split("=") for item in headers["x-cache"].split(";"))
    return {k: int(v) for k, v in fields.items()}


def _chat(server: ServerProcess, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("audio-media")
    (root / "clip.flac").write_bytes(FLAC)
    return root


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        "--allowed-media-dir", str(folder), "--max-audio-bytes", "2000000",
        "--kv-block-tokens", "16", "--no-warmup", arch="gemma4",
    )  # fmt: skip
    yield proc
    assert proc.stop(), proc.log()


def _logprobs(response: httpx.Response) -> list[float]:
    return [t["logprob"] for t in response.json()["choices"][0]["logprobs"]["content"]]


def test_same_samples_in_any_delivery_answer_the_same_from_one_entry(
    server: ServerProcess, folder: Path
) -> None:
    """Invariant: WAV, FLAC and a FLAC path of the same samples answer alike (token logprobs
    equal); the repeats run no tower and take the prompt's blocks over the clip from the
    cache; another question about the clip hits the audio-feature entry."""
    first = _chat(server, _body(_audio(WAV)))
    assert first.status_code == 200, first.text
    assert _x_cache(first.headers)["vision-misses"] == 1
    flac = _chat(server, _body(_audio(FLAC, "flac")))
    path = _chat(
        server, _body({"type": "audio_url", "audio_url": {"url": str(folder / "clip.flac")}})
    )
    for again in (flac, path):
        assert again.status_code == 200, again.text
        cache = _x_cache(again.headers)
        assert cache["vision-misses"] == 0
        assert cache["cached-tokens"] > cache["prompt-tokens"] // 2
        assert _logprobs(again) == _logprobs(first)
    # The question comes first in the prompt: a new one shares no block with the clip's.
    other = _chat(server, _body(_audio(FLAC, "flac"), question="Who is speaking?"))
    assert other.status_code == 200, other.text
    assert _x_cache(other.headers)["vision-hits"] == 1
    assert _x_cache(other.headers)["vision-misses"] == 0


def test_responses_input_audio(server: ServerProcess) -> None:
    """Invariant: a Responses `input_audio` content part is answered (the same loader), its
    soft tokens in the prompt."""
    body = {
        "model": "test",
        "max_output_tokens": 4,
        "temperature": 0,
        "input": [
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "What is said?"}, _audio(WAV)],
            }
        ],
    }
    r = httpx.post(server.base_url + "/v1/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["status"] in ("completed", "incomplete"), answer  # incomplete: 4 tokens
    assert answer["usage"]["input_tokens"] > 1.5 * 1000 / 40  # the clip's soft tokens count


def _wav_header_rate(rate: int) -> bytes:
    """A 16-bit mono WAV of one second of silence whose header claims `rate` Hz."""
    import struct

    data = b"\x00\x00" * 1000
    fmt = struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", 36 + len(data))
        + b"WAVEfmt "
        + fmt
        + b"data"
        + (struct.pack("<I", len(data)) + data)
    )


LONG = encode(np.zeros(31 * 8000, dtype=np.float32), 8000, "wav")  # 31 s: the model reads 30
HOSTILE = [
    ("garbage", _body(_audio(b"not audio at all" * 40)), "content[1].input_audio.data"),
    ("truncated", _body(_audio(WAV[:30])), "content[1].input_audio.data"),
    ("empty", _body(_audio(encode(np.zeros(0, np.float32), 16000))), "content[1].input_audio.data"),
    ("too-long", _body(_audio(LONG)), "content[1].input_audio.data"),
    ("bad-format", _body(_audio(WAV, "midi")), "content[1].input_audio.format"),
    ("rate", _body(_audio(_wav_header_rate(1_000_000))), "content[1].input_audio.data"),
    ("no-data", _body({"type": "input_audio", "input_audio": {"format": "wav"}}), "data"),
    ("path-outside", _body({"type": "audio_url", "audio_url": {"url": "/etc/passwd"}}), "url"),
    ("ssrf", _body({"type": "audio_url", "audio_url": {"url": "http://127.0.0.1:1/a"}}), "url"),
]


@pytest.mark.parametrize(("name", "body", "param"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_audio_gets_a_400_naming_the_part(
    server: ServerProcess, name: str, body: dict, param: str
) -> None:
    """Invariant: a 400 OpenAI error whose `param` is the audio part's field."""
    r = _chat(server, body)
    assert r.status_code == 400, (name, r.text[:400])
    error = r.json()["error"]
    assert error["message"].strip() and error["param"].endswith(param), error


def test_model_without_audio_tower_refuses_audio() -> None:
    """Invariant: a model without an audio tower answers an audio part with a 400 naming the
    part (the audio is never silently dropped)."""
    proc = ServerProcess("--no-warmup", arch="qwen2_vl")
    try:
        r = _chat(proc, _body(_audio(WAV)))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "messages[0].content[1].input_audio.data", error
        assert "audio" in error["message"]
    finally:
        assert proc.stop(), proc.log()
