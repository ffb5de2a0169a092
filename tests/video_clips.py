"""Small video clips made at test time with PyAV (no fixture files).

`clip_bytes` encodes RGB frames losslessly (PNG or FFV1 in a chosen container) so that the
decoded frames equal the input pixels exactly; `lossy_clip` uses H.264 for realistic input.
"""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

LOSSLESS = {"mov": ("png", "rgb24"), "mkv": ("ffv1", "bgr0"), "avi": ("png", "rgb24")}


def noise_frames(count: int, width: int = 64, height: int = 48, seed: int = 0) -> np.ndarray:
    """(count, height, width, 3) uint8 frames of smooth-ish random colour blocks."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (count, max(height // 8, 1), max(width // 8, 1), 3), np.uint8)
    return np.ascontiguousarray(small.repeat(8, axis=1).repeat(8, axis=2)[:, :height, :width])


def clip_bytes(frames: np.ndarray, fps: int = 4, container: str = "mov") -> bytes:
    """Encode (T, H, W, 3) uint8 frames losslessly at `fps` into `container` bytes."""
    import av

    codec, pix_fmt = LOSSLESS[container]
    out = io.BytesIO()
    with av.open(out, mode="w", format={"mkv": "matroska"}.get(container, container)) as c:
        stream = c.add_stream(codec, rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = pix_fmt
        stream.time_base = Fraction(1, fps)
        for i, pixels in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
            frame.pts = i
            frame.time_base = Fraction(1, fps)
            for packet in stream.encode(frame):
                c.mux(packet)
        for packet in stream.encode():
            c.mux(packet)
    return out.getvalue()


def lossy_clip(frames: np.ndarray, fps: int = 4, crf: int = 23) -> bytes:
    """H.264 in MP4 (lossy: decoded pixels differ from `frames`)."""
    import av

    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as c:
        stream = c.add_stream("libx264", rate=fps, options={"crf": str(crf)})
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        for pixels in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
            for packet in stream.encode(frame):
                c.mux(packet)
        for packet in stream.encode():
            c.mux(packet)
    return out.getvalue()
