"""Encoded audio bytes (WAV, FLAC, MP3, Ogg, ... anything FFmpeg reads) -> mono float32 PCM
at the model's rate, and its content hash (PyAV / FFmpeg).

Identity: `content_hash` is xxh3-128 over the rate and the decoded, resampled samples
(float32 bytes), so the same sound delivered as WAV or FLAC (lossless: the same samples) is
one cache entry, and a lossy re-encode (other samples) is another, as a JPEG re-encode is for
images. Decoding is FFmpeg's: every channel averaged into one, resampled with its
`swresample` (the same input samples give the same output samples whatever the container's
packet sizes).

Limits (every refusal a 400 `APIError`): the encoded size is checked by the caller; the
length (`max_seconds`, from the container's header when it says, else while decoding; at
least `MIN_SECONDS`), the source's sample rate (at most `MAX_SOURCE_RATE`), a codec FFmpeg
has no decoder for, emptiness (no audio stream, no samples) and samples that are not finite
here; a corrupt stream is a 400 naming the failure.
Blocking: run in a worker thread.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field

import numpy as np
import xxhash

from gateway.errors import invalid

MAX_SOURCE_RATE = 192_000  # Hz: studio rates; more is a decoding cost, not a better clip
# An audio tower reads feature frames of 10 ms hops (Gemma 4: one soft token per 40 ms); a
# clip under one hop has no frame and broke the tower (a 500). 50 ms is shorter than any
# spoken sound, so nothing a model could read is refused.
MIN_SECONDS = 0.05
# The `format` values OpenAI's `input_audio` documents (wav, mp3) and the ones FFmpeg reads
# as well that clients send; the container is probed from the bytes, this only gates names.
AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg", "opus", "m4a", "aac", "webm")


@dataclass(frozen=True)
class DecodedAudio:
    """One decoded clip: `samples` mono float32 at `rate` Hz (read-only, shared by the memo:
    treat as immutable), its `content_hash` (module doc), where it came from (`source`:
    "data", "url" or "path") and what decoding and hashing cost."""

    samples: np.ndarray = field(repr=False)
    rate: int
    content_hash: str
    source: str
    decode_seconds: float
    hash_seconds: float

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate

    @property
    def nbytes(self) -> int:
        return int(self.samples.nbytes)


def audio_hash(samples: np.ndarray, rate: int) -> str:
    """xxh3-128 of the rate and the float32 samples (32 hex digits)."""
    h = xxhash.xxh3_128()
    h.update(f"audio:{rate}:".encode())
    h.update(np.ascontiguousarray(samples, dtype=np.float32).tobytes())
    return h.hexdigest()


def decode_audio(data: bytes, rate: int, max_seconds: float, source: str) -> DecodedAudio:
    """Decode, downmix and resample `data` to `rate` Hz; APIError for bytes that hold no
    readable audio, no samples, or more than `max_seconds` of it."""
    import av  # PyAV: imported here, so that loading the module costs nothing

    start = time.perf_counter()
    try:
        container = av.open(io.BytesIO(data), mode="r")
    except (av.FFmpegError, ValueError, OSError) as exc:
        raise invalid(f"could not read the audio: {exc}", code="invalid_audio") from None
    try:
        if not container.streams.audio:
            raise invalid("the file holds no audio stream", code="invalid_audio")
        stream = container.streams.audio[0]
        if stream.codec_context is None:  # (PyAV: then even `sample_rate` raises)
            raise invalid(
                "the audio's codec is unknown or broken (FFmpeg has no decoder for it); send "
                f"one of {', '.join(AUDIO_FORMATS)}",
                code="invalid_audio",
            )
        source_rate = int(stream.sample_rate or stream.codec_context.sample_rate or 0)
        if not 0 < source_rate <= MAX_SOURCE_RATE:
            raise invalid(
                f"the audio's sample rate is {source_rate} Hz; this server reads 1 to "
                f"{MAX_SOURCE_RATE} Hz",
                code="invalid_audio",
            )
        if stream.duration is not None and stream.time_base is not None:
            header_seconds = float(stream.duration * stream.time_base)
            _check_length(header_seconds, max_seconds)
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        chunks: list[np.ndarray] = []
        count = 0
        try:
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunk = out.to_ndarray().reshape(-1)
                    chunks.append(chunk)
                    count += chunk.size
                _check_length(count / rate, max_seconds)
            for out in resampler.resample(None):  # the resampler's tail
                chunks.append(out.to_ndarray().reshape(-1))
        except (av.FFmpegError, ValueError) as exc:
            raise invalid(f"could not decode the audio: {exc}", code="invalid_audio") from None
    finally:
        container.close()
    samples = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    if samples.size == 0:
        raise invalid("the audio holds no samples", code="empty_audio")
    if not np.isfinite(samples).all():  # (a float WAV may; the answer's logprobs went NaN)
        raise invalid(
            "the audio holds NaN or infinite samples; send PCM or finite float samples",
            code="invalid_audio",
        )
    if samples.size < MIN_SECONDS * rate:
        raise invalid(
            f"the audio is {samples.size / rate * 1000:.1f} ms long; send at least "
            f"{MIN_SECONDS * 1000:g} ms",
            code="audio_too_short",
        )
    _check_length(samples.size / rate, max_seconds)
    samples.setflags(write=False)
    decoded = time.perf_counter()
    digest = audio_hash(samples, rate)
    return DecodedAudio(
        samples, rate, digest, source, decoded - start, time.perf_counter() - decoded
    )


def _check_length(seconds: float, max_seconds: float) -> None:
    if seconds > max_seconds:
        raise invalid(
            f"the audio is at least {seconds:.1f} s long, over the limit of {max_seconds:g} s "
            "per clip (the limit is set by --max-audio-seconds and by the model)",
            code="audio_too_long",
        )
