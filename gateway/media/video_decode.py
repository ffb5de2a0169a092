"""Encoded video bytes -> sampled RGB frames and their content hash (PyAV / FFmpeg).

Sampling: one frame every 1/fps seconds of presentation time (the first decoded frame at or
after each target time), at most `max_frames` frames: a clip longer than max_frames / fps
seconds is sampled evenly over its whole length instead. Memory stays bounded while decoding
a clip of unknown length: whenever more than 2 * max_frames frames are kept, every second one
is dropped and the sampling interval doubles.

Identity: `content_hash` is xxh3-128 over the sampling parameters, the kept frames' times (ms)
and their decoded RGB pixels. The same frames in another container or at another bitrate
that decodes to the same pixels hash the same; one changed pixel in one sampled frame does
not. The times are part of the key because they change the prompt (Qwen3-VL's timestamps)
and the positions (Qwen2.5-VL's time axis).

Frames larger than `HELD_PIXELS` are scaled down when sampled (the model's own budget is
smaller still), so a clip costs at most 2 * max_frames * 3 MiB while it is decoded.

Limits (every refusal an `APIError`, 4xx): the encoded size is checked by the caller; the
length (`max_seconds`, from the container's header when it says, else while decoding), the
frame size (`max_pixels` per frame) and the number of decoded frames (`max_seconds` times
240 fps) are checked here. Blocking: run in a worker thread.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import xxhash

from gateway.errors import invalid, too_large

MAX_SOURCE_FPS = 240  # decoded frames per second of clip we are willing to pay for
# Sampled frames are held at most this large (1024 x 1024 worth of pixels); Qwen-VL video
# budgets stop below it (768 merged tokens per frame pair: 602k / 786k pixels).
HELD_PIXELS = 1024 * 1024
VIDEO_MEDIA_TYPES = ("mp4", "webm", "x-matroska", "quicktime", "x-msvideo", "mpeg", "ogg")


@dataclass(frozen=True)
class VideoSampling:
    """How frames are taken from a clip (part of every video's identity)."""

    fps: float
    max_frames: int
    max_seconds: float
    max_pixels: int


@dataclass(frozen=True)
class DecodedVideo:
    """Sampled frames of one clip. `frames` is (T, H, W, 3) uint8 RGB, read-only, shared
    (memo): treat as immutable. `times` are the frames' presentation times in seconds;
    `duration` is the clip's length (seconds, from the header or the last frame)."""

    frames: np.ndarray
    times: tuple[float, ...]
    duration: float
    content_hash: str
    source: str
    decode_seconds: float
    hash_seconds: float

    @property
    def width(self) -> int:
        return int(self.frames.shape[2])

    @property
    def height(self) -> int:
        return int(self.frames.shape[1])

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.frames.nbytes)


def decode_video(data: bytes, sampling: VideoSampling, source: str) -> DecodedVideo:
    """Decode, sample and hash one clip; APIError (4xx) for anything unusable."""
    import av  # FFmpeg binding; imported here so image-only paths never load it

    start = time.perf_counter()
    if not data:
        raise invalid("the video is empty (0 bytes)", code="invalid_video")
    try:
        container = av.open(io.BytesIO(data), mode="r")
    except Exception as exc:  # noqa: BLE001 - FFmpeg's errors are many; all mean bad input
        raise invalid(
            f"could not read the video: {_reason(exc)}; send an MP4, WebM, MKV or MOV clip",
            code="invalid_video",
        ) from None
    with container:
        kind = str(getattr(container.format, "name", ""))
        if kind == "image2" or kind.endswith("_pipe"):  # FFmpeg reads stills as 1-frame clips
            raise invalid(
                f"the file is a still image ({kind.removesuffix('_pipe')}), not a video; send "
                "it as an image_url part",
                code="invalid_video",
            )
        if not container.streams.video:
            raise invalid("the file has no video stream", code="invalid_video")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        header = _header_seconds(container, stream)
        claimed = int(getattr(stream, "frames", 0) or 0)
        if claimed > sampling.max_seconds * MAX_SOURCE_FPS:
            raise too_large(
                f"the video declares {claimed} frames, more than a clip of --max-video-seconds "
                f"{sampling.max_seconds:g} may hold at {MAX_SOURCE_FPS} fps"
            )
        if header is not None and header > sampling.max_seconds:
            raise too_large(_too_long(header, sampling.max_seconds))
        try:
            frames, times, last = _sample(container, stream, sampling, header)
        except av.error.FFmpegError as exc:
            raise invalid(
                f"could not decode the video: {_reason(exc)}", code="invalid_video"
            ) from None
    if not frames:
        raise invalid("the video has no decodable frames", code="invalid_video")
    if len(frames) > sampling.max_frames:  # even spread over the whole clip
        keep = np.linspace(0, len(frames) - 1, sampling.max_frames).round().astype(int)
        frames, times = [frames[i] for i in keep], [times[i] for i in keep]
    stacked = np.stack(frames)
    stacked.flags.writeable = False
    decoded = time.perf_counter()
    digest = video_hash(stacked, times, sampling)
    return DecodedVideo(
        frames=stacked,
        times=tuple(times),
        duration=header if header is not None else last,
        content_hash=digest,
        source=source,
        decode_seconds=decoded - start,
        hash_seconds=time.perf_counter() - decoded,
    )


def video_hash(
    frames: np.ndarray, times: list[float] | tuple[float, ...], sampling: VideoSampling
) -> str:
    """xxh3-128 of (sampling parameters, frame times in ms, shape, RGB bytes of every frame)."""
    h = xxhash.xxh3_128()
    t, height, width, _ = frames.shape
    millis = ",".join(str(round(x * 1000)) for x in times)
    h.update(f"video|fps={sampling.fps!r}|max={sampling.max_frames}|{t}x{height}x{width}|".encode())
    h.update(millis.encode())
    h.update(np.ascontiguousarray(frames).data)
    return "v" + h.hexdigest()


def _sample(
    container: object, stream: object, sampling: VideoSampling, header: float | None
) -> tuple[list[np.ndarray], list[float], float]:
    """Decode in order, keeping the first frame at or after each target time."""
    interval = 1.0 / sampling.fps
    if header:  # known length: spread the frame budget over it from the start
        interval = max(interval, header / sampling.max_frames)
    max_decoded = int(sampling.max_seconds * MAX_SOURCE_FPS) + 1
    frames: list[np.ndarray] = []
    times: list[float] = []
    target, decoded, last, first_time = 0.0, 0, 0.0, None
    for frame in container.decode(stream):  # type: ignore[attr-defined]
        decoded += 1
        if decoded > max_decoded:
            raise too_large(
                f"the video has more than {max_decoded} frames, over what a clip of "
                f"--max-video-seconds {sampling.max_seconds:g} may hold at {MAX_SOURCE_FPS} fps"
            )
        if frame.width * frame.height > sampling.max_pixels:
            raise too_large(
                f"the video's frames are {frame.width}x{frame.height} pixels, over the limit "
                f"of {sampling.max_pixels} per frame (--max-image-pixels); scale it down"
            )
        raw = frame.time if frame.time is not None else decoded / 30.0
        first_time = raw if first_time is None else first_time
        now = raw - first_time
        last = now
        if decoded > (now + 1.0) * MAX_SOURCE_FPS:  # frames packed denser than any camera's
            raise too_large(
                f"the video packs {decoded} frames into {now:.2f} s, over {MAX_SOURCE_FPS} "
                "frames per second; re-encode it at a normal frame rate"
            )
        if now > sampling.max_seconds:
            raise too_large(_too_long(now, sampling.max_seconds))
        if now + 1e-6 < target:
            continue
        frames.append(_rgb(frame))
        times.append(round(now, 6))
        target += interval
        if len(frames) > 2 * sampling.max_frames:  # unknown length: thin out, slow down
            frames, times = frames[::2], times[::2]
            interval *= 2
            target = times[-1] + interval
    return frames, times, last


def _rgb(frame: object) -> np.ndarray:
    """The frame as (H, W, 3) uint8 RGB, scaled down (area filter, aspect kept) to at most
    HELD_PIXELS pixels: more than any Qwen-VL video budget uses per frame, so the model sees
    no less detail, while the frames held per clip stay bounded in memory."""
    width, height = frame.width, frame.height  # type: ignore[attr-defined]
    if width * height <= HELD_PIXELS:
        return frame.to_ndarray(format="rgb24")  # type: ignore[attr-defined]
    scale = (HELD_PIXELS / (width * height)) ** 0.5
    size = {"width": max(2, int(width * scale)), "height": max(2, int(height * scale))}
    small = frame.reformat(format="rgb24", interpolation="AREA", **size)  # type: ignore[attr-defined]
    return small.to_ndarray()


def _header_seconds(container: object, stream: object) -> float | None:
    """The clip's length as its header states it, or None."""
    duration, base = getattr(stream, "duration", None), getattr(stream, "time_base", None)
    if duration and base:
        return float(duration * Fraction(base))
    total = getattr(container, "duration", None)  # microseconds
    return total / 1_000_000 if total and total > 0 else None


def _too_long(seconds: float, limit: float) -> str:
    return (
        f"the video is {seconds:.1f} s long, over the limit of {limit:g} s "
        "(--max-video-seconds); trim it"
    )


def _reason(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text[:160]
