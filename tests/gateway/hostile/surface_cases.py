"""Hostile requests against the newest surfaces, each with the exact answer it must get (the
table test is test_new_surfaces.py, against a pool of chat, audio, embedding and reranker
models): `/v1/embeddings`, `/v1/rerank` and `/v2/rerank`; audio parts (`input_audio`,
`audio_url`) in Chat Completions, Responses and (refused there) Anthropic Messages; the
`model` field naming an unknown, aliased or wrong-task model; the admin model endpoints and
`?model=` on the cache endpoints.

Strings may hold {media} (the allowed media dir, holding `clip.wav` and `notes.txt`).
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from audio_clips import chirp, encode
from support import data_uri, noise_png, png_claiming

from tests.gateway.hostile.server import METRICS_KEY, Case

ADMIN = {"Authorization": f"Bearer {METRICS_KEY}"}
EMBED = "/v1/embeddings"
RERANK = "/v1/rerank"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
PNG = noise_png(5, 28, 28)
WAV = encode(chirp(0.5, 16000), 16000, "wav")
TEN_MINUTES = encode(np.zeros(600 * 1000, np.float32), 1000, "wav")  # --max-audio-seconds 5


@dataclass(frozen=True)
class SurfaceCase(Case):
    """A `Case` whose error message must also contain `says` (what to fix), when set."""

    says: str | None = None


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def wav(rate: int, samples: int, channels: int = 1, bits: int = 16, tag: int = 1) -> bytes:
    """A WAV of `samples` frames of silence whose header says what the arguments say (any
    of them may be nonsense: 0 bits, an unknown format tag)."""
    block = max(1, channels * bits // 8)
    data = b"\x00" * (samples * block)
    fmt = struct.pack("<IHHIIHH", 16, tag, channels, rate, rate * block, block, bits)
    head = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + fmt
    return head + b"data" + struct.pack("<I", len(data)) + data


def float_wav(samples: np.ndarray, rate: int = 16000) -> bytes:
    """`samples` as a 32-bit float WAV (format tag 3), NaN and infinities kept."""
    data = np.asarray(samples, "<f4").tobytes()
    fmt = struct.pack("<IHHIIHH", 16, 3, 1, rate, rate * 4, 4, 32)
    head = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + fmt
    return head + b"data" + struct.pack("<I", len(data)) + data


def audio(data: Any, fmt: Any = "wav") -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}


def audio_url(url: Any) -> dict[str, Any]:
    return {"type": "audio_url", "audio_url": {"url": url}}


def image_part(url: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def chat(model: str, *parts: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": "What is said?"}, *parts]
    return {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": content}]}


def responses(model: str, *parts: Any) -> dict[str, Any]:
    content = [{"type": "input_text", "text": "What is said?"}, *parts]
    return {"model": model, "max_output_tokens": 2, "input": [{"role": "user", "content": content}]}


def messages(model: Any, *blocks: Any) -> dict[str, Any]:
    content: Any = list(blocks) if blocks else "hi"
    return {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": content}]}


def embed(model: str = "text", **fields: Any) -> dict[str, Any]:
    return {"model": model, "input": "a sentence", **fields}


def rerank(model: str = "rerank", **fields: Any) -> dict[str, Any]:
    return {"model": model, "query": "a query", "documents": ["one", "two"], **fields}


def e(body: Any, param: str | None, status: int = 400, **kw: Any) -> SurfaceCase:
    return SurfaceCase(body, status, param=param, path=EMBED, **kw)


def r(
    body: Any, param: str | None, status: int = 400, path: str = RERANK, **kw: Any
) -> SurfaceCase:
    return SurfaceCase(body, status, param=param, path=path, **kw)


AT = "messages[0].content[1]"
DATA = f"{AT}.input_audio.data"
RDATA = "input[0].content[1].input_audio.data"

EMBED_CASES: list[Any] = [
    pytest.param(e({"model": "text"}, "input"), id="embed-no-input"),
    pytest.param(e(embed(input=None), "input"), id="embed-input-null"),
    pytest.param(e(embed(input=5), "input"), id="embed-input-number"),
    pytest.param(e(embed(input=True), "input"), id="embed-input-bool"),
    pytest.param(e(embed(input={"text": "a"}), "input.type"), id="embed-input-object-no-type"),
    pytest.param(e(embed(input=[]), "input", says="empty"), id="embed-input-empty-list"),
    pytest.param(e(embed(input=""), "input", says="empty"), id="embed-input-empty-string"),
    pytest.param(e(embed(input=["ok", ""]), "input[1]"), id="embed-second-input-empty"),
    pytest.param(e(embed(input=[[]]), "input[0]"), id="embed-input-list-of-empty-list"),
    pytest.param(e(embed(input=[None]), "input[0]"), id="embed-input-list-of-null"),
    pytest.param(e(embed(input=["a", 1]), "input[1]"), id="embed-input-mixed-types"),
    pytest.param(e(embed(input=[1.0, 2.5]), "input[0]"), id="embed-token-ids-floats"),
    pytest.param(e(embed(input=[5, -1]), "input[1]", says="token id"), id="embed-negative-id"),
    pytest.param(e(embed(input=[[5, 2**40]]), "input[0][1]", says="token id"), id="embed-huge-id"),
    pytest.param(e(embed(input=[2**31 - 1]), "input", says="vocabulary"), id="embed-id-over-vocab"),
    pytest.param(e(embed(input=[5] * 9000), "input", says="over this model"), id="embed-too-long"),
    pytest.param(e(embed(input=["a"] * 2049), "input", says="2048"), id="embed-2049-inputs"),
    pytest.param(e(embed(input="\ud800"), "input", says="surrogate"), id="embed-lone-surrogate"),
    pytest.param(e(embed(encoding_format="int8"), "encoding_format"), id="embed-format-unknown"),
    pytest.param(e(embed(encoding_format=1), "encoding_format"), id="embed-format-number"),
    pytest.param(e(embed(encoding_format={}), "encoding_format"), id="embed-format-empty-object"),
    pytest.param(e(embed(encoding_format=""), "encoding_format"), id="embed-format-empty-string"),
    pytest.param(e(embed(encoding_format=False), "encoding_format"), id="embed-format-false"),
    pytest.param(e(embed(dimensions=0), "dimensions"), id="embed-dimensions-zero"),
    pytest.param(e(embed(dimensions=-3), "dimensions"), id="embed-dimensions-negative"),
    pytest.param(e(embed(dimensions=1.5), "dimensions"), id="embed-dimensions-float"),
    pytest.param(e(embed(dimensions="8"), "dimensions"), id="embed-dimensions-string"),
    pytest.param(e(embed(dimensions=True), "dimensions"), id="embed-dimensions-bool"),
    pytest.param(e(embed(dimensions=10**30), "dimensions"), id="embed-dimensions-huge"),
    pytest.param(e(embed(dimensions=1e300), "dimensions"), id="embed-dimensions-1e300"),
    pytest.param(e(embed(dimensions=65), "dimensions", says="1..64"), id="embed-dimensions-over"),
    pytest.param(e(embed(user=7), "user"), id="embed-user-number"),
    pytest.param(e(embed(keep_alive="forever"), "keep_alive"), id="embed-keep-alive-word"),
    pytest.param(e(embed(cache_salt=""), "cache_salt"), id="embed-cache-salt-empty"),
    pytest.param(e(embed(model=None), "model"), id="embed-model-null"),
    pytest.param(e(embed(model=["text"]), "model"), id="embed-model-list"),
    pytest.param(
        e(embed(model="nope"), "model", 404, code="model_not_found", says="`text`"),
        id="embed-unknown-model-lists-served",
    ),
    pytest.param(e(embed(model="chat"), "model", code="model_task_mismatch"), id="embed-chat"),
    pytest.param(e(embed(model="audio"), "model", code="model_task_mismatch"), id="embed-audio"),
    pytest.param(e(embed(model="rerank"), "model", says="/v1/rerank"), id="embed-to-reranker"),
    pytest.param(e(b"{", None), id="embed-malformed-json"),
    pytest.param(e(b"null", None, says="JSON object"), id="embed-json-null-body"),
    pytest.param(e([embed()], None), id="embed-array-body"),
    pytest.param(e(embed(), None, 401, headers={}), id="embed-no-key"),
    # images: to a text-only embedder, broken, hostile, too many
    pytest.param(
        e(
            embed(input=[image_part(data_uri(PNG))]),
            "input[0].image_url.url",
            code="unsupported_image",
        ),
        id="embed-image-to-text-only-model",
    ),
    pytest.param(
        e(embed("vl", input=[image_part("data:image/png;base64,@@@@")]), "input[0].image_url.url"),
        id="embed-image-bad-base64",
    ),
    pytest.param(
        e(
            embed("vl", input=[image_part("data:image/png;base64," + b64(b"text"))]),
            "input[0].image_url.url",
        ),
        id="embed-image-not-an-image",
    ),
    pytest.param(
        e(embed("vl", input=[image_part(data_uri(WAV, "audio/wav"))]), "input[0].image_url.url"),
        id="embed-image-that-is-audio",
    ),
    pytest.param(
        e(embed("vl", input=[{"type": "image_url", "image_url": None}]), "input[0].image_url.url"),
        id="embed-image-url-null",
    ),
    pytest.param(
        e(
            embed("vl", input=[[{"type": "text", "text": "a"}, image_part(7)]]),
            "input[0][1].image_url.url",
        ),
        id="embed-image-url-number-in-parts",
    ),
    pytest.param(
        e(
            embed("vl", input=[image_part(data_uri(png_claiming(100_000, 100_000)))]),
            "input[0].image_url.url",
            413,
            code="too_large",
        ),
        id="embed-image-claiming-ten-gigapixels",
    ),
    pytest.param(
        r(
            rerank("vlrerank", query={"text": "q", "image": data_uri(png_claiming(0, 5))}),
            "query.image",
        ),
        id="rerank-query-image-of-zero-width",
    ),
    pytest.param(
        e(embed("vl", input=[image_part("http://127.0.0.1:1/a.png")]), "input[0].image_url.url"),
        id="embed-image-ssrf",
    ),
    pytest.param(
        e(embed("vl", input=[image_part("/etc/passwd")]), "input[0].image_url.url"),
        id="embed-image-path-outside",
    ),
    pytest.param(
        e(embed("vl", input=[image_part(data_uri(PNG))] * 3), None, code="too_many_images"),
        id="embed-three-images-over-cap",
    ),
    pytest.param(e(embed("vl", input=[audio(b64(WAV))]), "input[0].type"), id="embed-audio-part"),
    pytest.param(
        e(embed("vl", input={"type": "text", "text": ""}), "input", says="empty"),
        id="embed-one-empty-text-part",
    ),
    pytest.param(
        e(embed("vl", input=["ok", [{"type": "text", "text": ""}] * 2]), "input[1]", says="empty"),
        id="embed-input-of-empty-text-parts",
    ),
    pytest.param(
        e(embed("vl", input=[{"type": "text", "text": 5}]), "input[0].text"), id="embed-text-number"
    ),
    pytest.param(
        e(embed("vl", input=[[{"type": "text", "text": "a"}, 5]]), "input[0]"),
        id="embed-part-number",
    ),
    pytest.param(
        e(embed("vl", input="<|image_pad|>"), "input", says="placeholder"),
        id="embed-text-spelling-a-placeholder",
    ),
]

RERANK_CASES: list[Any] = [
    pytest.param(r(b"null", None, says="JSON object"), id="rerank-json-null-body"),
    pytest.param(r(["a"], None, path="/v2/rerank", says="JSON object"), id="rerank-v2-array-body"),
    pytest.param(r("query", None, says="JSON object"), id="rerank-json-string-body"),
    pytest.param(r({"model": "rerank", "documents": ["a"]}, "query"), id="rerank-no-query"),
    pytest.param(r(rerank(query=3), "query"), id="rerank-query-number"),
    pytest.param(r(rerank(query="   "), "query"), id="rerank-query-blank"),
    pytest.param(r(rerank(query="\udfff"), "query", says="surrogate"), id="rerank-query-surrogate"),
    pytest.param(r(rerank(query={}), "query"), id="rerank-query-empty-object"),
    pytest.param(r(rerank(documents="one"), "documents"), id="rerank-documents-string"),
    pytest.param(r(rerank(documents=[]), "documents"), id="rerank-documents-empty"),
    pytest.param(r(rerank(documents=None), "documents"), id="rerank-documents-null"),
    pytest.param(r(rerank(documents=["a", None]), "documents[1]"), id="rerank-document-null"),
    pytest.param(
        r(rerank(documents=[{"text": 1}]), "documents[0].text"), id="rerank-doc-text-number"
    ),
    pytest.param(
        r(rerank(documents=["a"] * 1001), "documents", says="1000"), id="rerank-1001-docs"
    ),
    pytest.param(r(rerank(documents=["w " * 9000]), "documents[0]"), id="rerank-document-too-long"),
    pytest.param(r(rerank(top_n=0), "top_n"), id="rerank-top-n-zero"),
    pytest.param(r(rerank(top_n=-1), "top_n"), id="rerank-top-n-negative"),
    pytest.param(r(rerank(top_n=1.5), "top_n"), id="rerank-top-n-float"),
    pytest.param(r(rerank(top_n=2**70), "top_n"), id="rerank-top-n-huge"),
    pytest.param(
        r(rerank(return_documents="yes"), "return_documents"), id="rerank-return-docs-string"
    ),
    pytest.param(r(rerank(instruction=5), "instruction"), id="rerank-instruction-number"),
    pytest.param(
        r(rerank(max_chunks_per_doc=2), "max_chunks_per_doc"), id="rerank-chunking-refused"
    ),
    pytest.param(r(rerank("text"), "model", code="model_task_mismatch"), id="rerank-to-embedder"),
    pytest.param(r(rerank("chat"), "model", code="model_task_mismatch"), id="rerank-to-chat-model"),
    pytest.param(
        r(rerank("nope"), "model", 404, path="/v2/rerank", code="model_not_found"),
        id="rerank-v2-unknown",
    ),
    pytest.param(
        r(
            rerank(documents=[{"image_url": {"url": data_uri(PNG)}}]),
            "documents[0].image_url",
            code="unsupported_image",
        ),
        id="rerank-image-to-text-only-reranker",
    ),
    pytest.param(
        r(
            rerank("vlrerank", documents=[{"image": "data:image/png;base64,%%%"}]),
            "documents[0].image",
        ),
        id="rerank-image-bad-base64",
    ),
    pytest.param(
        r(rerank("vlrerank", documents=[{"image": 5}]), "documents[0].image"),
        id="rerank-image-number",
    ),
    pytest.param(
        r(rerank("vlrerank", documents=[{"image_url": {}}]), "documents[0].image_url"),
        id="rerank-image-no-url",
    ),
    pytest.param(
        r(
            rerank("vlrerank", documents=[{"image": data_uri(PNG)}] * 3),
            None,
            code="too_many_images",
        ),
        id="rerank-three-images-over-cap",
    ),
]

AUDIO_CASES: list[Any] = [
    pytest.param(
        SurfaceCase(chat("chat", audio(b64(WAV))), param=DATA, code="unsupported_audio"),
        id="audio-to-model-without-audio-tower",
    ),
    pytest.param(
        SurfaceCase(
            chat("chat-alias", audio_url("{media}/clip.wav")),
            param=f"{AT}.audio_url.url",
            code="unsupported_audio",
        ),
        id="audio-url-to-alias-without-audio-tower",
    ),
    pytest.param(
        SurfaceCase(
            responses("chat", audio(b64(WAV))),
            param=RDATA,
            path=RESPONSES,
            code="unsupported_audio",
        ),
        id="responses-audio-to-model-without-audio-tower",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio("@@@not base64")), param=DATA, code="invalid_data_uri"),
        id="audio-bad-base64",
    ),
    pytest.param(
        SurfaceCase(
            chat("audio", audio("data:audio/wav;base64," + b64(WAV))),
            param=DATA,
            says="base64 alone",
        ),
        id="audio-data-uri-inside-data",
    ),
    pytest.param(SurfaceCase(chat("audio", audio(5)), param=DATA), id="audio-data-number"),
    pytest.param(SurfaceCase(chat("audio", audio(None)), param=DATA), id="audio-data-null"),
    pytest.param(SurfaceCase(chat("audio", audio("")), param=DATA), id="audio-data-empty"),
    pytest.param(SurfaceCase(chat("audio", audio([b64(WAV)])), param=DATA), id="audio-data-list"),
    pytest.param(
        SurfaceCase(chat("audio", audio(b64(WAV), None)), param=f"{AT}.input_audio.format"),
        id="audio-format-null",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio(b64(WAV), 3)), param=f"{AT}.input_audio.format"),
        id="audio-format-number",
    ),
    pytest.param(
        SurfaceCase(
            chat("audio", audio(b64(WAV), "midi")), param=f"{AT}.input_audio.format", says="wav"
        ),
        id="audio-format-unknown",
    ),
    pytest.param(
        SurfaceCase(
            chat("audio", {"type": "input_audio", "input_audio": "x"}), param=f"{AT}.input_audio"
        ),
        id="input-audio-string",
    ),
    pytest.param(
        SurfaceCase(chat("audio", {"type": "input_audio"}), param=f"{AT}.input_audio"),
        id="input-audio-missing",
    ),
    pytest.param(
        SurfaceCase(
            chat("audio", audio(b64(b"not audio at all" * 20))), param=DATA, code="invalid_audio"
        ),
        id="audio-not-audio",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio(b64(PNG))), param=DATA, code="invalid_audio"),
        id="audio-that-is-a-png",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio(b64(WAV[:30]))), param=DATA), id="audio-truncated-header"
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio(b64(wav(16000, 0)))), param=DATA, code="empty_audio"),
        id="wav-of-zero-samples",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio(b64(wav(16000, 1)))), param=DATA, code="audio_too_short"),
        id="wav-of-one-sample",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio(b64(wav(16000, 100)))), param=DATA, code="audio_too_short"),
        id="wav-of-6-ms",
    ),
    pytest.param(
        SurfaceCase(
            chat("audio", audio(b64(wav(16000, 100, bits=0)))),
            param=DATA,
            code="invalid_audio",
            says="codec",
        ),
        id="wav-of-zero-bits",
    ),
    pytest.param(
        SurfaceCase(
            chat("audio", audio(b64(wav(16000, 100, tag=99)))),
            param=DATA,
            code="invalid_audio",
            says="codec",
        ),
        id="wav-of-unknown-codec",
    ),
    pytest.param(
        SurfaceCase(
            chat("audio", audio(b64(wav(16000, 100, channels=0)))), param=DATA, code="invalid_audio"
        ),
        id="wav-of-zero-channels",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio(b64(wav(0, 100)))), param=DATA, code="invalid_audio"),
        id="wav-at-zero-hz",
    ),
    pytest.param(
        SurfaceCase(
            chat("audio", audio(b64(wav(1_000_000, 100)))), param=DATA, code="invalid_audio"
        ),
        id="wav-at-a-megahertz",
    ),
    pytest.param(
        SurfaceCase(
            chat("audio", audio(b64(float_wav(np.full(8000, np.nan))))) | {"logprobs": True},
            param=DATA,
            code="invalid_audio",
            says="NaN",
        ),
        id="float-wav-of-nan",
    ),
    pytest.param(
        SurfaceCase(
            chat("audio", audio(b64(float_wav(np.full(8000, -np.inf))))) | {"logprobs": True},
            param=DATA,
            code="invalid_audio",
        ),
        id="float-wav-of-minus-infinity",
    ),
    pytest.param(
        SurfaceCase(
            responses("audio", audio(b64(float_wav(np.where(np.arange(8000) % 7, 0.1, np.nan))))),
            param=RDATA,
            path=RESPONSES,
            code="invalid_audio",
        ),
        id="responses-float-wav-with-some-nan",
    ),
    pytest.param(
        SurfaceCase(
            chat("audio", audio(b64(TEN_MINUTES))),
            param=DATA,
            code="audio_too_long",
            says="--max-audio-seconds",
        ),
        id="ten-minute-clip",
    ),
    pytest.param(
        SurfaceCase(
            responses("audio", audio(b64(TEN_MINUTES))),
            param=RDATA,
            path=RESPONSES,
            code="audio_too_long",
        ),
        id="responses-ten-minute-clip",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio(b64(WAV + b"\x00" * 2_100_000))), 413, "too_large"),
        id="audio-over-max-audio-bytes",
    ),
    pytest.param(
        SurfaceCase(chat("audio", *[audio(b64(WAV))] * 3), code="too_many_images"),
        id="three-clips-over-cap",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio_url(None)), param=f"{AT}.audio_url.url"),
        id="audio-url-null",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio_url("ftp://x/a.wav")), param=f"{AT}.audio_url.url"),
        id="audio-url-ftp",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio_url("a.wav")), param=f"{AT}.audio_url.url"),
        id="audio-url-relative",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio_url("/etc/passwd")), param=f"{AT}.audio_url.url"),
        id="audio-url-outside",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio_url("{media}/none.wav")), param=f"{AT}.audio_url.url"),
        id="audio-url-missing-file",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio_url("{media}")), param=f"{AT}.audio_url.url"),
        id="audio-url-directory",
    ),
    pytest.param(
        SurfaceCase(
            chat("audio", audio_url("{media}/notes.txt")),
            param=f"{AT}.audio_url.url",
            code="invalid_audio",
        ),
        id="audio-url-text-file",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio_url("{media}/pipe.wav")), param=f"{AT}.audio_url.url"),
        id="audio-url-fifo",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio_url("{media}/passwd.wav")), param=f"{AT}.audio_url.url"),
        id="audio-url-symlink-out-of-the-allowed-dir",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio_url("http://[::1]:1/a.wav")), param=f"{AT}.audio_url.url"),
        id="audio-url-ssrf",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio_url(data_uri(PNG))), param=f"{AT}.audio_url.url"),
        id="audio-url-image-data-uri",
    ),
    pytest.param(
        SurfaceCase(chat("audio", audio_url("data:audio/wav,raw")), param=f"{AT}.audio_url.url"),
        id="audio-url-not-base64",
    ),
    pytest.param(
        SurfaceCase(
            chat("audio", image_part(data_uri(WAV, "audio/wav"))), param=f"{AT}.image_url.url"
        ),
        id="audio-sent-as-image",
    ),
    pytest.param(
        SurfaceCase(
            responses("audio", {"type": "input_audio", "data": b64(WAV)}),
            param="input[0].content[1].input_audio",
            path=RESPONSES,
        ),
        id="responses-input-audio-flat",
    ),
    pytest.param(
        SurfaceCase(
            responses("audio", audio(b64(b"x" * 64))),
            param=RDATA,
            path=RESPONSES,
            code="invalid_audio",
        ),
        id="responses-audio-not-audio",
    ),
    # Anthropic's Messages API has no audio block: refused in its own error shape
    pytest.param(
        SurfaceCase(messages("audio", audio(b64(WAV))), path=MESSAGES, says="content[0].type"),
        id="messages-input-audio-block",
    ),
    pytest.param(
        SurfaceCase(
            messages(
                "audio",
                {
                    "type": "audio",
                    "source": {"type": "base64", "media_type": "audio/wav", "data": b64(WAV)},
                },
            ),
            path=MESSAGES,
        ),
        id="messages-audio-block",
    ),
]

POOL_CASES: list[Any] = [
    pytest.param(
        SurfaceCase(chat("nope"), 404, "model_not_found", "model"), id="chat-unknown-model"
    ),
    pytest.param(
        SurfaceCase(chat("text"), code="model_task_mismatch", param="model"), id="chat-to-embedder"
    ),
    pytest.param(
        SurfaceCase(chat("vl-alias"), code="model_task_mismatch", param="model", says="`vl`"),
        id="chat-to-embedder-alias",
    ),
    pytest.param(
        SurfaceCase(chat("rerank"), code="model_task_mismatch", param="model"),
        id="chat-to-reranker",
    ),
    pytest.param(
        SurfaceCase(responses("nope"), 404, "model_not_found", "model", path=RESPONSES),
        id="responses-unknown-model",
    ),
    pytest.param(
        SurfaceCase(responses("text"), code="model_task_mismatch", param="model", path=RESPONSES),
        id="responses-to-embedder",
    ),
    pytest.param(
        SurfaceCase(messages("nope"), 404, path=MESSAGES, says="does not exist"),
        id="messages-unknown-model",
    ),
    pytest.param(
        SurfaceCase(messages("vl"), path=MESSAGES, says="embedding model"),
        id="messages-to-embedder",
    ),
    pytest.param(SurfaceCase(messages(5), path=MESSAGES, says="model"), id="messages-model-number"),
    # the admin model endpoints
    pytest.param(
        SurfaceCase(None, 401, "invalid_api_key", headers={}, path="/v1/models/text/load"),
        id="load-without-key",
    ),
    pytest.param(
        SurfaceCase(None, 403, "admin_key_required", path="/v1/models/text/load"),
        id="load-with-tenant-key",
    ),
    pytest.param(
        SurfaceCase(None, 403, "admin_key_required", path="/v1/models/text/unload"),
        id="unload-with-tenant-key",
    ),
    pytest.param(
        SurfaceCase(
            None, 404, "model_not_found", "model", headers=ADMIN, path="/v1/models/nope/load"
        ),
        id="load-unknown",
    ),
    pytest.param(
        SurfaceCase(
            None, 404, "model_not_found", "model", headers=ADMIN, path="/v1/models/nope/unload"
        ),
        id="unload-unknown",
    ),
    pytest.param(
        SurfaceCase(None, 404, "model_not_found", "model", headers=ADMIN, path="/v1/models//load"),
        id="load-empty-name",
    ),
    pytest.param(
        SurfaceCase(
            None, 404, "model_not_found", "model", headers=ADMIN, path="/v1/models/a/b/load"
        ),
        id="load-name-with-slash",
    ),
    pytest.param(
        SurfaceCase(
            None, 404, "model_not_found", "model", headers=ADMIN, path="/v1/models/%00/load"
        ),
        id="load-nul-name",
    ),
    pytest.param(
        SurfaceCase(None, 404, "model_not_found", "model", method="GET", path="/v1/models/%ff"),
        id="retrieve-name-not-utf8",
    ),
    pytest.param(
        SurfaceCase(
            None, 404, "model_not_found", "model", method="GET", path="/v1/cache/stats?model=%ff%fe"
        ),
        id="stats-model-not-utf8",
    ),
    pytest.param(
        SurfaceCase(
            None, 405, headers=ADMIN, method="GET", path="/v1/models/chat/load", says="POST"
        ),
        id="load-by-get",
    ),
    pytest.param(SurfaceCase(None, 405, method="DELETE", path="/v1/models"), id="models-by-delete"),
    pytest.param(
        SurfaceCase(None, 401, "invalid_api_key", headers={}, method="GET", path="/v1/models"),
        id="models-without-key",
    ),
    pytest.param(
        SurfaceCase(None, 404, "model_not_found", "model", method="GET", path="/v1/models/nope"),
        id="retrieve-unknown-model",
    ),
    # ?model= on the cache endpoints and the dashboard's data
    pytest.param(
        SurfaceCase(
            None, 404, "model_not_found", "model", method="GET", path="/v1/cache/stats?model=nope"
        ),
        id="stats-unknown-model",
    ),
    pytest.param(
        SurfaceCase(
            None, 404, "model_not_found", "model", method="GET", path="/v1/cache/stats?model="
        ),
        id="stats-empty-model",
    ),
    pytest.param(
        SurfaceCase(
            None, 404, "model_not_found", "model", method="GET", path="/v1/cache/entries?model=nope"
        ),
        id="entries-unknown-model",
    ),
    pytest.param(
        SurfaceCase(
            None, 400, param="limit", method="GET", path="/v1/cache/entries?model=vl&limit=x"
        ),
        id="entries-bad-limit",
    ),
    pytest.param(
        SurfaceCase(
            None, 400, param="kind", method="GET", path="/v1/cache/entries?model=vl&kind=zzz"
        ),
        id="entries-bad-kind",
    ),
    pytest.param(
        SurfaceCase(None, 403, "admin_key_required", method="GET", path="/v1/dashboard?model=vl"),
        id="dashboard-data-tenant",
    ),
    pytest.param(
        SurfaceCase(
            None,
            404,
            "model_not_found",
            "model",
            headers=ADMIN,
            method="GET",
            path="/v1/dashboard?model=nope",
        ),
        id="dashboard-data-unknown-model",
    ),
    pytest.param(
        SurfaceCase(None, 403, "admin_key_required", path="/v1/cache/clear?model=vl"),
        id="clear-tenant",
    ),
    pytest.param(
        SurfaceCase(
            None, 404, "model_not_found", "model", headers=ADMIN, path="/v1/cache/clear?model=nope"
        ),
        id="clear-unknown-model",
    ),
]

SURFACE_CASES: list[Any] = [*EMBED_CASES, *RERANK_CASES, *AUDIO_CASES, *POOL_CASES]
