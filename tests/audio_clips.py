"""Deterministic test sounds and their encodings (WAV: 16-bit PCM; FLAC: lossless, so the
same samples), for the audio tests (engine-level and end to end)."""

from __future__ import annotations

import io

import numpy as np


def chirp(seconds: float, rate: int, pitch: float = 440.0) -> np.ndarray:
    """A rising tone with a little harmonic, mono float32 in [-0.52, 0.52]."""
    t = np.arange(int(seconds * rate)) / rate
    tone = np.sin(2 * np.pi * pitch * t * (1 + t)) + 0.3 * np.sin(2 * np.pi * 3 * pitch * t)
    return (0.4 * tone).astype(np.float32)


def encode(samples: np.ndarray, rate: int, container: str = "wav") -> bytes:
    """`samples` as 16-bit PCM in a WAV file, or FLAC-compressed (`container` "flac")."""
    import av

    codec = {"wav": "pcm_s16le", "flac": "flac"}[container]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        pcm = np.round(samples * 32767).astype(np.int16)[None]
        if pcm.size:
            frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()
